//! Channels: what the configuration asks to watch, resolved against the catalogue.
//!
//! A [`ChannelConfig`] is one entry of the file's `channels` list as written; [`Channel`] is the
//! same entry validated once at load, with its path parsed, its scope decided and its event types
//! gathered into one set. Everything downstream reads [`Channel`].

use std::collections::BTreeMap;

use serde::Deserialize;

use super::key::KeyTemplate;
use super::syntax::is_dns_label;
use super::{invalid, ConfigError};
use crate::catalogue::{self, ChannelPath};
use crate::event::{EventType, EventTypes};

/// One channel: a watch path and what to do with its events.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ChannelConfig {
    /// A channel of the built-in catalogue, e.g. `watchNamespacedPods`.
    pub operation_id: Option<String>,
    /// A custom watch path template (for any group/version/resource, CRDs included), e.g.
    /// `/apis/example.com/v1/namespaces/{namespace}/widgets`. Exactly one of `operationId` and
    /// `path`.
    pub path: Option<String>,
    /// Name of the channel in stream ids, metrics and checkpoints; defaults to the operationId.
    /// Required for custom paths.
    pub name: Option<String>,
    /// Message name in envelopes of custom channels (default `WatchEvent`).
    pub message: Option<String>,
    /// Watch these namespaces, one stream each.
    pub namespaces: Option<Vec<String>>,
    /// Watch all namespaces through one cluster-wide stream.
    #[serde(default)]
    pub all_namespaces: bool,
    /// Watch every namespace whose labels match this selector; namespaces that start matching
    /// get a stream, namespaces that stop matching or are deleted lose theirs.
    pub namespace_selector: Option<String>,
    /// How a `namespaces` or `namespaceSelector` channel watches its namespaces:
    /// `perNamespace` (a watch each), `clusterWide` (one watch of the cluster-wide collection,
    /// objects of namespaces out of scope dropped) or `auto` (the default: cluster-wide above
    /// `kubernetes.clusterWideAbove` namespaces).
    pub watch_strategy: Option<WatchStrategy>,
    /// Only objects matching this label selector.
    pub label_selector: Option<String>,
    /// Only objects matching this field selector.
    pub field_selector: Option<String>,
    /// Which event types to publish (default all three). Bookmarks are controlled by
    /// `forwardBookmarks`.
    #[serde(default = "all_event_types")]
    pub event_types: Vec<EventType>,
    /// Topic name or template; `{cluster}`, `{namespace}`, `{resource}`, `{operationId}` and
    /// `{channel}` are replaced.
    #[serde(default = "default_topic")]
    pub topic: String,
    /// Kafka key of each record: `{namespace}`, `{name}`, `{uid}` and `{kind}` are replaced
    /// (default `{namespace}/{name}`; `{namespace}/` is left out for cluster-scoped objects).
    #[serde(default)]
    pub key: Option<String>,
    /// After every DELETED, real or inferred, a tombstone (the same key, a null value), so a
    /// compacted topic holds exactly the live objects.
    #[serde(default)]
    pub tombstones: bool,
    /// Partitions of its topics when the relay creates them, and the least an existing one
    /// may have (`kafka.topics.partitions` when absent).
    #[serde(default)]
    pub partitions: Option<i32>,
    /// Topic configurations of its topics when the relay creates them, over
    /// `kafka.topics.configs`.
    #[serde(default)]
    pub topic_configs: BTreeMap<String, String>,
    /// Publish BOOKMARK events too.
    #[serde(default)]
    pub forward_bookmarks: bool,
    /// Drop `metadata.managedFields` from objects (default true).
    #[serde(default = "yes")]
    pub drop_managed_fields: bool,
    /// Forward Secret `data` and `stringData` (default false: they are removed).
    #[serde(default)]
    pub allow_secret_data: bool,
    /// The resource is sensitive (Secrets always are): its `watchStrategy` must be chosen,
    /// since `auto` would widen the relay's reads to every namespace by a count.
    #[serde(default)]
    pub sensitive: bool,
}

