//! The configuration file: one YAML document, validated at start.
//!
//! Every struct rejects unknown fields and every validation error names the field path
//! (`channels[2].namespaces`), so a typo never silently changes behaviour.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;

use crate::catalogue::{self, ChannelPath};

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Parse(String),
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// Name of this cluster, carried in every envelope and usable in topic templates.
    pub cluster_name: String,
    /// How to reach the Kubernetes API.
    #[serde(default)]
    pub kubernetes: KubernetesConfig,
    /// The Kafka producer.
    pub kafka: KafkaConfig,
    /// Where stream positions are stored.
    pub checkpoint: CheckpointConfig,
    /// The HTTP endpoint for metrics and probes.
    #[serde(default)]
    pub http: HttpConfig,
    /// Several replicas, one relaying at a time.
    #[serde(default)]
    pub leader_election: LeaderElectionConfig,
    /// What to watch.
    pub channels: Vec<ChannelConfig>,
    /// Threads running the streams. One (the default) runs every stream, the HTTP endpoint and
    /// the checkpoint writer on a single thread, which costs the least CPU per event because
    /// no task is ever woken across threads; librdkafka compresses and sends on its own threads.
    #[serde(default = "one")]
    pub worker_threads: usize,
}

fn one() -> usize {
    1
}

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
    /// Start and resync streams with a watch that first sends the current state
    /// (`sendInitialEvents`, the WatchList feature) where the server supports it; a server that
    /// refuses it gets paginated lists from then on.
    pub send_initial_events: bool,
    /// First retry delay after an API error; doubles up to `backoffMaxMs`, with jitter.
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            context: None,
            watch_timeout_seconds: 290,
            list_page_size: 500,
            send_initial_events: true,
            backoff_initial_ms: 200,
            backoff_max_ms: 30_000,
        }
    }
}

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
    /// How long shutdown waits for outstanding deliveries.
    #[serde(default = "default_flush_timeout")]
    pub flush_timeout_seconds: u64,
}

fn default_in_flight() -> usize {
    10_000
}
fn default_max_message_bytes() -> usize {
    1_000_000
}
fn default_flush_timeout() -> u64 {
    20
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum OversizePolicy {
    /// Send a reference envelope (object reduced to its identity) to `deadLetterTopic`.
    #[default]
    DeadLetter,
    /// Send the reference envelope to the channel's own topic instead.
    Trim,
}

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

/// The watch event types.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Hash)]
pub enum EventType {
    ADDED,
    MODIFIED,
    DELETED,
}

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
    /// Publish BOOKMARK events too.
    #[serde(default)]
    pub forward_bookmarks: bool,
    /// Drop `metadata.managedFields` from objects (default true).
    #[serde(default = "yes")]
    pub drop_managed_fields: bool,
    /// Forward Secret `data` and `stringData` (default false: they are removed).
    #[serde(default)]
    pub allow_secret_data: bool,
}

fn all_event_types() -> Vec<EventType> {
    vec![EventType::ADDED, EventType::MODIFIED, EventType::DELETED]
}
fn default_topic() -> String {
    "{cluster}.{resource}".into()
}
fn yes() -> bool {
    true
}

/// Which namespaces a channel covers, after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// One stream over the collection without a namespace: cluster-scoped resources, or a
    /// namespaced resource across all namespaces.
    Cluster,
    Namespaces(Vec<String>),
    Selector(String),
}

/// A validated channel, ready to spawn streams from.
#[derive(Debug, Clone)]
pub struct Channel {
    pub name: String,
    pub operation_id: String,
    pub message: String,
    pub path: ChannelPath,
    pub scope: Scope,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub forward_added: bool,
    pub forward_modified: bool,
    pub forward_deleted: bool,
    pub forward_bookmarks: bool,
    pub drop_managed_fields: bool,
    pub allow_secret_data: bool,
    pub topic: String,
    /// Whether this channel is in the built-in catalogue (custom ones are resolved through
    /// discovery and may not exist yet).
    pub builtin: bool,
}

