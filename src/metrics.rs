//! Prometheus metrics, registered once with the `watchrelay_` prefix.

use prometheus::{
    exponential_buckets, Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The prefix of every metric's name.
const PREFIX: &str = "watchrelay";

/// One metric as the relay registers it, whether or not it has a series yet: `/metrics` leaves
/// a labelled metric out until its first series, [`Metrics::described`] does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Described {
    /// Its full name, with the `watchrelay_` prefix (a histogram's series add `_bucket`, `_sum`
    /// and `_count` to it).
    pub name: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// Its label names, in order; empty for a metric of one series.
    pub labels: Vec<String>,
}

/// Every metric of the relay, shared by its streams, the checkpoint writer and `/metrics`.
pub struct Metrics {
    /// The Prometheus registry they are all registered with, under the `watchrelay_` prefix.
    pub registry: Registry,
    /// Watch events read, by stream and event type.
    pub events_received: IntCounterVec,
    /// Records Kafka acknowledged, by stream.
    pub events_published: IntCounterVec,
    /// Events not published because their type is not forwarded, by stream.
    pub events_filtered: IntCounterVec,
    /// Watch lines that could not be decoded, by stream.
    pub malformed_lines: IntCounterVec,
    /// Events larger than kafka.maxMessageBytes (or refused by the broker for size), by stream and
    /// action (dead_letter, trim).
    pub oversize: IntCounterVec,
    /// Delivery failures, by stream, kind (enqueue, delivery) and class (retriable,
    /// permanent, too_large).
    pub delivery_errors: IntCounterVec,
    /// Watch restarts, by stream and reason.
    pub watch_restarts: IntCounterVec,
    /// Relists after a 410 or on request, by stream.
    pub resyncs: IntCounterVec,
    /// DELETED events inferred during a resync, by stream.
    pub synthetic_deletes: IntCounterVec,
    /// Objects a delta resync did not publish again: members unchanged since the stream's
    /// acknowledged position, by stream.
    pub resync_unchanged: IntCounterVec,
    /// Resyncs that re-announced objects whole because a resourceVersion was not a decimal
    /// integer (a server that does not follow KEP-5504), by stream.
    pub resync_full_fallbacks: IntCounterVec,
    /// Starts that dropped the stream's saved position and listed instead of resuming, by
    /// stream and reason (query, route, scope): the changes made meanwhile collapse into
    /// the list.
    pub positions_dropped: IntCounterVec,
    /// API errors, by stream and kind.
    pub api_errors: IntCounterVec,
    /// Records sent and not yet acknowledged, by stream.
    pub in_flight: IntGaugeVec,
    /// 1 while the stream has synced and its watch is open.
    pub stream_up: IntGaugeVec,
    /// Unix time of the last line (event or bookmark) a stream read: `time() -` this is how
    /// stale the stream is.
    pub last_event: IntGaugeVec,
    /// Seconds from reading an event off the watch to Kafka's acknowledgement.
    pub publish_latency: HistogramVec,
    /// Checkpoint ConfigMap writes, by result (ok, error).
    pub checkpoint_writes: IntCounterVec,
    /// Bytes of ConfigMap written to the API by checkpoint writes.
    pub checkpoint_bytes: IntCounter,
    /// Objects each stream announced and has not seen leave (its membership).
    pub members: IntGaugeVec,
    /// Membership records read at the start of the last term.
    pub membership_restored: IntGauge,
    /// Seconds the last term's read of the membership topic took.
    pub membership_restore_seconds: prometheus::Gauge,
    /// 1 while the membership topic cannot be used, by reason (`not_compacted`, `retention`,
    /// `recreated`, `partitions`, `unauthorized`, `unavailable`).
    pub membership_topic_problem: IntGaugeVec,
    /// 1 while the relay waits for the topics it publishes to (missing and not to be created,
    /// too few partitions, not compacted where tombstones need it, not permitted).
    pub topics_unready: IntGauge,
    /// How many transactional ids Kafka refuses the relay's principal (exactly once): the terms
    /// under them relay nothing.
    pub transactional_ids_refused: IntGauge,
    /// Members whose retraction could not be addressed (written by an older version without a
    /// topic and key, of a channel that no longer exists).
    pub unretractable_members: IntCounter,
    /// Times the checkpoint ConfigMap was found older than what the relay last wrote (an etcd
    /// restore): every stream then resyncs whole.
    pub history_rewinds: IntCounter,
    /// 1 for a `watchStrategy: auto` channel whose namespace count calls for the other shape
    /// than the one it keeps.
    pub watch_strategy_switch_pending: IntGaugeVec,
    /// 1 while this replica relays (always, without leader election).
    pub leader: IntGauge,
    /// The configured bound on records awaiting acknowledgement per stream.
    pub in_flight_limit: IntGauge,
    /// Unix time of the last successful checkpoint write.
    pub checkpoint_written: IntGauge,
    /// Topics whose schema the schema registry has not taken yet (their streams wait).
    pub schema_registry_pending: IntGauge,
    /// Shards this replica owns (with sharding on).
    pub shards_owned: IntGauge,
    /// The configured number of shards (`sharding.shards`; 0 with sharding off).
    pub shards: IntGauge,
    /// Shard moves seen by this replica, by kind: `claimed`, `revoked` (handed over) or `lost`.
    pub shard_rebalances: IntCounterVec,
    /// Times this replica stopped producing for its shards because it could not prove it still
    /// owned them (the ownership deadline lapsed).
    pub shard_fences: IntCounter,
    /// Times this replica held its shards (took and committed nothing) because its ownership
    /// was unproven past the deadline; a fence follows only when none is proven in the margin.
    pub shard_holds: IntCounter,
    /// Seconds from a shard's claim to all of its streams watching.
    pub shard_takeover_seconds: prometheus::Histogram,
    /// Records produced per shard (hot shards show here).
    pub shard_records: IntCounterVec,
    /// Transactions ended, by outcome (`committed`, `aborted`), with exactly-once delivery.
    pub transactions: IntCounterVec,
    /// Seconds a transaction's commit took (its position records written, then committed).
    pub transaction_commit_seconds: prometheus::Histogram,
    /// Handovers that ended with records of the shard still undelivered: the replica's
    /// producer was purged, so none of them lands after the next owner's.
    pub shard_handover_purges: IntCounter,
    /// Seconds from a shard's revoke to its handover (its term stopped, drained and wrote).
    pub shard_handover_seconds: prometheus::Histogram,
    /// Watches this replica opened of collections fanned out to its shards (one per
    /// collection, reopened as a watch is).
    pub fanout_watches: IntCounter,
    /// Lists of collections fanned out to its shards (one serves every shard then waiting).
    pub fanout_lists: IntCounter,
    /// Parts of fanned-out collections let go for queueing too much while they read nothing.
    pub fanout_parts_let_go: IntCounter,
    /// Objects received in reads of fanned-out collections, by whose shard they are (`own`:
    /// this replica's, `other`: another's, received and dropped).
    pub fanout_objects: IntCounterVec,
    /// Collections fanned out to this replica whose reads the API server filters by shard.
    pub fanout_server_filtered: IntGauge,
}