fn all_event_types() -> Vec<EventType> {
    vec![EventType::Added, EventType::Modified, EventType::Deleted]
}
fn default_topic() -> String {
    "{cluster}.{resource}".into()
}
fn yes() -> bool {
    true
}

/// How a channel over several namespaces watches them (`watchStrategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WatchStrategy {
    /// A watch per namespace in scope (`perNamespace`): reads only those namespaces.
    PerNamespace,
    /// One watch of the cluster-wide collection (`clusterWide`), objects out of scope dropped.
    ClusterWide,
    /// Cluster-wide above `kubernetes.clusterWideAbove` namespaces, per namespace up to it.
    Auto,
}

/// What a channel over several namespaces runs in one term, its [`WatchStrategy`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One stream per namespace, `<channel>.<namespace>`.
    PerNamespace,
    /// One stream, `<channel>._all`, over the cluster-wide collection, filtered to the
    /// namespaces in scope.
    ClusterWide,
}

/// Each channel's [`Shape`] for one term, by channel name (channels over one collection are
/// absent).
pub type Shapes = std::collections::HashMap<String, Shape>;

/// Which namespaces a channel covers, after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// One stream over the collection without a namespace: cluster-scoped resources, or a
    /// namespaced resource across all namespaces.
    Cluster,
    /// The namespaces listed in `namespaces`.
    Namespaces(Vec<String>),
    /// The namespaces whose labels match this selector (`namespaceSelector`), as they come and go.
    Selector(String),
}

/// A validated channel, ready to spawn streams from.
#[derive(Debug, Clone)]
pub struct Channel {
    /// Its name in stream ids, metrics and checkpoints (the operationId unless set); no dot.
    pub name: String,
    /// The catalogue's operationId, or `watch<resource>` for a custom path.
    pub operation_id: String,
    /// The AsyncAPI message name its envelopes carry.
    pub message: String,
    /// The watch path template, parsed.
    pub path: ChannelPath,
    /// Which namespaces it covers.
    pub scope: Scope,
    /// How a `Namespaces` or `Selector` scope is watched.
    pub strategy: WatchStrategy,
    /// Only objects matching this label selector, passed to the API server.
    pub label_selector: Option<String>,
    /// Only objects matching this field selector, passed to the API server.
    pub field_selector: Option<String>,
    /// How records are keyed.
    pub key: KeyTemplate,
    /// Follow every DELETED with a tombstone.
    pub tombstones: bool,
    /// Partitions of its topics, when set for the channel.
    pub partitions: Option<i32>,
    /// Its own topic configurations, over `kafka.topics.configs`.
    pub topic_configs: BTreeMap<String, String>,
    /// The event types published (BOOKMARK with `forwardBookmarks`).
    pub forwarded: EventTypes,
    /// Leave `metadata.managedFields` out of the objects it publishes.
    pub drop_managed_fields: bool,
    /// Publish a Secret's `data` and `stringData` (off: they are removed).
    pub allow_secret_data: bool,
    /// The topic template, as written; [`Channel::topic_for`] renders it for one stream.
    pub topic: String,
    /// Whether this channel is in the built-in catalogue (custom ones are resolved through
    /// discovery and may not exist yet).
    pub builtin: bool,
    /// With sharding on, a channel over one collection that the release relayed whole before
    /// fan-out (`<channel>._all`, in its channel's shard) and still does, so that its keys and
    /// their history stay where they are (see [`crate::config::Config::keeping_whole`]).
    pub kept_whole: bool,
}

/// A stream's id, its checkpoint key and metric label: `<channel>.<namespace>`, or
/// `<channel>._all` for a cluster-wide stream, or `<channel>._all-s<k>` for shard `k`'s part of
/// a cluster-wide stream fanned out to the shards (see [`crate::config::ShardingConfig::fans`]).
/// Channel names have no dot, so the first one ends the channel's name, and namespace names
/// never start with `_`; [`StreamId::parts`] is the one parser of the form, for ids read back
/// (checkpoint keys, membership records).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(String);

