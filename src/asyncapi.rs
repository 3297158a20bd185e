//! The AsyncAPI 3.0 document of exactly what a configuration publishes: one channel per topic,
//! the envelope and its metadata, the Kafka key and the CloudEvents headers, the servers (never
//! credentials). Without a cluster each object is described generically; with one, each
//! channel's object schema is the API server's own (`/openapi/v3`), so a CRD gets its real
//! schema.
//!
//! The document's `id` is `urn:watchrelay:{clusterName}:asyncapi`; every record's
//! `ce_dataschema` header points at its envelope schema in it ([`payload_uri`]).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Map, Value};

use crate::config::{Channel, Config, Scope};
use crate::envelope::envelope_schema;
pub use crate::envelope::{document_id as id, payload_uri};
use crate::event::EventType;

/// Name of the identity-only object's schema under `components.schemas`.
const REFERENCE: &str = "watchrelay.reference";

/// The AsyncAPI version of the document.
pub const VERSION: &str = "3.0.0";
const KAFKA_BINDING: &str = "0.5.0";

/// Name of a channel's tombstone message under `components.messages`.
fn tombstone_message(channel: &str) -> String {
    format!("{channel}.tombstone")
}

/// Object schemas read from a cluster: per channel name, the schema of its objects (usually a
/// `$ref`), and every component schema those refer to.
#[derive(Debug, Default, Clone)]
pub struct ClusterSchemas {
    /// Each channel's object schema, by channel name (usually a `$ref` into `components`).
    pub objects: BTreeMap<String, Value>,
    /// The component schemas those refer to, by name, as `/openapi/v3` serves them.
    pub components: BTreeMap<String, Value>,
}

/// The topics a channel publishes to: concrete names, or one address with a `{namespace}`
/// parameter for a namespace selector whose topic depends on the namespace.
fn addresses(channel: &Channel, cluster: &str) -> Vec<String> {
    match &channel.scope {
        Scope::Cluster => vec![channel.topic_for(cluster, None)],
        Scope::Namespaces(list) => {
            let set: BTreeSet<String> = list
                .iter()
                .map(|ns| channel.topic_for(cluster, Some(ns)))
                .collect();
            set.into_iter().collect()
        }
        Scope::Selector(_) => vec![channel.topic_for(cluster, Some("{namespace}"))],
    }
}

