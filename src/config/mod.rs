//! The configuration file: one YAML document, validated at start.
//!
//! Every struct rejects unknown fields and every validation error names the field path
//! (`channels[2].namespaces`), so a typo never silently changes behaviour.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

mod channel;
mod fields;
mod hash;
mod kafka;
mod validate;
pub(crate) use kafka::redact;
mod key;
mod registry;
mod selector;
mod sharding;
mod syntax;

pub(crate) use channel::{is_topic, topic_rule, topic_rule_for};
pub use channel::{Channel, ChannelConfig, Scope, Shape, Shapes, StreamId, WatchStrategy};
pub use fields::field_paths;
pub use hash::{fmix64, fnv1a64};
pub use key::KeyTemplate;
pub use registry::{SchemaRegistryConfig, WireFormat};
pub use sharding::{GroupProtocol, ShardingConfig};
use syntax::{expand_env, is_dns_label, is_dns_subdomain};

/// Why the configuration cannot be used.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The configuration file's path.
        path: PathBuf,
        /// Why reading it failed.
        source: std::io::Error,
    },
    /// Not YAML, or not the file's shape (an unknown field, a wrong type, a missing field).
    #[error("{0}")]
    Parse(String),
    /// A value the relay does not accept.
    #[error("{field}: {message}")]
    Invalid {
        /// The field's path, e.g. `channels[2].namespaces`.
        field: String,
        /// What is wrong with its value.
        message: String,
    },
}

/// The parser's message, for a person: without its own `error: ` prefix (the relay's comes
/// first), and a number's type said in words.
fn readable(message: &str) -> String {
    let mut m = message
        .strip_prefix("error: ")
        .unwrap_or(message)
        .to_string();
    for (ty, words) in [
        ("u8", "a whole number from 0 to 255"),
        ("u16", "a whole number from 0 to 65535"),
        ("u32", "a whole number from 0 to 4294967295"),
        ("u64", "a whole number from 0 to 18446744073709551615"),
        ("usize", "a whole number from 0"),
        ("i32", "a whole number"),
        ("i64", "a whole number"),
        ("f64", "a number"),
        ("bool", "true or false"),
    ] {
        m = m.replace(&format!("invalid {ty}\n"), &format!("expected {words}\n"));
        if let Some(head) = m.strip_suffix(&format!("invalid {ty}")) {
            m = format!("{head}expected {words}");
        }
    }
    m
}

pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// The whole file, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct File {
    /// Name of this cluster, carried in every envelope and usable in topic templates.
    cluster_name: String,
    /// How to reach the Kubernetes API.
    #[serde(default)]
    kubernetes: KubernetesConfig,
    /// The Kafka producer.
    kafka: KafkaConfig,
    /// Where stream positions are stored.
    checkpoint: CheckpointConfig,
    /// The HTTP endpoint for metrics and probes.
    #[serde(default)]
    http: HttpConfig,
    /// Several replicas, one relaying at a time.
    #[serde(default)]
    leader_election: LeaderElectionConfig,
    /// Several replicas, each relaying the streams of the shards it owns.
    #[serde(default)]
    sharding: ShardingConfig,
    /// A schema registry for the topics' values.
    #[serde(default)]
    schema_registry: SchemaRegistryConfig,
    /// What to watch.
    channels: Vec<ChannelConfig>,
    /// Threads running the streams. One (the default) runs every stream, the HTTP endpoint and
    /// the checkpoint writer on a single thread, which costs the least CPU per event because
    /// no task is ever woken across threads; librdkafka compresses and sends on its own threads.
    #[serde(default = "one")]
    worker_threads: usize,
    /// The whole stop, from the first signal: draining deliveries, flushing the producer,
    /// the final checkpoint write and releasing the Lease. The chart gives the pod this plus a
    /// margin as its termination grace period.
    #[serde(default = "default_shutdown_timeout")]
    shutdown_timeout_seconds: u64,
}

fn one() -> usize {
    1
}