impl Channel {
    pub fn forwards(&self, event_type: &str) -> bool {
        match event_type {
            "ADDED" => self.forward_added,
            "MODIFIED" => self.forward_modified,
            "DELETED" => self.forward_deleted,
            "BOOKMARK" => self.forward_bookmarks,
            _ => false,
        }
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

impl Config {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text)
    }

    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        Self::parse_with_env(text, |name| std::env::var(name).ok())
    }

    /// [`Config::parse`], looking environment variables up with `env`.
    pub fn parse_with_env(
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut cfg: Config =
            serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        for (key, value) in cfg.kafka.properties.iter_mut() {
            *value = expand_env(value, &env)
                .map_err(|m| invalid(format!("kafka.properties.{key}"), m))?;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if !is_dns_label(&self.cluster_name) {
            return Err(invalid(
                "clusterName",
                "must be a non-empty DNS label (a-z, 0-9, '-')",
            ));
        }
        if self.worker_threads == 0 {
            return Err(invalid("workerThreads", "must be at least 1"));
        }
        if self.kafka.bootstrap_servers.trim().is_empty() {
            return Err(invalid("kafka.bootstrapServers", "must not be empty"));
        }
        if self.kafka.max_in_flight_per_stream == 0 {
            return Err(invalid("kafka.maxInFlightPerStream", "must be at least 1"));
        }
        if self.kafka.max_message_bytes < 4096 {
            return Err(invalid("kafka.maxMessageBytes", "must be at least 4096"));
        }
        if self.kafka.oversize == OversizePolicy::DeadLetter {
            match &self.kafka.dead_letter_topic {
                None => {
                    return Err(invalid(
                        "kafka.deadLetterTopic",
                        "required when kafka.oversize is deadLetter (or set oversize: trim)",
                    ))
                }
                Some(t) if !is_topic(t) => {
                    return Err(invalid("kafka.deadLetterTopic", topic_rule()))
                }
                _ => {}
            }
        }
        if !is_dns_label(&self.checkpoint.namespace) {
            return Err(invalid("checkpoint.namespace", "must be a namespace name"));
        }
        if !is_dns_subdomain(&self.checkpoint.name) {
            return Err(invalid("checkpoint.name", "must be a ConfigMap name"));
        }
        self.leader_election.validate()?;
        if self.kubernetes.list_page_size == 0 {
            return Err(invalid("kubernetes.listPageSize", "must be at least 1"));
        }
        if self.channels.is_empty() {
            return Err(invalid("channels", "at least one channel is required"));
        }
        let channels = self.channels()?;
        let mut names = std::collections::HashSet::new();
        for (i, c) in channels.iter().enumerate() {
            if !names.insert(c.name.clone()) {
                return Err(invalid(
                    format!("channels[{i}].name"),
                    format!("duplicate channel name {:?}", c.name),
                ));
            }
        }
        Ok(())
    }

    /// The validated channels.
    pub fn channels(&self) -> Result<Vec<Channel>, ConfigError> {
        self.channels
            .iter()
            .enumerate()
            .map(|(i, c)| c.resolve(i, &self.cluster_name))
            .collect()
    }
}