/// `metric`, registered with `registry`.
fn registered<M: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: prometheus::Result<M>,
) -> M {
    let metric = metric.expect("static metric definitions are valid");
    registry
        .register(Box::new(metric.clone()))
        .expect("each metric is registered once");
    metric
}

impl Metrics {
    /// Every metric registered with a fresh registry, counters at zero.
    pub fn new() -> Self {
        let registry =
            Registry::new_custom(Some(PREFIX.into()), None).expect("a static prefix is valid");
        let counter = |name: &str, help: &str, labels: &[&str]| {
            registered(&registry, IntCounterVec::new(Opts::new(name, help), labels))
        };
        let gauge = |name: &str, help: &str| {
            registered(
                &registry,
                IntGaugeVec::new(Opts::new(name, help), &["stream"]),
            )
        };
        let publish_latency = registered(
            &registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "publish_latency_seconds",
                    "Seconds from watch arrival to Kafka acknowledgement",
                )
                .buckets(exponential_buckets(0.00025, 1.5, 24).expect("valid buckets")),
                &["stream"],
            ),
        );
        let single = |name: &str, help: &str| registered(&registry, IntGauge::new(name, help));
        let leader = single("leader", "1 while this replica holds the lease and relays");
        let in_flight_limit = single(
            "in_flight_limit",
            "Records that may await acknowledgement per stream (kafka.maxInFlightPerStream)",
        );
        let checkpoint_bytes = registered(
            &registry,
            IntCounter::new(
                "checkpoint_bytes_written_total",
                "Bytes of ConfigMap written to the API by checkpoint writes",
            ),
        );
        let membership_restored = single(
            "membership_records_restored",
            "Membership records read at the start of the last term",
        );
        let membership_restore_seconds = registered(
            &registry,
            prometheus::Gauge::new(
                "membership_restore_seconds",
                "Seconds the last read of the membership topic took",
            ),
        );
        let membership_topic_problem = registered(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "membership_topic_problem",
                    "1 while the membership topic cannot be used, by reason",
                ),
                &["reason"],
            ),
        );
        let topics_unready = registered(
            &registry,
            IntGauge::new(
                "topics_unready",
                "1 while the relay waits for the topics it publishes to",
            ),
        );
        let transactional_ids_refused = registered(
            &registry,
            IntGauge::new(
                "transactional_ids_refused",
                "Transactional ids Kafka refuses the relay's principal; the terms under them relay nothing",
            ),
        );
        let unretractable_members = registered(&registry, IntCounter::new(
            "unretractable_members_total",
            "Members of a removed channel whose topic and key were never recorded (older versions), dropped without a DELETED",
        ));
        let history_rewinds = registered(&registry, IntCounter::new(
            "history_rewinds_total",
            "Times the checkpoint ConfigMap went back behind what the relay last wrote (an etcd restore), making every stream resync whole",
        ));
        let fanout_watches = registered(
            &registry,
            IntCounter::new(
                "fanout_watches_total",
                "Watches opened of collections fanned out to this replica's shards",
            ),
        );
        let fanout_lists = registered(&registry, IntCounter::new(
            "fanout_lists_total",
            "Lists of collections fanned out to this replica's shards, each serving every shard then waiting",
        ));
        let fanout_parts_let_go = registered(&registry, IntCounter::new(
            "fanout_parts_let_go_total",
            "Parts of collections fanned out to this replica's shards let go for falling behind the shared watch (each resumes from its position)",
        ));
        let fanout_objects = counter(
            "fanout_objects_received_total",
            "Objects received in reads of collections fanned out to this replica's shards, by whose shard they are (own, other: received and dropped)",
            &["whose"],
        );
        let fanout_server_filtered = registered(&registry, IntGauge::new(
            "fanout_server_filtered",
            "Collections fanned out to this replica's shards whose reads the API server filters by shard (sharded list and watch)",
        ));
        let watch_strategy_switch_pending = registered(&registry, IntGaugeVec::new(
            Opts::new(
                "watch_strategy_switch_pending",
                "1 for a watchStrategy auto channel whose namespace count calls for the other shape than the one it keeps",
            ),
            &["channel"],
        ));
        let schema_registry_pending = single(
            "schema_registry_pending_topics",
            "Topics whose schema the schema registry has not taken yet: their streams wait",
        );
        let shards_owned = single("shards_owned", "Shards this replica owns");
        let shards = single(
            "shards",
            "The configured number of shards (sharding.shards)",
        );
        let shard_rebalances = counter(
            "shard_rebalances_total",
            "Shard moves seen by this replica, by kind (claimed, revoked, lost)",
            &["kind"],
        );
        let shard_fences = registered(
            &registry,
            IntCounter::new(
                "shard_fences_total",
                "Times this replica fenced its shards because no renewal proved its ownership within half the session's margin after its ownership deadline",
            ),
        );
        let shard_holds = registered(
            &registry,
            IntCounter::new(
                "shard_holds_total",
                "Times this replica held its shards (took and committed nothing for them) because its ownership deadline passed",
            ),
        );
        let shard_handover_purges = registered(
            &registry,
            IntCounter::new(
                "shard_handover_purges_total",
                "Handovers that ended with the shard's records undelivered: the replica's producer was purged so none lands after the next owner's",
            ),
        );
        let shard_handover_seconds = registered(
            &registry,
            prometheus::Histogram::with_opts(
                HistogramOpts::new(
                    "shard_handover_seconds",
                    "Seconds from a shard's revoke to its handover: its term stopped, drained and wrote",
                )
                .buckets(exponential_buckets(0.05, 2.0, 12).expect("valid buckets")),
            ),
        );
        let shard_takeover_seconds = registered(
            &registry,
            prometheus::Histogram::with_opts(
                HistogramOpts::new(
                    "shard_takeover_seconds",
                    "Seconds from a shard's claim to all of its streams watching",
                )
                .buckets(exponential_buckets(0.05, 2.0, 12).expect("valid buckets")),
            ),
        );
        let shard_records = counter(
            "shard_records_total",
            "Records produced for each shard",
            &["shard"],
        );
        let transactions = counter(
            "transactions_total",
            "Kafka transactions ended, by outcome, with exactly-once delivery",
            &["outcome"],
        );
        let transaction_commit_seconds = registered(
            &registry,
            prometheus::Histogram::with_opts(
                HistogramOpts::new(
                    "transaction_commit_seconds",
                    "Seconds a transaction's commit took, its positions written first",
                )
                .buckets(exponential_buckets(0.001, 2.0, 14).expect("valid buckets")),
            ),
        );
        let checkpoint_written = single(
            "checkpoint_last_write_timestamp_seconds",
            "Unix time of the last successful checkpoint write",
        );
        Self {
            events_received: counter(
                "events_received_total",
                "Watch events read",
                &["stream", "type"],
            ),
            events_published: counter(
                "events_published_total",
                "Records acknowledged by Kafka",
                &["stream"],
            ),
            events_filtered: counter(
                "events_filtered_total",
                "Events of types not forwarded",
                &["stream"],
            ),
            malformed_lines: counter(
                "malformed_lines_total",
                "Watch lines that could not be decoded",
                &["stream"],
            ),
            oversize: counter(
                "oversize_events_total",
                "Events too large to publish whole",
                &["stream", "action"],
            ),
            delivery_errors: counter(
                "delivery_errors_total",
                "Records Kafka did not take (kind=enqueue) or acknowledge (kind=delivery), by class: retriable, permanent, too_large",
                &["stream", "kind", "class"],
            ),
            watch_restarts: counter(
                "watch_restarts_total",
                "Watches reopened",
                &["stream", "reason"],
            ),
            positions_dropped: counter(
                "positions_dropped_total",
                "Starts that dropped the saved position and listed instead of resuming, by reason: query (the query changed), route (the topic or key changed), scope (a filtered stream's namespaces or selectors moved, and the namespaces the position covered could not be told)",
                &["stream", "reason"],
            ),
            resyncs: counter(
                "resyncs_total",
                "Relists after an expired resourceVersion or on request",
                &["stream"],
            ),
            synthetic_deletes: counter(
                "synthetic_deletes_total",
                "DELETED events inferred by a resync",
                &["stream"],
            ),
            resync_unchanged: counter(
                "resync_unchanged_total",
                "Objects a delta resync did not publish again (members unchanged since the position)",
                &["stream"],
            ),
            resync_full_fallbacks: counter(
                "resync_full_fallbacks_total",
                "Delta resyncs that re-announced objects because a resourceVersion was not a decimal integer",
                &["stream"],
            ),
            api_errors: counter(
                "api_errors_total",
                "Kubernetes API errors",
                &["stream", "kind"],
            ),
            checkpoint_writes: counter(
                "checkpoint_writes_total",
                "Checkpoint ConfigMap writes",
                &["result"],
            ),
            checkpoint_bytes,
            members: gauge(
                "members",
                "Objects the stream announced and has not seen leave",
            ),
            membership_restored,
            membership_restore_seconds,
            membership_topic_problem,
            topics_unready,
            transactional_ids_refused,
            unretractable_members,
            history_rewinds,
            watch_strategy_switch_pending,
            in_flight: gauge("in_flight", "Records awaiting acknowledgement"),
            stream_up: gauge("stream_up", "1 while the stream is synced and watching"),
            last_event: gauge(
                "stream_last_event_timestamp_seconds",
                "Unix time of the last event or bookmark the stream read",
            ),
            publish_latency,
            leader,
            in_flight_limit,
            checkpoint_written,
            schema_registry_pending,
            shards_owned,
            shards,
            shard_rebalances,
            shard_fences,
            shard_holds,
            shard_takeover_seconds,
            shard_records,
            transactions,
            transaction_commit_seconds,
            shard_handover_purges,
            shard_handover_seconds,
            fanout_watches,
            fanout_lists,
            fanout_parts_let_go,
            fanout_objects,
            fanout_server_filtered,
            registry,
        }
    }

    /// Removes every series labelled with `stream`: a stream that left for good (its namespace
    /// left the scope) must not keep its series, or label cardinality grows with namespace churn.
    pub fn forget_stream(&self, stream: &str) {
        for v in [
            &self.events_published,
            &self.events_filtered,
            &self.malformed_lines,
            &self.resyncs,
            &self.synthetic_deletes,
            &self.resync_unchanged,
            &self.resync_full_fallbacks,
        ] {
            let _ = v.remove_label_values(&[stream]);
        }
        for v in [
            &self.in_flight,
            &self.stream_up,
            &self.last_event,
            &self.members,
        ] {
            let _ = v.remove_label_values(&[stream]);
        }
        forget(&self.publish_latency, stream);
        forget(&self.events_received, stream);
        forget(&self.oversize, stream);
        forget(&self.delivery_errors, stream);
        forget(&self.watch_restarts, stream);
        forget(&self.positions_dropped, stream);
        forget(&self.api_errors, stream);
    }

    /// Every metric registered, series or not: its name, type and label names, in the order
    /// of the struct's fields. The documentation's drift test compares it with the metrics it
    /// lists.
    pub fn described(&self) -> Vec<Described> {
        use prometheus::core::Collector;
        use prometheus::proto::MetricType;
        // Destructured without `..`, so a metric added to the struct does not compile until it
        // is listed here too.
        let Metrics {
            registry: _,
            events_received,
            events_published,
            events_filtered,
            malformed_lines,
            oversize,
            delivery_errors,
            watch_restarts,
            resyncs,
            synthetic_deletes,
            resync_unchanged,
            resync_full_fallbacks,
            positions_dropped,
            api_errors,
            in_flight,
            stream_up,
            last_event,
            publish_latency,
            checkpoint_writes,
            checkpoint_bytes,
            members,
            membership_restored,
            membership_restore_seconds,
            membership_topic_problem,
            topics_unready,
            transactional_ids_refused,
            unretractable_members,
            history_rewinds,
            watch_strategy_switch_pending,
            leader,
            in_flight_limit,
            checkpoint_written,
            schema_registry_pending,
            shards_owned,
            shards,
            shard_rebalances,
            shard_fences,
            shard_holds,
            shard_takeover_seconds,
            shard_records,
            transactions,
            transaction_commit_seconds,
            shard_handover_purges,
            shard_handover_seconds,
            fanout_watches,
            fanout_lists,
            fanout_parts_let_go,
            fanout_objects,
            fanout_server_filtered,
        } = self;
        let collectors: [&dyn Collector; 48] = [
            events_received,
            events_published,
            events_filtered,
            malformed_lines,
            oversize,
            delivery_errors,
            watch_restarts,
            resyncs,
            synthetic_deletes,
            resync_unchanged,
            resync_full_fallbacks,
            positions_dropped,
            api_errors,
            in_flight,
            stream_up,
            last_event,
            publish_latency,
            checkpoint_writes,
            checkpoint_bytes,
            members,
            membership_restored,
            membership_restore_seconds,
            membership_topic_problem,
            topics_unready,
            transactional_ids_refused,
            unretractable_members,
            history_rewinds,
            watch_strategy_switch_pending,
            leader,
            in_flight_limit,
            checkpoint_written,
            schema_registry_pending,
            shards_owned,
            shards,
            shard_rebalances,
            shard_fences,
            shard_holds,
            shard_takeover_seconds,
            shard_records,
            transactions,
            transaction_commit_seconds,
            shard_handover_purges,
            shard_handover_seconds,
            fanout_watches,
            fanout_lists,
            fanout_parts_let_go,
            fanout_objects,
            fanout_server_filtered,
        ];
        collectors
            .into_iter()
            .flat_map(|c| {
                c.desc()
                    .into_iter()
                    .zip(c.collect())
                    .map(|(desc, family)| Described {
                        name: format!("{PREFIX}_{}", desc.fq_name),
                        kind: match family.get_field_type() {
                            MetricType::COUNTER => "counter",
                            MetricType::GAUGE => "gauge",
                            MetricType::HISTOGRAM => "histogram",
                            MetricType::SUMMARY => "summary",
                            MetricType::UNTYPED => "untyped",
                        },
                        labels: desc.variable_labels.clone(),
                    })
            })
            .collect()
    }

    /// Every metric in the Prometheus text format, as `/metrics` serves it.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("encoding to a Vec cannot fail");
        out
    }
}

