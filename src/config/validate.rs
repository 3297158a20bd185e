//! Validation of the settings beyond their types: names Kubernetes and Kafka accept, and the
//! producer properties that would weaken delivery. Every error names the field.

use super::syntax::{is_dns_label, is_dns_subdomain};
use super::{
    invalid, is_topic, kafka, topic_rule, topic_rule_for, ConfigError, Delivery, File,
    OversizePolicy, CHECKPOINT_RESERVE, RELEASE_RESERVE,
};

impl File {
    /// Checks everything but the channels, which are validated as they are resolved.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
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
        for (key, value) in &self.kafka.properties {
            kafka::check_property(key, value)
                .map_err(|m| invalid(format!("kafka.properties.{key}"), m))?;
        }
        for key in self.kafka.properties.keys() {
            if let Some(why) = breaks_the_group(key) {
                return Err(invalid(format!("kafka.properties.{key}"), why));
            }
        }
        if !self.kafka.unsafe_producer_overrides {
            for (key, value) in &self.kafka.properties {
                if let Some(why) = weakens_delivery(key, value) {
                    return Err(invalid(
                        format!("kafka.properties.{key}"),
                        format!("{why}; set kafka.unsafeProducerOverrides: true to allow it"),
                    ));
                }
            }
        }
        let minimum = (CHECKPOINT_RESERVE + RELEASE_RESERVE).as_secs() + 1;
        if self.shutdown_timeout_seconds < minimum {
            return Err(invalid(
                "shutdownTimeoutSeconds",
                format!(
                    "must be at least {minimum}: the final checkpoint write and the Lease release take up to {} of it",
                    minimum - 1
                ),
            ));
        }
        let zero = [
            ("checkpoint.intervalMs", self.checkpoint.interval_ms),
            (
                "kubernetes.watchTimeoutSeconds",
                u64::from(self.kubernetes.watch_timeout_seconds),
            ),
            (
                "kubernetes.backoffInitialMs",
                self.kubernetes.backoff_initial_ms,
            ),
            (
                "kubernetes.watchIdleTimeoutSeconds",
                u64::from(self.kubernetes.watch_idle_timeout_seconds),
            ),
        ];
        if let Some((field, _)) = zero.iter().find(|(_, v)| *v == 0) {
            return Err(invalid(*field, "must be at least 1"));
        }
        if self.kubernetes.backoff_max_ms < self.kubernetes.backoff_initial_ms {
            return Err(invalid(
                "kubernetes.backoffMaxMs",
                "must be at least backoffInitialMs",
            ));
        }
        if self.kafka.delivery == Delivery::ExactlyOnce {
            if !(10..=60_000).contains(&self.kafka.commit_interval_ms) {
                return Err(invalid(
                    "kafka.commitIntervalMs",
                    "must be between 10 and 60000",
                ));
            }
            if self
                .kafka
                .properties
                .get("isolation.level")
                .is_some_and(|v| v != "read_committed")
            {
                return Err(invalid(
                    "kafka.properties.isolation.level",
                    "must be read_committed with delivery: exactlyOnce: the relay reads its membership topic back, and an aborted transaction's members and positions must not count",
                ));
            }
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
        let topics = &self.kafka.topics;
        if topics.partitions.is_some_and(|p| p < 1) {
            return Err(invalid("kafka.topics.partitions", "must be at least 1"));
        }
        if topics.replication_factor.is_some_and(|r| r < 1) {
            return Err(invalid(
                "kafka.topics.replicationFactor",
                "must be at least 1",
            ));
        }
        if !is_dns_label(&self.checkpoint.namespace) {
            return Err(invalid("checkpoint.namespace", "must be a namespace name"));
        }
        if !is_dns_subdomain(&self.checkpoint.name) {
            return Err(invalid("checkpoint.name", "must be a ConfigMap name"));
        }
        // Every shard's ConfigMap is named after it: the longest must be a name too.
        let last = super::ShardingConfig::configmap(
            &self.checkpoint.name,
            self.sharding.shards.saturating_sub(1),
        );
        if self.sharding.enabled && !is_dns_subdomain(&last) {
            return Err(invalid(
                "checkpoint.name",
                format!("too long with sharding on: shard ConfigMaps such as {last} must be ConfigMap names (at most 253 characters)"),
            ));
        }
        let membership = &self.checkpoint.membership;
        let topic = membership.topic(&self.cluster_name);
        if !is_topic(&topic) {
            return Err(invalid(
                "checkpoint.membership.topic",
                topic_rule_for(&topic),
            ));
        }
        if membership.partitions.is_some_and(|p| p < 1) {
            return Err(invalid(
                "checkpoint.membership.partitions",
                "must be at least 1",
            ));
        }
        if membership.replication_factor.is_some_and(|r| r < 1) {
            return Err(invalid(
                "checkpoint.membership.replicationFactor",
                "must be at least 1",
            ));
        }
        self.leader_election.validate()?;
        self.sharding.validate(&self.cluster_name)?;
        if self.sharding.enabled {
            // Left unset, it is the session's margin (`Config::producer_kafka`); set to 0 or
            // above, a record queued by a frozen replica could land after its shard's next
            // owner's.
            let limit = self.sharding.delivery_timeout().as_millis();
            for key in ["message.timeout.ms", "delivery.timeout.ms"] {
                let Some(value) = self.kafka.properties.get(key) else {
                    continue;
                };
                let ms = value.trim().parse::<u128>().ok();
                if ms.is_none_or(|ms| ms == 0 || ms > limit) {
                    return Err(invalid(
                        format!("kafka.properties.{key}"),
                        format!("with sharding on, a record must expire before another replica may own its shard: from 1 to sharding.sessionTimeoutMs - sharding.ownershipDeadlineMs ({limit} ms); leave it unset to get that"),
                    ));
                }
            }
        }
        if self.sharding.enabled && self.leader_election.enabled {
            return Err(invalid(
                "sharding.enabled",
                "sharding replaces leader election: replicas share the streams instead of one relaying them all; set leaderElection.enabled: false",
            ));
        }
        if self.kubernetes.list_page_size == 0 {
            return Err(invalid("kubernetes.listPageSize", "must be at least 1"));
        }
        if self.kubernetes.max_concurrent_syncs == 0 {
            return Err(invalid(
                "kubernetes.maxConcurrentSyncs",
                "must be at least 1",
            ));
        }
        if self.channels.is_empty() {
            return Err(invalid("channels", "at least one channel is required"));
        }
        Ok(())
    }
}