impl StreamId {
    /// The namespace part of a cluster-wide stream's id.
    const ALL: &'static str = "_all";

    /// The id of `channel`'s stream over `namespace` (`None`: cluster-wide, `<channel>._all`).
    pub fn new(channel: &str, namespace: Option<&str>) -> Self {
        Self(format!("{channel}.{}", namespace.unwrap_or(Self::ALL)))
    }

    /// The id of shard `shard`'s part of `channel`'s cluster-wide stream.
    pub fn fanned(channel: &str, shard: u32) -> Self {
        Self(format!("{channel}.{}-s{shard}", Self::ALL))
    }

    /// The channel and the namespace (`None`: cluster-wide, whole or a shard's part) that `id`
    /// names; `None` when it is not a stream id.
    pub fn parts(id: &str) -> Option<(&str, Option<&str>)> {
        let (channel, ns) = id.split_once('.')?;
        let wide = ns == Self::ALL || Self::shard_in(id).is_some();
        Some((channel, (!wide).then_some(ns)))
    }

    /// The shard whose part of a fanned-out cluster-wide stream `id` is, if it is one.
    pub fn shard_in(id: &str) -> Option<u32> {
        let (_, ns) = id.split_once('.')?;
        let k = ns.strip_prefix(Self::ALL)?.strip_prefix("-s")?;
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        k.parse().ok()
    }
}

/// As `check-config` says it: `every namespace`, `namespaces a, b`, `namespaces matching SEL`.
impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::Cluster => f.write_str("the whole collection"),
            Scope::Namespaces(list) => write!(f, "namespaces {}", list.join(", ")),
            Scope::Selector(sel) => write!(f, "namespaces matching {sel}"),
        }
    }
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::ops::Deref for StreamId {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

/// Hashes and compares as its text, so maps keyed by ids are looked up with ids read back.
impl std::borrow::Borrow<str> for StreamId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl Channel {
    /// Whether this channel publishes events of `event_type`.
    pub fn forwards(&self, event_type: EventType) -> bool {
        self.forwarded.contains(event_type)
    }

    /// The id of this channel's stream over `namespace`.
    pub fn stream_id(&self, namespace: Option<&str>) -> StreamId {
        StreamId::new(&self.name, namespace)
    }

    /// What this channel runs this term when `namespaces` namespaces are in scope, and it ran
    /// `previous` last time: `auto` keeps what it ran (a switch of shape relists every
    /// stream it touches, so it is never made by a count at a routine restart), and
    /// without a previous shape goes cluster-wide above `threshold` namespaces. A topic that
    /// depends on the namespace needs one stream per namespace. `None` for a channel over one
    /// collection already.
    pub fn shape(
        &self,
        namespaces: usize,
        previous: Option<Shape>,
        threshold: usize,
    ) -> Option<Shape> {
        if self.scope == Scope::Cluster {
            return None;
        }
        Some(match self.strategy {
            _ if self.topic.contains("{namespace}") => Shape::PerNamespace,
            WatchStrategy::PerNamespace => Shape::PerNamespace,
            WatchStrategy::ClusterWide => Shape::ClusterWide,
            WatchStrategy::Auto => match previous {
                Some(shape) => shape,
                None if namespaces > threshold => Shape::ClusterWide,
                None => Shape::PerNamespace,
            },
        })
    }

    /// A fingerprint of what this channel's stream over `namespace` watches: the collection
    /// path (with the namespace), the selectors, and whether the relay filters it to some
    /// namespaces. A saved position belongs to it.
    pub fn query_fingerprint(&self, namespace: Option<&str>, filtered: bool) -> String {
        let what = format!(
            "{}{}\n{}\n{}",
            self.path.collection_url(namespace),
            if filtered { "\nfiltered" } else { "" },
            self.label_selector.as_deref().unwrap_or_default(),
            self.field_selector.as_deref().unwrap_or_default()
        );
        format!("{:016x}", super::hash::fnv1a64(&what))
    }

    /// The query fingerprint of a stream filtered to `namespaces` (in order) over the query
    /// whose fingerprint is `base`: what a cluster-wide stream filtered in the relay stamps.
    pub fn scoped_fingerprint<'a>(
        namespaces: impl IntoIterator<Item = &'a str>,
        base: &str,
    ) -> String {
        let hash = namespaces
            .into_iter()
            .flat_map(|ns| ns.bytes().chain(std::iter::once(b'\n')))
            .chain(base.bytes())
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
        format!("{hash:016x}")
    }

    /// Whether this channel and `other` may publish the same object under the same topic: the
    /// same resource, topics that render alike, and scopes that are not provably disjoint (a
    /// namespace selector matches what it likes). Two such channels would each retract what the
    /// other announces, so the configuration refuses them.
    pub fn may_overlap(&self, other: &Channel, cluster: &str) -> bool {
        let same_resource = self.path.collection_url(None) == other.path.collection_url(None);
        let probe = Some("\u{1}");
        let same_topic = self.topic_for(cluster, probe) == other.topic_for(cluster, probe);
        let scopes_meet = match (&self.scope, &other.scope) {
            (Scope::Namespaces(a), Scope::Namespaces(b)) => a.iter().any(|ns| b.contains(ns)),
            _ => true,
        };
        same_resource && same_topic && scopes_meet
    }

    /// The topic for a stream of this channel.
    pub fn topic_for(&self, cluster: &str, namespace: Option<&str>) -> String {
        self.topic
            .replace("{cluster}", cluster)
            .replace("{namespace}", namespace.unwrap_or("all"))
            .replace("{resource}", &self.path.resource_name())
            .replace("{operationId}", &self.operation_id)
            .replace("{channel}", &self.name)
    }
}