impl ChannelConfig {
    fn resolve(&self, i: usize, cluster: &str) -> Result<Channel, ConfigError> {
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
                Scope::Selector(sel.clone())
            } else {
                Scope::Cluster
            }
        };
        if self.event_types.is_empty() && !self.forward_bookmarks {
            return Err(invalid(f("eventTypes"), "selects nothing to publish"));
        }
        let channel = Channel {
            name,
            operation_id,
            message,
            path,
            scope,
            label_selector: self.label_selector.clone(),
            field_selector: self.field_selector.clone(),
            forward_added: self.event_types.contains(&EventType::ADDED),
            forward_modified: self.event_types.contains(&EventType::MODIFIED),
            forward_deleted: self.event_types.contains(&EventType::DELETED),
            forward_bookmarks: self.forward_bookmarks,
            drop_managed_fields: self.drop_managed_fields,
            allow_secret_data: self.allow_secret_data,
            topic: self.topic.clone(),
            builtin,
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

/// Replaces `${NAME}` with the variable's value; `$${` stands for a literal `${`.
fn expand_env(value: &str, env: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        if let Some(after) = rest.strip_prefix("$${") {
            out.push_str("${");
            rest = after;
        } else if let Some(after) = rest.strip_prefix("${") {
            let end = after
                .find('}')
                .ok_or("unterminated ${ (write $${ for a literal ${)")?;
            let name = &after[..end];
            let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(format!("${{{name}}} is not an environment variable name"));
            }
            out.push_str(
                &env(name).ok_or_else(|| format!("environment variable {name} is not set"))?,
            );
            rest = &after[end + 1..];
        } else {
            out.push('$');
            rest = &rest[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn topic_rule() -> &'static str {
    "a topic name is 1-249 characters of a-z, A-Z, 0-9, '.', '_' and '-'"
}

fn is_topic(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 249
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "clusterName: prod\nkafka:\n  bootstrapServers: 127.0.0.1:9092\n  oversize: trim\ncheckpoint:\n  namespace: watchrelay\n";

    fn with_channels(channels: &str) -> Result<Config, ConfigError> {
        Config::parse(&format!("{BASE}channels:\n{channels}"))
    }

    fn err_field(r: Result<Config, ConfigError>) -> String {
        match r {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn accepts_a_full_channel_list() {
        let cfg = with_channels(
            "  - operationId: watchNamespacedPods\n    namespaces: [default, kube-system]\n  - operationId: watchNodes\n  - operationId: watchNamespacedServices\n    namespaceSelector: team=a\n  - path: /apis/example.com/v1/namespaces/{namespace}/widgets\n    name: widgets\n    allNamespaces: true\n    topic: \"{cluster}.{namespace}.{resource}\"\n",
        )
        .unwrap();
        let ch = cfg.channels().unwrap();
        assert_eq!(
            ch[0].scope,
            Scope::Namespaces(vec!["default".into(), "kube-system".into()])
        );
        assert_eq!(ch[1].scope, Scope::Cluster);
        assert_eq!(ch[2].message, "ServiceWatchEvent");
        assert_eq!(
            ch[3].topic_for("prod", None),
            "prod.all.widgets.example.com"
        );
        assert!(!ch[3].builtin);
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(
            err_field(with_channels(
                "  - operationId: watchPodz\n    namespaces: [a]\n"
            )),
            "channels[0].operationId"
        );
        assert_eq!(
            err_field(with_channels("  - operationId: watchNamespacedPods\n")),
            "channels[0].namespaces"
        );
        assert_eq!(
            err_field(with_channels("  - operationId: watchNodes\n  - operationId: watchNamespacedPods\n    namespaces: [Bad_NS]\n")),
            "channels[1].namespaces[0]"
        );
        assert_eq!(
            err_field(with_channels(
                "  - operationId: watchNodes\n    topic: \"{nope}\"\n"
            )),
            "channels[0].topic"
        );
        assert_eq!(
            err_field(with_channels("  - path: /api/v1/widgets\n")),
            "channels[0].name"
        );
        assert_eq!(
            err_field(with_channels(
                "  - operationId: watchNodes\n  - operationId: watchNodes\n"
            )),
            "channels[1].name"
        );
        assert_eq!(
            err_field(Config::parse("clusterName: prod\nkafka:\n  bootstrapServers: x:1\ncheckpoint:\n  namespace: w\nchannels:\n  - operationId: watchNodes\n")),
            "kafka.deadLetterTopic"
        );
        assert_eq!(
            err_field(Config::parse("clusterName: prod\nworkerThreads: 0\nkafka:\n  bootstrapServers: x:1\n  oversize: trim\ncheckpoint:\n  namespace: w\nchannels:\n  - operationId: watchNodes\n")),
            "workerThreads"
        );
        let leader = |yaml: &str| {
            Config::parse(&format!(
                "{BASE}leaderElection:\n{yaml}channels:\n  - operationId: watchNodes\n"
            ))
        };
        assert_eq!(
            err_field(leader("  enabled: true\n  leaseDurationSeconds: 10\n")),
            "leaderElection.leaseDurationSeconds"
        );
        assert_eq!(
            err_field(leader("  retryPeriodSeconds: 0\n")),
            "leaderElection.retryPeriodSeconds"
        );
        assert_eq!(
            err_field(leader("  name: Not_A_Name\n")),
            "leaderElection.name"
        );
        assert!(leader("  enabled: true\n  identity: relay-0\n").is_ok());
    }

    #[test]
    fn kafka_properties_take_secrets_from_the_environment() {
        let text = "clusterName: prod\nkafka:\n  bootstrapServers: x:1\n  oversize: trim\n  properties:\n    sasl.password: \"${KAFKA_PASSWORD}\"\n    sasl.username: \"a$b$${c}\"\ncheckpoint:\n  namespace: w\nchannels:\n  - operationId: watchNodes\n";
        let env = |n: &str| (n == "KAFKA_PASSWORD").then(|| "s3cret".to_string());
        let cfg = Config::parse_with_env(text, env).unwrap();
        assert_eq!(cfg.kafka.properties["sasl.password"], "s3cret");
        assert_eq!(cfg.kafka.properties["sasl.username"], "a$b${c}");
        let err = Config::parse_with_env(text, |_| None).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Invalid { field, message } if field == "kafka.properties.sasl.password" && message.contains("KAFKA_PASSWORD")),
            "{err}"
        );
        let bad = text.replace("${KAFKA_PASSWORD}", "${KAFKA PASSWORD}");
        assert_eq!(
            err_field(Config::parse_with_env(&bad, env)),
            "kafka.properties.sasl.password"
        );
    }

    #[test]
    fn unknown_fields_are_rejected_by_name() {
        let err = with_channels("  - operationId: watchNodes\n    topik: x\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("topik"), "{err}");
    }
}