/// A channel id from a topic: AsyncAPI keys allow letters, digits, `-` and `_`.
fn channel_id(address: &str) -> String {
    address
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The servers: one per bootstrap address, with the security protocol and SASL mechanism from
/// `kafka.properties` (never a credential).
fn servers(cfg: &Config) -> (Value, Option<(String, Value)>) {
    let props = &cfg.kafka.properties;
    let protocol = props
        .get("security.protocol")
        .map(|p| p.to_ascii_uppercase())
        .unwrap_or_else(|| "PLAINTEXT".into());
    let secure = protocol.starts_with("SSL") || protocol == "SASL_SSL";
    let scheme = if protocol.starts_with("SASL") {
        let mechanism = props
            .get("sasl.mechanism")
            .or_else(|| props.get("sasl.mechanisms"))
            .map(|m| m.to_ascii_uppercase())
            .unwrap_or_else(|| "GSSAPI".into());
        let kind = match mechanism.as_str() {
            "PLAIN" => "plain",
            "SCRAM-SHA-256" => "scramSha256",
            "SCRAM-SHA-512" => "scramSha512",
            "GSSAPI" => "gssapi",
            _ => "userPassword",
        };
        Some((
            "sasl".to_string(),
            json!({"type": kind, "description": format!("SASL {mechanism} over {protocol}")}),
        ))
    } else if props.contains_key("ssl.certificate.location") {
        Some((
            "mtls".to_string(),
            json!({"type": "X509", "description": "TLS client certificate"}),
        ))
    } else {
        None
    };
    let mut servers = Map::new();
    for (i, host) in cfg
        .kafka
        .bootstrap_servers
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .enumerate()
    {
        let mut server = json!({
            "host": host,
            "protocol": if secure { "kafka-secure" } else { "kafka" },
            "description": format!("Kafka bootstrap server ({protocol})"),
        });
        if let Some((name, _)) = &scheme {
            server["security"] = json!([{"$ref": format!("#/components/securitySchemes/{name}")}]);
        }
        servers.insert(format!("broker-{i}"), server);
    }
    (Value::Object(servers), scheme)
}

fn headers_schema() -> Value {
    let s = |d: &str| json!({"type": "string", "description": d});
    json!({
        "type": "object",
        "description": "CloudEvents 1.0 attributes in binary mode (Kafka protocol binding)",
        "required": ["ce_specversion", "ce_id", "ce_source", "ce_type", "ce_time", "content-type",
                     "ce_dataschema", "ce_partitionkey", "ce_resourceversion", "ce_operationid", "ce_cluster"],
        "properties": {
            "ce_specversion": {"type": "string", "const": "1.0"},
            "ce_id": s("watchrelay.id: {uid}/{resourceVersion}, the same for the same change"),
            "ce_source": s("/clusters/{cluster} and the watched collection path"),
            "ce_type": s("io.watchrelay.{message}.{type}"),
            "ce_time": s("When the relay read the event (RFC 3339)"),
            "content-type": {"type": "string", "const": "application/json"},
            "ce_dataschema": s("This envelope's schema in this document"),
            "ce_partitionkey": s("The Kafka key"),
            "ce_subject": s("{namespace}/{name} of the object"),
            "ce_resourceversion": s("watchrelay.resourceVersion"),
            "ce_version": {"type": "string", "pattern": "^[0-9]{1,39}$", "description": "watchrelay.version"},
            "ce_operationid": s("The channel's operationId"),
            "ce_cluster": s("The cluster name"),
            "ce_resync": {"type": "string", "const": "true", "description": "Present on events a relist produced"},
            "ce_synthetic": {"type": "string", "const": "true", "description": "Present on DELETED events the relay inferred"},
            "ce_truncatedbytes": s("Present when the object was too large and replaced by a reference: its original size"),
            "ce_shard": s("With sharding on: watchrelay.shard"),
            "ce_ownerepoch": s("With sharding on: watchrelay.ownerEpoch"),
        },
    })
}

fn metadata_schema() -> Value {
    let s = |d: &str| json!({"type": "string", "description": d});
    json!({
        "type": "object",
        "description": "The relay's metadata",
        "required": ["id", "channel", "operationId", "message", "cluster", "resourceVersion", "observedAt", "resync", "synthetic"],
        "additionalProperties": false,
        "properties": {
            "id": s("{uid}/{resourceVersion}: the same change always has the same id, so duplicates can be dropped"),
            "channel": s("The watch path template"),
            "operationId": s("The channel's operationId"),
            "message": s("The message name"),
            "cluster": s("The cluster name"),
            "namespace": s("The stream's namespace; absent for cluster-wide streams"),
            "resourceVersion": s("The object's resourceVersion, or the list's for inferred events and markers"),
            "version": {"type": "string", "pattern": "^[0-9]{1,39}$", "description": "An unsigned 128-bit integer in decimal, higher on each record of a key than on every earlier record of that key (the same change replayed keeps it, unless a crash cut a resync short: then it is higher), across restarts, resyncs, inferred DELETEDs, recreates, handovers and etcd restores: the highest version of a key is its last word. era x 2^64 + resourceVersion; absent when the resourceVersion is not a number"},
            "observedAt": s("When the relay read the event (RFC 3339)"),
            "resync": {"type": "boolean", "description": "Produced by a relist"},
            "synthetic": {"type": "boolean", "description": "A DELETED the relay inferred"},
            "truncatedBytes": {"type": "integer", "minimum": 0, "description": "The object was too large: its original size; the object carries its identity only"},
            "shard": {"type": "integer", "minimum": 0, "description": "With sharding on: the shard of the stream (a key's records all come from one)"},
            "ownerEpoch": {"type": "integer", "minimum": 1, "description": "With sharding on: the epoch of the replica that relayed it; a record below the highest epoch seen on its key from the same shard is a deposed owner's, landed late (epochs of different shards are unrelated)"},
        },
    })
}

/// The object reduced to its identity, as a marker, an inferred DELETED and a reference to a
/// too large object carry it.
fn reference_object() -> Value {
    let s = |d: &str| json!({"type": "string", "description": d});
    json!({
        "type": "object",
        "description": "The object reduced to its identity: in a BOOKMARK (a marker; its metadata holds the resourceVersion and, ending a resync, the annotation watchrelay.io/resync-end), an inferred DELETED (watchrelay.synthetic) and a record whose object was too large (watchrelay.truncatedBytes)",
        "required": ["apiVersion", "kind", "metadata"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {
                "type": "object",
                "required": ["resourceVersion"],
                "properties": {
                    "name": s("The object's name (absent in a marker)"),
                    "namespace": s("The object's namespace"),
                    "uid": s("The object's uid"),
                    "resourceVersion": s("The object's resourceVersion, or the list's for a marker"),
                    "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                },
            },
        },
    })
}

/// Records that carry the object reduced to its identity ([`reference_object`]): BOOKMARKs,
/// inferred DELETEDs and references to too large objects.
fn carries_a_reference() -> Value {
    json!({"anyOf": [
        {"required": ["type"], "properties": {"type": {"const": "BOOKMARK"}}},
        {"required": ["watchrelay"], "properties": {"watchrelay": {"required": ["synthetic"], "properties": {"synthetic": {"const": true}}}}},
        {"required": ["watchrelay"], "properties": {"watchrelay": {"required": ["truncatedBytes"]}}},
    ]})
}

fn generic_object() -> Value {
    json!({
        "type": "object",
        "description": "A Kubernetes object (run with --cluster for the API server's schema)",
        "required": ["apiVersion", "kind", "metadata"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "namespace": {"type": "string"},
                    "uid": {"type": "string"},
                    "resourceVersion": {"type": "string"},
                },
            },
        },
    })
}