/// Removes every series of `vec` whose `stream` label is `stream`, whatever its other labels:
/// prometheus removes a series only by its whole label set, so the sets are read off the vector
/// itself (a copy of each series, fine for a stream that leaves).
fn forget<T: prometheus::core::MetricVecBuilder>(
    vec: &prometheus::core::MetricVec<T>,
    stream: &str,
) {
    use prometheus::core::Collector;
    for family in vec.collect() {
        for series in family.get_metric() {
            let labels: std::collections::HashMap<&str, &str> = series
                .get_label()
                .iter()
                .map(|l| (l.name(), l.value()))
                .collect();
            if labels.get("stream") == Some(&stream) {
                let _ = vec.remove(&labels);
            }
        }
    }
}

/// The current Unix time in seconds, for timestamp gauges.
pub fn unix_now() -> i64 {
    jiff::Timestamp::now().as_second()
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgetting_a_stream_removes_its_series_whatever_their_other_labels() {
        let m = Metrics::new();
        for stream in ["a", "b"] {
            m.watch_restarts
                .with_label_values(&[stream, "stalled"])
                .inc();
            m.watch_restarts
                .with_label_values(&[stream, "expired"])
                .inc();
            m.events_published.with_label_values(&[stream]).inc();
        }
        m.forget_stream("a");
        let text = String::from_utf8(m.render()).unwrap();
        assert!(!text.contains("stream=\"a\""), "{text}");
        assert_eq!(text.matches("stream=\"b\"").count(), 3, "{text}");
    }
}
