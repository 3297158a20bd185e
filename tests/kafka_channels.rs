//! Every channel of the catalogue, end to end: simulator → relay → broker, compared with the
//! simulator's journal.

mod common;

use std::collections::HashSet;

use common::bed::{assert_covers, Bed, Relay};
use common::{kafka, schema};
use watchrelay::catalogue::{ChannelPath, CATALOGUE};
use watchrelay_sim::objects;

struct Kind {
    op: &'static str,
    resource: &'static str,
    make: fn(Option<&str>, &str) -> serde_json::Value,
}

fn kinds() -> Vec<Kind> {
    vec![
        Kind {
            op: "watchNamespacedPods",
            resource: "pods",
            make: |ns, n| objects::pod(ns.unwrap(), n),
        },
        Kind {
            op: "watchNamespacedDeployments",
            resource: "deployments.apps",
            make: |ns, n| objects::deployment(ns.unwrap(), n),
        },
        Kind {
            op: "watchNamespacedServices",
            resource: "services",
            make: |ns, n| objects::service(ns.unwrap(), n),
        },
        Kind {
            op: "watchNodes",
            resource: "nodes",
            make: |_, n| objects::node(n),
        },
        Kind {
            op: "watchNamespacedEvents",
            resource: "events.events.k8s.io",
            make: |ns, n| objects::event(ns.unwrap(), n),
        },
        Kind {
            op: "watchNamespacedIngresses",
            resource: "ingresses.networking.k8s.io",
            make: |ns, n| objects::ingress(ns.unwrap(), n),
        },
        Kind {
            op: "watchNamespacedEndpointSlices",
            resource: "endpointslices.discovery.k8s.io",
            make: |ns, n| objects::endpointslice(ns.unwrap(), n),
        },
        Kind {
            op: "watchNamespacedNetworkPolicies",
            resource: "networkpolicies.networking.k8s.io",
            make: |ns, n| objects::networkpolicy(ns.unwrap(), n),
        },
        Kind {
            op: "watchNamespacedGateways",
            resource: "gateways.gateway.networking.k8s.io",
            make: |ns, n| objects::gateway(ns.unwrap(), n),
        },
        Kind {
            op: "watchNamespacedHTTPRoutes",
            resource: "httproutes.gateway.networking.k8s.io",
            make: |ns, n| objects::httproute(ns.unwrap(), n),
        },
    ]
}