/// How the relay reaches the Kubernetes API and paces its lists and watches (`kubernetes`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct KubernetesConfig {
    /// Path of a kubeconfig file; when absent the in-cluster service account is tried first,
    /// then `$KUBECONFIG` / `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// Context to use from the kubeconfig.
    pub context: Option<String>,
    /// Server-side timeout of each watch request; the stream resumes from its last position
    /// when it ends.
    pub watch_timeout_seconds: u32,
    /// Page size of the lists that start and resync streams.
    pub list_page_size: u32,
    /// An open watch that delivers no byte (event or bookmark) for this long is taken for
    /// stalled (a half-open connection): it is closed and reopened from its position, and
    /// `/readyz` fails while a stream stays stalled past it. The API server sends a bookmark
    /// about every minute.
    pub watch_idle_timeout_seconds: u32,
    /// Start and resync streams with a watch that first sends the current state
    /// (`sendInitialEvents`, the WatchList feature) where the server supports it; a server that
    /// refuses it gets paginated lists from then on.
    pub send_initial_events: bool,
    /// First retry delay after an API error; doubles up to `backoffMaxMs`, with jitter.
    pub backoff_initial_ms: u64,
    /// The longest retry delay after repeated API errors.
    pub backoff_max_ms: u64,
    /// Syncs (initial lists or `sendInitialEvents` watches, at start and after a 410) that may
    /// run at once across all streams: a start with thousands of streams never fires thousands
    /// of lists at once.
    pub max_concurrent_syncs: u32,
    /// Each sync first waits a random delay below this, spreading a start's or a mass 410's
    /// lists over time.
    pub sync_jitter_ms: u64,
    /// A channel with `watchStrategy: auto` (the default) over more namespaces than this watches
    /// the cluster-wide collection once instead of each namespace.
    pub cluster_wide_above: u32,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            context: None,
            watch_timeout_seconds: 290,
            list_page_size: 500,
            watch_idle_timeout_seconds: 120,
            send_initial_events: true,
            backoff_initial_ms: 200,
            backoff_max_ms: 30_000,
            max_concurrent_syncs: 16,
            sync_jitter_ms: 500,
            cluster_wide_above: 100,
        }
    }
}

/// The Kafka producer (`kafka`): brokers, librdkafka properties and the relay's limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KafkaConfig {
    /// `host:port[,host:port]`.
    pub bootstrap_servers: String,
    /// Any librdkafka producer property (`security.protocol`, `sasl.mechanism`,
    /// `ssl.ca.location`, `compression.type`, ...). Applied after the relay's defaults. Values
    /// may reference environment variables as `${NAME}` (`$${` is a literal `${`), so secrets
    /// such as `sasl.password` come from a Secret rather than the configuration file.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Events of one stream that may be awaiting Kafka's acknowledgement at once; past this the
    /// stream stops reading its watch.
    #[serde(default = "default_in_flight")]
    pub max_in_flight_per_stream: usize,
    /// The largest record value the relay will send; larger events take the `oversize` path.
    /// Keep it at or below the topic's `max.message.bytes`.
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: usize,
    /// What to do with an event larger than `maxMessageBytes`.
    #[serde(default)]
    pub oversize: OversizePolicy,
    /// Topic that receives reference envelopes of oversized events when `oversize` is
    /// `deadLetter`.
    #[serde(default)]
    pub dead_letter_topic: Option<String>,
    /// Allow `properties` that weaken the delivery guarantee (`acks`, idempotence, delivery
    /// timeouts, more than 5 requests in flight, the partitioner, ...). Off: they are refused.
    #[serde(default)]
    pub unsafe_producer_overrides: bool,
    /// The channel and dead-letter topics: created when missing, checked when present.
    #[serde(default)]
    pub topics: TopicsConfig,
    /// What a consumer may rely on (see [`Delivery`]).
    #[serde(default)]
    pub delivery: Delivery,
    /// With `delivery: exactlyOnce`: how often the open transaction is committed, in
    /// milliseconds. A record reaches `read_committed` consumers at most about this long after
    /// it is handed over.
    #[serde(default = "default_commit_interval")]
    pub commit_interval_ms: u64,
}

