//! What every record of one stream shares: its topic, key template, CloudEvents source and
//! schema (the payload URI in the AsyncAPI document), and the envelope metadata rendered once.

use serde::Serialize;

use crate::config::{Channel, KeyTemplate};

/// The id of the AsyncAPI document a configuration publishes for `cluster`.
pub fn document_id(cluster: &str) -> String {
    format!("urn:watchrelay:{cluster}:asyncapi")
}

/// Name of a channel's envelope schema under the document's `components.schemas`.
pub(crate) fn envelope_schema(channel: &str) -> String {
    format!("{channel}.envelope")
}

/// Where a channel's envelope schema is in the document: the `ce_dataschema` of its records.
pub fn payload_uri(cluster: &str, channel: &str) -> String {
    format!(
        "{}#/components/schemas/{}",
        document_id(cluster),
        envelope_schema(channel)
    )
}

/// The shard a stream belongs to and the owner epoch of the replica relaying it: in every
/// record's envelope metadata (`shard`, `ownerEpoch`) and headers (`ce_shard`, `ce_ownerepoch`).
/// A key's records come from one shard; a record whose epoch is below the highest seen on its key
/// is a deposed owner's, landed late.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardOwner {
    /// The shard.
    pub shard: u32,
    /// Its owner's epoch: higher for each new owner.
    pub epoch: u64,
}

/// The ids a schema registry gave the schema of a topic's values (see [`crate::schemas`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchemaIds {
    /// The id its Confluent-compatible API answers: in Confluent's wire format, before the value.
    pub id: u32,
    /// Apicurio's id of the schema version (`apicurio.value.globalId`), when the registry is one.
    pub global_id: Option<u64>,
    /// Apicurio's id of the schema's content (`apicurio.value.contentId`), when the registry is one.
    pub content_id: Option<u64>,
}

/// How a topic's records carry their schema's ids: shared by every stream publishing to the
/// topic, set once the registry has the topic's schema, changed when it takes a new version
/// (a CRD's schema changed). A stream publishes nothing before its tag is set.
#[derive(Debug)]
pub struct SchemaTag {
    ids: tokio::sync::watch::Sender<Option<SchemaIds>>,
    /// Confluent's wire format: the value starts with a zero byte and the 4-byte id.
    pub prefix: bool,
}

impl SchemaTag {
    /// A tag not yet registered.
    pub fn new(prefix: bool) -> Self {
        Self {
            ids: tokio::sync::watch::Sender::new(None),
            prefix,
        }
    }

    /// The ids records carry now, `None` before the registry answered.
    pub fn ids(&self) -> Option<SchemaIds> {
        *self.ids.borrow()
    }

    /// Sets the ids records carry from now on.
    pub fn set(&self, ids: SchemaIds) {
        self.ids.send_replace(Some(ids));
    }

    /// Waits until the registry has the topic's schema.
    pub async fn registered(&self) {
        let mut rx = self.ids.subscribe();
        // The sender lives as long as `self`.
        let _ = rx.wait_for(Option::is_some).await;
    }
}

/// What every record of one stream shares.
#[derive(Clone, Debug, Default)]
pub struct Route {
    /// The topic the stream's records go to, rendered for its namespace.
    pub topic: String,
    /// How records are keyed.
    pub key: KeyTemplate,
    /// CloudEvents `dataschema`: the envelope's schema in the stream's AsyncAPI document.
    pub dataschema: String,
    /// CloudEvents `source`: `/clusters/{cluster}` and the collection path.
    pub source: String,
    /// The channel's path template.
    pub channel: String,
    /// `watchrelay.operationId`: the channel's operationId.
    pub operation_id: String,
    /// `watchrelay.message`: the AsyncAPI message name.
    pub message: String,
    /// `watchrelay.cluster`: the configured `clusterName`.
    pub cluster: String,
    /// The stream's namespace, absent for cluster-wide streams.
    pub namespace: Option<String>,
    /// With sharding on: the shard the stream belongs to and its owner's epoch.
    pub owner: Option<ShardOwner>,
    /// With a schema registry: the ids of the topic's schema.
    pub schema: Option<std::sync::Arc<SchemaTag>>,
    /// The envelope metadata made of the fields above, rendered on first use.
    pub rendered: Rendered,
}