impl ChannelConfig {
    /// Validates the `i`th channel of the file and resolves it against the catalogue.
    pub(crate) fn resolve(&self, i: usize, cluster: &str) -> Result<Channel, ConfigError> {
        let f = |name: &str| format!("channels[{i}].{name}");
        let (operation_id, path, message, builtin) = match (&self.operation_id, &self.path) {
            (Some(op), None) => {
                let entry = catalogue::lookup(op).ok_or_else(|| {
                    let known: Vec<_> = catalogue::CATALOGUE
                        .iter()
                        .map(|c| c.operation_id)
                        .collect();
                    invalid(
                        f("operationId"),
                        format!("unknown operationId {op:?}; known: {}", known.join(", ")),
                    )
                })?;
                if self.message.is_some() {
                    return Err(invalid(
                        f("message"),
                        "only custom channels (path) can set message",
                    ));
                }
                let path = ChannelPath::parse(entry.path).expect("catalogue paths are valid");
                (op.clone(), path, entry.message.to_string(), true)
            }
            (None, Some(p)) => {
                let path = ChannelPath::parse(p).map_err(|e| invalid(f("path"), e.to_string()))?;
                if self.name.is_none() {
                    return Err(invalid(f("name"), "required for a custom path"));
                }
                let msg = self.message.clone().unwrap_or_else(|| "WatchEvent".into());
                (format!("watch{}", path.resource), path, msg, false)
            }
            _ => {
                return Err(invalid(
                    f("operationId"),
                    "set exactly one of operationId and path",
                ))
            }
        };
        let name = self.name.clone().unwrap_or_else(|| operation_id.clone());
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(invalid(
                f("name"),
                "must be non-empty and use only letters, digits, '-' and '_'",
            ));
        }
        let scopes = [
            self.namespaces.is_some(),
            self.all_namespaces,
            self.namespace_selector.is_some(),
        ];
        let scope = if !path.namespaced {
            if scopes.iter().any(|s| *s) {
                return Err(invalid(
                    f("namespaces"),
                    "this channel is not namespaced: namespaces, allNamespaces and namespaceSelector do not apply",
                ));
            }
            Scope::Cluster
        } else {
            match scopes.iter().filter(|s| **s).count() {
                1 => {}
                _ => {
                    return Err(invalid(
                        f("namespaces"),
                        "a namespaced channel needs exactly one of namespaces, allNamespaces and namespaceSelector",
                    ))
                }
            }
            if let Some(list) = &self.namespaces {
                if list.is_empty() {
                    return Err(invalid(f("namespaces"), "must not be empty"));
                }
                for (j, ns) in list.iter().enumerate() {
                    if !is_dns_label(ns) {
                        return Err(invalid(
                            format!("channels[{i}].namespaces[{j}]"),
                            format!("{ns:?} is not a namespace name"),
                        ));
                    }
                }
                Scope::Namespaces(list.clone())
            } else if let Some(sel) = &self.namespace_selector {
                if sel.trim().is_empty() {
                    return Err(invalid(f("namespaceSelector"), "must not be empty"));
                }
                super::selector::label_selector(sel)
                    .map_err(|m| invalid(f("namespaceSelector"), m))?;
                Scope::Selector(sel.clone())
            } else {
                Scope::Cluster
            }
        };
        let strategy = match (self.watch_strategy, &scope) {
            (None, _) => WatchStrategy::Auto,
            // Every namespace, read once (with sharding on, once per replica for its shards,
            // instead of one watch per namespace).
            (Some(WatchStrategy::ClusterWide), Scope::Cluster) if path.namespaced => {
                WatchStrategy::ClusterWide
            }
            (Some(_), Scope::Cluster) => {
                return Err(invalid(
                    f("watchStrategy"),
                    "applies to channels with namespaces or a namespaceSelector only (and clusterWide to allNamespaces)",
                ))
            }
            (Some(WatchStrategy::ClusterWide), _) if self.topic.contains("{namespace}") => {
                return Err(invalid(
                    f("watchStrategy"),
                    "clusterWide needs a topic that does not depend on {namespace}",
                ))
            }
            (Some(s), _) => s,
        };
        let secrets = path.group.is_empty() && path.resource == "secrets";
        if (self.sensitive || secrets) && strategy == WatchStrategy::Auto && scope != Scope::Cluster
        {
            return Err(invalid(
                f("watchStrategy"),
                "must be chosen for a sensitive resource (Secrets, or sensitive: true): perNamespace reads only the namespaces in scope, clusterWide reads every namespace; auto would decide by a count",
            ));
        }
        if let Some(j) = self.event_types.iter().position(|t| !t.is_object_change()) {
            return Err(invalid(
                format!("channels[{i}].eventTypes[{j}]"),
                "only ADDED, MODIFIED and DELETED (bookmarks: forwardBookmarks)",
            ));
        }
        let mut forwarded: EventTypes = self.event_types.iter().copied().collect();
        if self.forward_bookmarks {
            forwarded.insert(EventType::Bookmark);
        }
        if forwarded.is_empty() {
            return Err(invalid(f("eventTypes"), "selects nothing to publish"));
        }
        if let Some(sel) = &self.label_selector {
            super::selector::label_selector(sel).map_err(|m| invalid(f("labelSelector"), m))?;
        }
        if let Some(sel) = &self.field_selector {
            super::selector::field_selector(sel).map_err(|m| invalid(f("fieldSelector"), m))?;
        }
        if self.partitions.is_some_and(|p| p < 1) {
            return Err(invalid(f("partitions"), "must be at least 1"));
        }
        if let Some(policy) = self.topic_configs.get("cleanup.policy") {
            if self.tombstones && !policy.split(',').any(|p| p.trim() == "compact") {
                return Err(invalid(
                    f("topicConfigs.cleanup.policy"),
                    "must include compact with tombstones: true (tombstones exist for compaction)",
                ));
            }
        }
        let channel = Channel {
            name,
            operation_id,
            message,
            path,
            scope,
            strategy,
            label_selector: self.label_selector.clone(),
            field_selector: self.field_selector.clone(),
            forwarded,
            tombstones: self.tombstones,
            partitions: self.partitions,
            topic_configs: self.topic_configs.clone(),
            key: match &self.key {
                Some(k) => KeyTemplate::parse(k).map_err(|m| invalid(f("key"), m))?,
                None => KeyTemplate::default(),
            },
            drop_managed_fields: self.drop_managed_fields,
            allow_secret_data: self.allow_secret_data,
            topic: self.topic.clone(),
            builtin,
            kept_whole: false,
        };
        let mut template = self.topic.clone();
        for var in [
            "{cluster}",
            "{namespace}",
            "{resource}",
            "{operationId}",
            "{channel}",
        ] {
            template = template.replace(var, "x");
        }
        if template.contains(['{', '}']) {
            return Err(invalid(
                f("topic"),
                "unknown template variable; use {cluster}, {namespace}, {resource}, {operationId} or {channel}",
            ));
        }
        if !is_topic(&channel.topic_for(cluster, Some("x"))) {
            return Err(invalid(f("topic"), topic_rule()));
        }
        Ok(channel)
    }
}