/// What a consumer may rely on (`kafka.delivery`).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Delivery {
    /// Every change at least once: after a crash or a handover some are published again, and
    /// consumers drop them by `watchrelay.id`.
    #[default]
    AtLeastOnce,
    /// Every change once, for `read_committed` consumers: records, memberships and positions
    /// are committed in Kafka transactions, one producer per term fenced by the next owner's.
    ExactlyOnce,
}

/// How the relay treats the topics it publishes to (`kafka.topics`; see the `topics` module).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct TopicsConfig {
    /// Create every missing channel and dead-letter topic at start (on by default); off, a
    /// missing topic is an error at start naming it.
    pub create: bool,
    /// Partitions of the topics it creates (6 when absent); when set, also the least an
    /// existing one may have. A channel's `partitions` wins for its topics.
    pub partitions: Option<i32>,
    /// Replication factor of the topics it creates; the broker's default when absent.
    pub replication_factor: Option<i32>,
    /// Topic configurations (`retention.ms`, `min.insync.replicas`, ...) of the channel topics
    /// it creates; a channel's `topicConfigs` win for its topics.
    pub configs: BTreeMap<String, String>,
}

impl Default for TopicsConfig {
    fn default() -> Self {
        Self {
            create: true,
            partitions: None,
            replication_factor: None,
            configs: BTreeMap::new(),
        }
    }
}

fn default_in_flight() -> usize {
    10_000
}
fn default_commit_interval() -> u64 {
    100
}
fn default_max_message_bytes() -> usize {
    1_000_000
}
fn default_shutdown_timeout() -> u64 {
    30
}

/// Of the shutdown budget, what the final checkpoint write may take.
pub const CHECKPOINT_RESERVE: Duration = Duration::from_secs(5);
/// Of the shutdown budget, what releasing the Lease may take.
pub const RELEASE_RESERVE: Duration = Duration::from_secs(3);

/// What happens to an event larger than `maxMessageBytes` (`kafka.oversize`).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum OversizePolicy {
    /// Send a reference envelope (object reduced to its identity) to `deadLetterTopic`.
    #[default]
    DeadLetter,
    /// Send the reference envelope to the channel's own topic instead.
    Trim,
}

/// Where stream positions (a ConfigMap) and memberships (a Kafka topic) are kept (`checkpoint`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CheckpointConfig {
    /// Namespace of the checkpoint ConfigMap.
    pub namespace: String,
    /// Name of the checkpoint ConfigMap; created when missing.
    #[serde(default = "default_checkpoint_name")]
    pub name: String,
    /// Debounce interval between ConfigMap writes.
    #[serde(default = "default_checkpoint_interval")]
    pub interval_ms: u64,
    /// The compacted Kafka topic that keeps which objects each stream announced.
    #[serde(default)]
    pub membership: MembershipConfig,
}

impl CheckpointConfig {
    /// Whether `owner` (`<namespace>/<name>` of a checkpoint ConfigMap) is this release's: its
    /// own ConfigMap, or any of its shards', whatever their number.
    pub fn owns(&self, owner: &str) -> bool {
        owner
            .strip_prefix(self.namespace.as_str())
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|name| ShardingConfig::of_release(&self.name, name))
    }
}

/// The membership topic (see the `membership` module): created compacted when missing.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct MembershipConfig {
    /// Its name; `watchrelay.{cluster}.membership` when absent.
    pub topic: Option<String>,
    /// Partitions when the relay creates it (1 when absent).
    pub partitions: Option<i32>,
    /// Replication factor when the relay creates it; the broker's default when absent.
    pub replication_factor: Option<i32>,
}

impl MembershipConfig {
    /// The topic's name: the configured one, or `watchrelay.{cluster}.membership`.
    pub fn topic(&self, cluster: &str) -> String {
        self.topic
            .clone()
            .unwrap_or_else(|| format!("watchrelay.{cluster}.membership"))
    }
}

fn default_checkpoint_name() -> String {
    "watchrelay-checkpoints".into()
}
fn default_checkpoint_interval() -> u64 {
    1000
}