/// Why a producer property would break the delivery guarantee, if it would: the relay needs
/// every record acknowledged by all in-sync replicas, written once and in order per partition,
/// retried until delivered, and the same key always in the same partition.
fn weakens_delivery(key: &str, value: &str) -> Option<String> {
    let v = value.trim().to_ascii_lowercase();
    match key {
        "acks" | "request.required.acks" if v != "all" && v != "-1" => {
            Some("the relay needs acks=all".into())
        }
        "enable.idempotence" if v != "true" => {
            Some("the relay needs the idempotent producer".into())
        }
        "message.timeout.ms" | "delivery.timeout.ms" if v != "0" => Some(
            "a delivery timeout drops records in an outage; the relay retries until delivered (0)"
                .into(),
        ),
        "max.in.flight.requests.per.connection" | "max.in.flight"
            if v.parse::<u32>().map_or(true, |n| n > 5) =>
        {
            Some("more than 5 requests in flight can reorder records".into())
        }
        "message.send.max.retries" | "retries" if v == "0" => {
            Some("without retries a transient error loses records".into())
        }
        "partitioner" | "partitioner_cb" => Some(
            "another partitioner moves keys to other partitions, breaking per-key order".into(),
        ),
        "bootstrap.servers" | "metadata.broker.list" => {
            Some("set kafka.bootstrapServers instead".into())
        }
        "transactional.id" => Some(
            "the relay sets it itself, one per term, with kafka.delivery: exactlyOnce".into(),
        ),
        "allow.auto.create.topics" if v != "false" => Some(
            "a topic the broker creates on demand gets its defaults (a membership topic that is not compacted); the relay creates the topics it needs"
                .into(),
        ),
        _ => None,
    }
}

/// Why a consumer-group property would break the shard group or the membership topic's reading,
/// if it would. `kafka.properties` reach both consumers (the shard group's and the membership
/// reader's), under the settings each sets itself.
///
/// Refused, whatever the value:
/// - `group.instance.id`: static membership. Every replica gets the same id, so each one that
///   joins fences the one before (fatal under the classic protocol, the newcomer refused under
///   KIP-848): shards end fenced or with nobody.
/// - `group.remote.assignor`: under `groupProtocol: consumer` the broker assigns the shards; the
///   relay counts on its default, sticky assignor (every moved shard is a handover), and a name
///   the broker does not know keeps every replica out of the group.
/// - `session.timeout.ms`, `heartbeat.interval.ms`, `partition.assignment.strategy`,
///   `group.protocol.type`: the relay sets them on the shard group under the classic protocol
///   (from `sharding.sessionTimeoutMs`), so a value here does nothing there; under
///   `groupProtocol: consumer` the Kafka client refuses to create the group's consumer with any
///   of them set.
/// - `group.protocol`: the relay sets it on the shard group from `sharding.groupProtocol`.
///
/// Left alone, being harmless: `group.id`, `enable.auto.commit`, `enable.auto.offset.store`,
/// `enable.partition.eof` and `max.poll.interval.ms` (each consumer sets its own after the
/// properties), `auto.offset.reset` (the membership reader starts at an explicit offset; the shard
/// group reads no records), `isolation.level` (checked with exactly-once delivery, where the membership topic must
/// be read committed).
fn breaks_the_group(key: &str) -> Option<&'static str> {
    match key {
        "group.instance.id" => Some(
            "static group membership gives every replica the same instance id, so the replicas fence each other out of the shard group; remove it",
        ),
        "group.remote.assignor" => Some(
            "the shard group relies on the broker's default (sticky) assignor; another moves shards needlessly and an unknown one keeps every replica out; remove it",
        ),
        "session.timeout.ms" | "heartbeat.interval.ms" => Some(
            "the shard group's session is set by sharding.sessionTimeoutMs (classic protocol) or by the broker (groupProtocol: consumer, where the Kafka client refuses this property); remove it",
        ),
        "partition.assignment.strategy" | "group.protocol.type" => Some(
            "the relay sets the shard group's assignment itself (and under groupProtocol: consumer the Kafka client refuses this property); remove it",
        ),
        "group.protocol" => Some("set sharding.groupProtocol instead"),
        _ => None,
    }
}