/// The part of a route's `watchrelay` envelope metadata that is the same in every record:
/// `"channel":..,"operationId":..,"message":..,"cluster":..(,"namespace":..)`, rendered as JSON
/// once. A route's fields do not change once it carries records.
#[derive(Clone, Debug, Default)]
pub struct Rendered(std::sync::OnceLock<Box<[u8]>>);

impl Route {
    /// The route of `channel`'s stream over `namespace` in `cluster`.
    pub fn for_stream(channel: &Channel, cluster: &str, namespace: Option<String>) -> Self {
        let path = channel.path.collection_url(namespace.as_deref());
        Self {
            topic: channel.topic_for(cluster, namespace.as_deref()),
            key: channel.key.clone(),
            dataschema: payload_uri(cluster, &channel.name),
            source: format!("/clusters/{cluster}{path}"),
            channel: channel.path.template.clone(),
            operation_id: channel.operation_id.clone(),
            message: channel.message.clone(),
            cluster: cluster.to_string(),
            namespace,
            owner: None,
            schema: None,
            rendered: Rendered::default(),
        }
    }

    /// This route, its records tagged with the ids of their schema (with a schema registry).
    pub fn tagged(mut self, schema: Option<std::sync::Arc<SchemaTag>>) -> Self {
        self.schema = schema;
        self
    }

    /// This route, relayed by `owner` (with sharding on).
    pub fn owned_by(mut self, owner: Option<ShardOwner>) -> Self {
        self.owner = owner;
        self
    }

    /// See [`Rendered`].
    pub(super) fn rendered(&self) -> &[u8] {
        self.rendered.0.get_or_init(|| {
            #[derive(Serialize)]
            #[serde(rename_all = "camelCase")]
            struct Constant<'a> {
                channel: &'a str,
                operation_id: &'a str,
                message: &'a str,
                cluster: &'a str,
                #[serde(skip_serializing_if = "Option::is_none")]
                namespace: Option<&'a str>,
                #[serde(skip_serializing_if = "Option::is_none")]
                shard: Option<u32>,
                #[serde(skip_serializing_if = "Option::is_none")]
                owner_epoch: Option<u64>,
            }
            let json = serde_json::to_vec(&Constant {
                channel: &self.channel,
                operation_id: &self.operation_id,
                message: &self.message,
                cluster: &self.cluster,
                namespace: self.namespace.as_deref(),
                shard: self.owner.map(|o| o.shard),
                owner_epoch: self.owner.map(|o| o.epoch),
            })
            .expect("serializing plain strings cannot fail");
            // Without the braces: members to write among others.
            json[1..json.len() - 1].into()
        })
    }

    /// What identifies where this route publishes (`<topic> <key template>`), saved with a
    /// stream's position: under another one its members are retracted where they were.
    pub fn id(&self) -> String {
        format!("{} {}", self.topic, self.key.as_str())
    }

    /// The route of a channel that no longer exists (its name from the stream id): enough for
    /// the inferred DELETED of what its stream announced.
    pub fn vanished(channel: &str, cluster: &str, namespace: Option<String>) -> Self {
        Self {
            topic: String::new(),
            key: KeyTemplate::default(),
            dataschema: String::new(),
            source: format!("/clusters/{cluster}"),
            channel: String::new(),
            operation_id: channel.to_string(),
            message: "WatchEvent".into(),
            cluster: cluster.to_string(),
            namespace,
            owner: None,
            schema: None,
            rendered: Rendered::default(),
        }
    }
}