/// Leader election over a `coordination.k8s.io/v1` Lease: replicas that do not hold it stand by.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct LeaderElectionConfig {
    /// Off (the default): the relay relays at once, without a Lease.
    pub enabled: bool,
    /// Namespace of the Lease; `checkpoint.namespace` when absent.
    pub namespace: Option<String>,
    /// Name of the Lease; created when missing.
    pub name: String,
    /// Prefix of this replica's name in the Lease (a per-process suffix is always added);
    /// `$POD_NAME`, then the host name, when absent.
    pub identity: Option<String>,
    /// How long a standby waits, after the Lease last changed, before taking it over.
    pub lease_duration_seconds: u32,
    /// How long the leader keeps relaying without a successful renewal before it gives up.
    pub renew_deadline_seconds: u32,
    /// Interval between renewals, and between a standby's attempts.
    pub retry_period_seconds: u32,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            namespace: None,
            name: "watchrelay-leader".into(),
            identity: None,
            lease_duration_seconds: 15,
            renew_deadline_seconds: 10,
            retry_period_seconds: 2,
        }
    }
}

impl LeaderElectionConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self
            .namespace
            .as_deref()
            .is_some_and(|ns| !is_dns_label(ns))
        {
            return Err(invalid(
                "leaderElection.namespace",
                "must be a namespace name",
            ));
        }
        if !is_dns_subdomain(&self.name) {
            return Err(invalid("leaderElection.name", "must be a Lease name"));
        }
        if self.identity.as_deref().is_some_and(str::is_empty) {
            return Err(invalid("leaderElection.identity", "must not be empty"));
        }
        if self.retry_period_seconds == 0 {
            return Err(invalid(
                "leaderElection.retryPeriodSeconds",
                "must be at least 1",
            ));
        }
        if self.renew_deadline_seconds <= self.retry_period_seconds {
            return Err(invalid(
                "leaderElection.renewDeadlineSeconds",
                "must be longer than retryPeriodSeconds",
            ));
        }
        if self.lease_duration_seconds <= self.renew_deadline_seconds {
            return Err(invalid(
                "leaderElection.leaseDurationSeconds",
                "must be longer than renewDeadlineSeconds, so a leader stops before a standby takes over",
            ));
        }
        Ok(())
    }
}

/// The HTTP endpoint for metrics and probes (`http`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct HttpConfig {
    /// Address of `/metrics`, `/healthz` and `/readyz`; empty disables the endpoint.
    pub listen: String,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: "0.0.0.0:9464".into(),
        }
    }
}

/// The validated configuration: the file with its channels resolved once, at load.
#[derive(Debug, Clone)]
pub struct Config {
    /// Name of this cluster (`clusterName`), carried in every envelope and topic template.
    pub cluster_name: String,
    /// How to reach the Kubernetes API, and how streams list and watch.
    pub kubernetes: KubernetesConfig,
    /// The Kafka producer.
    pub kafka: KafkaConfig,
    /// Where stream positions and memberships are kept.
    pub checkpoint: CheckpointConfig,
    /// The endpoint for metrics and probes.
    pub http: HttpConfig,
    /// Several replicas, one relaying at a time.
    pub leader_election: LeaderElectionConfig,
    /// Several replicas, each relaying the streams of the shards it owns.
    pub sharding: ShardingConfig,
    /// A schema registry for the topics' values.
    pub schema_registry: SchemaRegistryConfig,
    /// The channels, resolved and validated, in the file's order.
    pub channels: Vec<Arc<Channel>>,
    /// Threads running the streams (`workerThreads`, 1 by default).
    pub worker_threads: usize,
    /// The whole stop's budget, from the first signal (see [`Config::drain_time`]).
    pub shutdown_timeout_seconds: u64,
}

/// How often a single leader running without leader election looks whether replicas of its
/// release started sharded.
pub const SHARDING_WATCH: Duration = Duration::from_secs(5);

impl Config {
    /// The Kafka settings of the relay's producer: `kafka`, and with sharding on a delivery
    /// timeout of [`ShardingConfig::delivery_timeout`] unless `kafka.properties` sets one.
    pub fn producer_kafka(&self) -> KafkaConfig {
        let mut kafka = self.kafka.clone();
        let set = ["message.timeout.ms", "delivery.timeout.ms"]
            .iter()
            .any(|k| kafka.properties.contains_key(*k));
        if self.sharding.enabled && !set {
            let timeout = self.sharding.delivery_timeout().as_millis().to_string();
            kafka
                .properties
                .insert("message.timeout.ms".into(), timeout);
        }
        kafka
    }