/// Creates, modifies and deletes a few objects of every kind.
fn churn_every_kind(bed: &Bed, round: &str) {
    for k in kinds() {
        let namespaced = k.op != "watchNodes";
        let nss: Vec<Option<&str>> = if namespaced {
            vec![Some("shop"), Some("infra"), Some("other")]
        } else {
            vec![None]
        };
        for ns in nss {
            for i in 0..3 {
                let name = format!("{round}-{i}");
                bed.sim.create(k.resource, ns, (k.make)(ns, &name)).unwrap();
            }
            let patch = serde_json::json!({ "metadata": { "labels": { "touched": round } } });
            bed.sim
                .merge_patch(k.resource, ns, &format!("{round}-1"), patch)
                .unwrap();
            bed.sim
                .delete(k.resource, ns, &format!("{round}-2"))
                .unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_channel_delivers_every_change_with_its_envelope() {
    let bed = Bed::new(&["shop", "infra", "other"]).await;
    let prefix = kafka::unique("ch");
    kafka::create_catalogue_topics(&prefix).await;
    let mut channels = String::new();
    for c in CATALOGUE {
        let scope = if !ChannelPath::parse(c.path).unwrap().namespaced {
            ""
        } else {
            "    namespaces: [shop, infra]\n"
        };
        channels.push_str(&format!(
            "  - operationId: {}\n{scope}    topic: \"{prefix}.{{operationId}}\"\n",
            c.operation_id
        ));
    }
    // Objects that exist before the relay starts arrive through the initial list, the rest
    // through the watch.
    churn_every_kind(&bed, "before");
    let relay = Relay::start(&bed, bed.config(&channels, ""));
    let streams = CATALOGUE
        .iter()
        .map(|c| if c.path.contains("{namespace}") { 2 } else { 1 })
        .sum();
    relay.wait_up(streams).await;
    churn_every_kind(&bed, "after");

    // The seed documents' WatchEvent schema, and the relay's own AsyncAPI document for this
    // configuration: every envelope and its headers validate against both.
    let watch_event = schema::validator(&schema::watch_event_schema());
    let doc = watchrelay::asyncapi::document(&bed.config(&channels, ""), None);
    let headers = schema::component_validator(&doc, "cloudevents.headers");
    for c in CATALOGUE {
        let envelope = schema::component_validator(&doc, &format!("{}.envelope", c.operation_id));
        let path = ChannelPath::parse(c.path).unwrap();
        let resource = path.resource_name();
        let topic = format!("{prefix}.{}", c.operation_id);
        let journal = bed.journal(&resource, None);
        let expected: Vec<_> = journal
            .into_iter()
            .filter(|e| {
                !path.namespaced || matches!(e.namespace.as_deref(), Some("shop" | "infra"))
            })
            .collect();
        assert!(
            !expected.is_empty() || c.operation_id == "watchNamespaces",
            "{}: journal has no changes",
            c.operation_id
        );
        // Objects created before the relay started were announced by a list as ADDED at their
        // current version; the changes before that version are not expected.
        let msgs = bed.read_covering(&topic, &after_list(&expected)).await;
        assert_covers(&msgs, &after_list(&expected));
        let uids: HashSet<&str> = expected.iter().map(|e| e.uid.as_str()).collect();
        for m in &msgs {
            let errs = schema::errors(&watch_event, &m.value);
            assert!(
                errs.is_empty(),
                "{}: envelope does not validate as a WatchEvent: {errs:?}",
                c.operation_id
            );
            let errs = schema::errors(&envelope, &m.value);
            assert!(
                errs.is_empty(),
                "{}: envelope does not validate against the AsyncAPI document: {errs:?}",
                c.operation_id
            );
            let errs = schema::errors(&headers, &serde_json::to_value(&m.headers).unwrap());
            assert!(
                errs.is_empty(),
                "{}: headers do not validate against the AsyncAPI document: {errs:?}",
                c.operation_id
            );
            assert_eq!(
                m.headers["ce_dataschema"],
                watchrelay::asyncapi::payload_uri("test", c.operation_id)
            );
            assert_eq!(m.headers.get("ce_partitionkey"), m.key.as_ref());
            let w = &m.value["watchrelay"];
            assert_eq!(w["channel"], c.path);
            assert_eq!(w["operationId"], c.operation_id);
            assert_eq!(w["message"], c.message);
            assert_eq!(w["cluster"], "test");
            assert_eq!(w["synthetic"], false);
            assert!(w["observedAt"].as_str().unwrap().ends_with('Z'));
            assert!(
                uids.contains(m.value["object"]["metadata"]["uid"].as_str().unwrap()),
                "{}: foreign object",
                c.operation_id
            );
            if path.namespaced {
                assert_eq!(
                    w["namespace"], m.value["object"]["metadata"]["namespace"],
                    "{}",
                    c.operation_id
                );
            } else {
                assert!(w.get("namespace").is_none());
            }
            assert!(
                m.value["object"]["metadata"].get("managedFields").is_none(),
                "managedFields are dropped"
            );
            assert_eq!(m.headers["ce_specversion"], "1.0");
            assert_eq!(m.headers["ce_id"], w["id"].as_str().unwrap());
            assert_eq!(
                m.headers["ce_type"],
                format!(
                    "io.watchrelay.{}.{}",
                    c.message,
                    m.value["type"].as_str().unwrap()
                )
            );
            assert_eq!(m.headers["content-type"], "application/json");
            assert_eq!(m.headers.get("ce_subject"), m.key.as_ref());
            assert!(m.headers["ce_source"].starts_with("/clusters/test/"));
        }
    }
    relay.stop().await;
}

/// Drops the changes superseded before the relay's first list: for objects created before the
/// relay started, only the latest change of each is guaranteed (the list shows current state).
fn after_list(entries: &[watchrelay_sim::JournalEntry]) -> Vec<watchrelay_sim::JournalEntry> {
    let mut out: Vec<watchrelay_sim::JournalEntry> = Vec::new();
    for e in entries {
        if e.name.starts_with("before-") || e.resource == "namespaces" {
            out.retain(|o| o.uid != e.uid);
            if e.event_type != "DELETED" {
                out.push(watchrelay_sim::JournalEntry {
                    event_type: "ADDED".into(),
                    ..e.clone()
                });
            }
        } else {
            out.push(e.clone());
        }
    }
    out
}