/// The document for `cfg`, with the cluster's object schemas when given.
pub fn document(cfg: &Config, cluster: Option<&ClusterSchemas>) -> Value {
    let mut channels = Map::new();
    let mut operations = Map::new();
    let mut messages = Map::new();
    let mut schemas = Map::new();
    schemas.insert("cloudevents.headers".into(), headers_schema());
    schemas.insert("watchrelay.metadata".into(), metadata_schema());
    schemas.insert("kubernetes.object".into(), generic_object());
    schemas.insert(REFERENCE.into(), reference_object());
    if let Some(c) = cluster {
        for (name, schema) in &c.components {
            schemas.insert(name.clone(), schema.clone());
        }
    }
    // Topic -> the channels publishing to it.
    let mut topics: BTreeMap<String, Vec<&Channel>> = BTreeMap::new();
    for ch in &cfg.channels {
        // A resync always ends with a BOOKMARK marker, forwarded bookmarks or not.
        let types: Vec<&str> = EventType::ALL
            .into_iter()
            .filter(|t| ch.forwards(*t) || *t == EventType::Bookmark)
            .map(EventType::as_str)
            .collect();
        let object = cluster
            .and_then(|c| c.objects.get(&ch.name).cloned())
            .unwrap_or_else(|| json!({"$ref": "#/components/schemas/kubernetes.object"}));
        schemas.insert(
            envelope_schema(&ch.name),
            json!({
                "type": "object",
                "description": format!("{} of {}", ch.message, ch.path.template),
                "required": ["type", "object", "watchrelay"],
                "additionalProperties": false,
                "properties": {
                    "type": {"type": "string", "enum": types},
                    "object": {"type": "object", "description": "The object, of the resource's schema; reduced to its identity in markers, inferred DELETEDs and references (see if/then/else)"},
                    "watchrelay": {"$ref": "#/components/schemas/watchrelay.metadata"},
                },
                "if": carries_a_reference(),
                "then": {"properties": {"object": {"$ref": format!("#/components/schemas/{REFERENCE}")}}},
                "else": {"properties": {"object": object}},
            }),
        );
        messages.insert(
            ch.name.clone(),
            json!({
                "name": ch.message,
                "title": format!("{} events", ch.operation_id),
                "summary": format!("Watch events of {}, one record per change", ch.path.template),
                "contentType": "application/json",
                "headers": {"$ref": "#/components/schemas/cloudevents.headers"},
                "payload": {"$ref": format!("#/components/schemas/{}", envelope_schema(&ch.name))},
                "bindings": {"kafka": {
                    "key": {"type": "string", "description": format!("Key template {}", ch.key.as_str())},
                    "bindingVersion": KAFKA_BINDING,
                }},
            }),
        );
        if ch.tombstones {
            messages.insert(
                tombstone_message(&ch.name),
                json!({
                    "name": "Tombstone",
                    "title": format!("{} tombstones", ch.operation_id),
                    "summary": "After each DELETED: the same key with a null value, so a compacted topic holds exactly the live objects",
                    "payload": {"type": "null"},
                    "bindings": {"kafka": {
                        "key": {"type": "string", "description": format!("Key template {}", ch.key.as_str())},
                        "bindingVersion": KAFKA_BINDING,
                    }},
                }),
            );
        }
        for address in addresses(ch, &cfg.cluster_name) {
            topics.entry(address).or_default().push(ch);
        }
    }
    for (address, chs) in &topics {
        let id = channel_id(address);
        // Each channel's message, and its tombstone where it sends them.
        let names: Vec<String> = chs
            .iter()
            .flat_map(|c| {
                std::iter::once(c.name.clone())
                    .chain(c.tombstones.then(|| tombstone_message(&c.name)))
            })
            .collect();
        let mut channel = json!({
            "address": address,
            "title": format!("Topic {address}"),
            "messages": names.iter().map(|n| (n.clone(), json!({"$ref": format!("#/components/messages/{n}")}))).collect::<Map<_, _>>(),
            "bindings": {"kafka": {"topic": address.replace("{namespace}", "NAMESPACE"), "bindingVersion": KAFKA_BINDING}},
        });
        if address.contains("{namespace}") {
            channel["parameters"] = json!({"namespace": {"description": "A namespace the channel's namespace selector matches"}});
            channel["bindings"]["kafka"]
                .as_object_mut()
                .expect("an object")
                .remove("topic");
        }
        channels.insert(id.clone(), channel);
        operations.insert(
            format!("publish_{id}"),
            json!({
                "action": "send",
                "title": format!("Publish to {address}"),
                "channel": {"$ref": format!("#/channels/{id}")},
                "messages": names.iter().map(|n| json!({"$ref": format!("#/channels/{id}/messages/{n}")})).collect::<Vec<_>>(),
            }),
        );
    }
    let (servers, scheme) = servers(cfg);
    let mut components = json!({"messages": messages, "schemas": schemas});
    if let Some((name, scheme)) = scheme {
        components["securitySchemes"] = json!({ name: scheme });
    }
    json!({
        "asyncapi": VERSION,
        "id": id(&cfg.cluster_name),
        "info": {
            "title": format!("watchrelay: cluster {}", cfg.cluster_name),
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Kubernetes watch events of this cluster, one Kafka record per change, keyed by object. Apply a key's records in partition order and you hold what the cluster holds.",
        },
        "defaultContentType": "application/json",
        "servers": servers,
        "channels": channels,
        "operations": operations,
        "components": components,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        Config::parse(&format!(
            "clusterName: prod\nkafka:\n  bootstrapServers: k1:9092,k2:9093\n  oversize: trim\n{extra}checkpoint:\n  namespace: relay\nchannels:\n  - operationId: watchNamespacedPods\n    namespaces: [a, b]\n    topic: \"{{cluster}}.{{namespace}}.pods\"\n  - operationId: watchNodes\n  - operationId: watchNamespacedServices\n    namespaceSelector: team=x\n    topic: \"{{cluster}}.{{namespace}}.svc\"\n    key: \"{{uid}}\"\n    tombstones: true\n"
        ))
        .unwrap()
    }

    #[test]
    fn one_channel_per_topic_with_its_messages_and_an_operation() {
        let doc = document(&config(""), None);
        assert_eq!(doc["asyncapi"], "3.0.0");
        let channels = doc["channels"].as_object().unwrap();
        let addresses: Vec<&str> = channels
            .values()
            .map(|c| c["address"].as_str().unwrap())
            .collect();
        assert_eq!(
            addresses,
            [
                "prod.{namespace}.svc",
                "prod.a.pods",
                "prod.b.pods",
                "prod.nodes"
            ]
        );
        let svc = &channels["prod__namespace__svc"];
        assert!(svc["parameters"]["namespace"].is_object());
        assert_eq!(
            svc["messages"]["watchNamespacedServices"]["$ref"],
            "#/components/messages/watchNamespacedServices"
        );
        assert_eq!(doc["operations"].as_object().unwrap().len(), 4);
        assert_eq!(
            svc["messages"]["watchNamespacedServices.tombstone"]["$ref"],
            "#/components/messages/watchNamespacedServices.tombstone"
        );
        assert_eq!(
            doc["components"]["messages"]["watchNamespacedServices.tombstone"]["payload"]["type"],
            "null"
        );
        let msg = &doc["components"]["messages"]["watchNamespacedServices"];
        assert_eq!(msg["name"], "ServiceWatchEvent");
        assert!(msg["bindings"]["kafka"]["key"]["description"]
            .as_str()
            .unwrap()
            .contains("{uid}"));
        let env = &doc["components"]["schemas"]["watchNodes.envelope"];
        assert_eq!(
            env["properties"]["type"]["enum"],
            json!(["ADDED", "MODIFIED", "DELETED", "BOOKMARK"])
        );
        assert_eq!(
            payload_uri("prod", "watchNodes"),
            "urn:watchrelay:prod:asyncapi#/components/schemas/watchNodes.envelope"
        );
        assert_eq!(doc["servers"]["broker-1"]["host"], "k2:9093");
        assert_eq!(doc["servers"]["broker-0"]["protocol"], "kafka");
    }

    #[test]
    fn servers_say_how_to_connect_but_never_carry_credentials() {
        let doc = document(
            &config("  properties:\n    security.protocol: SASL_SSL\n    sasl.mechanism: SCRAM-SHA-512\n    sasl.username: relay\n    sasl.password: hunter2\n"),
            None,
        );
        assert_eq!(doc["servers"]["broker-0"]["protocol"], "kafka-secure");
        assert_eq!(
            doc["components"]["securitySchemes"]["sasl"]["type"],
            "scramSha512"
        );
        let text = doc.to_string();
        assert!(!text.contains("hunter2") && !text.contains("\"relay\""));
    }

    #[test]
    fn cluster_schemas_replace_the_generic_object() {
        let schemas = ClusterSchemas {
            objects: BTreeMap::from([(
                "watchNodes".to_string(),
                json!({"$ref": "#/components/schemas/io.k8s.api.core.v1.Node"}),
            )]),
            components: BTreeMap::from([(
                "io.k8s.api.core.v1.Node".to_string(),
                json!({"type": "object"}),
            )]),
        };
        let doc = document(&config(""), Some(&schemas));
        let s = &doc["components"]["schemas"];
        assert_eq!(
            s["watchNodes.envelope"]["else"]["properties"]["object"]["$ref"],
            "#/components/schemas/io.k8s.api.core.v1.Node"
        );
        assert!(s["io.k8s.api.core.v1.Node"].is_object());
        assert_eq!(
            s["watchNamespacedServices.envelope"]["else"]["properties"]["object"]["$ref"],
            "#/components/schemas/kubernetes.object"
        );
    }
}