    /// Of the shutdown budget, what draining the streams and flushing the producer may take:
    /// the rest is kept for the final checkpoint write and the Lease release.
    pub fn drain_time(&self) -> Duration {
        Duration::from_secs(self.shutdown_timeout_seconds)
            .saturating_sub(CHECKPOINT_RESERVE + RELEASE_RESERVE)
            .max(Duration::from_secs(1))
    }

    /// The namespace of the leader Lease: `leaderElection.namespace`, or the checkpoint's.
    pub fn lease_namespace(&self) -> &str {
        self.leader_election
            .namespace
            .as_deref()
            .unwrap_or(&self.checkpoint.namespace)
    }

    /// How long after sharded replicas parked the leader Lease a single leader of the release
    /// running without leader election has stopped: it looks every [`SHARDING_WATCH`], then
    /// drains and writes its last checkpoint. Each shard's first owner waits this long past the
    /// park before it copies the single leader's state.
    pub fn handoff(&self) -> Duration {
        SHARDING_WATCH + self.drain_time() + CHECKPOINT_RESERVE + RELEASE_RESERVE
    }
}

impl Config {
    /// Reads and validates the file at `path`; `${NAME}` in Kafka properties reads the environment.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            // The parser's excerpt names its input `<input>`: name the file.
            ConfigError::Parse(m) => {
                ConfigError::Parse(m.replace("--> <input>:", &format!("--> {}:", path.display())))
            }
            e => e,
        })
    }

    /// Parses and validates `text`; `${NAME}` in Kafka properties reads the process environment.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        Self::parse_with_env(text, |name| std::env::var(name).ok())
    }

    /// [`Config::parse`], looking environment variables up with `env`.
    pub fn parse_with_env(
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut file: File = serde_saphyr::from_str(text)
            .map_err(|e| ConfigError::Parse(readable(&e.to_string())))?;
        for (key, value) in file.kafka.properties.iter_mut() {
            *value = expand_env(value, &env)
                .map_err(|m| invalid(format!("kafka.properties.{key}"), m))?;
        }
        let registry = &mut file.schema_registry;
        for (field, value) in [
            ("username", &mut registry.username),
            ("password", &mut registry.password),
        ] {
            if let Some(v) = value {
                *v = expand_env(v, &env)
                    .map_err(|m| invalid(format!("schemaRegistry.{field}"), m))?;
            }
        }
        file.schema_registry.validate()?;
        file.validate()?;
        let channels = file
            .channels
            .iter()
            .enumerate()
            .map(|(i, c)| c.resolve(i, &file.cluster_name).map(Arc::new))
            .map(|c| c.map(|c| file.sharding.spread(c)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut names = std::collections::HashSet::new();
        for (i, c) in channels.iter().enumerate() {
            file.sharding.check_channel(i, c)?;
            if !names.insert(c.name.clone()) {
                return Err(invalid(
                    format!("channels[{i}].name"),
                    format!("duplicate channel name {:?}", c.name),
                ));
            }
            if let Some((j, o)) = channels[..i]
                .iter()
                .enumerate()
                .find(|(_, o)| o.may_overlap(c, &file.cluster_name))
            {
                return Err(invalid(
                    format!("channels[{i}]"),
                    format!(
                        "channel {:?} and channels[{j}] ({:?}) watch the same resource into the same topic with scopes that may overlap, so each could retract what the other announces; give one its own topic or make their namespaces disjoint lists",
                        c.name, o.name
                    ),
                ));
            }
        }
        Ok(Config {
            cluster_name: file.cluster_name,
            kubernetes: file.kubernetes,
            kafka: file.kafka,
            checkpoint: file.checkpoint,
            http: file.http,
            leader_election: file.leader_election,
            sharding: file.sharding,
            schema_registry: file.schema_registry,
            channels,
            worker_threads: file.worker_threads,
            shutdown_timeout_seconds: file.shutdown_timeout_seconds,
        })
    }
}

#[cfg(test)]
mod tests;