pub(crate) fn topic_rule() -> &'static str {
    "a topic name is 1-249 characters of a-z, A-Z, 0-9, '.', '_' and '-', other than '.' and '..'"
}

/// [`topic_rule`] for a name given as `topic`, with a word on placeholders where it holds one
/// (only channel topics have templates).
pub(crate) fn topic_rule_for(topic: &str) -> String {
    if topic.contains('{') {
        format!(
            "{}; {topic:?} holds a placeholder, and placeholders are replaced in channel topics only",
            topic_rule()
        )
    } else {
        topic_rule().to_string()
    }
}

pub(crate) fn is_topic(t: &str) -> bool {
    !t.is_empty()
        && t != "."
        && t != ".."
        && t.len() <= 249
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

#[cfg(test)]
mod stream_id_tests {
    use super::StreamId;

    #[test]
    fn a_stream_id_reads_back_as_the_channel_and_namespace_it_was_made_of() {
        let ns = StreamId::new("watchNamespacedPods", Some("shop"));
        let all = StreamId::new("watchNamespacedPods", None);
        assert_eq!(
            (&*ns, &*all),
            ("watchNamespacedPods.shop", "watchNamespacedPods._all")
        );
        assert_eq!(
            StreamId::parts(&ns),
            Some(("watchNamespacedPods", Some("shop")))
        );
        assert_eq!(StreamId::parts(&all), Some(("watchNamespacedPods", None)));
        // The first dot ends the channel name; what follows is the namespace.
        assert_eq!(StreamId::parts("pods.a.b"), Some(("pods", Some("a.b"))));
        assert_eq!(StreamId::parts("no-dot"), None);
        // A shard's part of a fanned-out cluster-wide stream.
        let part = StreamId::fanned("watchAllPods", 17);
        assert_eq!(&*part, "watchAllPods._all-s17");
        assert_eq!(StreamId::parts(&part), Some(("watchAllPods", None)));
        assert_eq!(StreamId::shard_in(&part), Some(17));
        assert_eq!(StreamId::shard_in(&all), None);
        assert_eq!(StreamId::shard_in("pods._all-s"), None);
        assert_eq!(StreamId::shard_in("pods._all-sx"), None);
        let map: std::collections::HashMap<StreamId, u8> = [(ns.clone(), 1)].into();
        assert_eq!(map.get("watchNamespacedPods.shop"), Some(&1));
    }
}
