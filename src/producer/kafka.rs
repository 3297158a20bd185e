//! The idempotent librdkafka producer every stream shares, and its configuration.
//!
//! Delivery reports are served on the runtime that sends the records ([`Kafka::start`]'s
//! pump), not on a polling thread of their own: a report then reaches its stream's inbox
//! without waking another thread, and librdkafka frees each delivered record on the thread that
//! allocated it, not on another thread while this one allocates. The pump serves every
//! millisecond while records are in flight and reports come, every [`QUIET_TICK`] at the most
//! while none come (a broker outage), and otherwise sleeps until the next send (or
//! [`IDLE_TICK`], for librdkafka's error events).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{
    BaseProducer, BaseRecord, DeliveryResult, Producer as _, ProducerContext, PurgeConfig,
};
use rdkafka::{ClientContext, Message as _};

use super::Record;
use super::{DeliveryError, ErrorClass, FlushError, ProduceError, Producer, Receipt, Refused};
use crate::config::{redact, KafkaConfig};

/// How often the pump serves reports while records are in flight: the most a report waits
/// after librdkafka has it.
const BUSY_TICK: Duration = Duration::from_millis(1);
/// How often the pump serves librdkafka's events while nothing is in flight.
const IDLE_TICK: Duration = Duration::from_millis(100);
/// Busy ticks without a report before the pump slows down: far past a broker's usual
/// acknowledgement, so only an outage or a stalled partition stretches the tick.
const QUIET_AFTER: u32 = 32;
/// The slowest busy tick, reached by doubling while no report comes: an outage costs the pump
/// about a hundred wake-ups a second, not a thousand, and a report that comes after it waits
/// at most this long. Any report or send makes the tick [`BUSY_TICK`] again.
const QUIET_TICK: Duration = Duration::from_millis(10);
/// The most events one serving takes, so a flood of reports cannot hold the runtime's thread.
const EVENTS_PER_SERVE: usize = 64;
/// The longest a flush waits before it looks again whether everything handed over was delivered,
/// if no serving of the pump wakes it first (see [`Kafka::drain`]).
const DRAIN_TICK: Duration = Duration::from_millis(10);

/// librdkafka's context: turns its delivery callback into a [`Report`](super::Report).
#[derive(Default)]
pub struct Reporting {
    /// Records handed to librdkafka so far (counted before the hand-over, taken back if it
    /// refused one), so never fewer than `reported`.
    handed: AtomicU64,
    /// Delivery reports handed on so far: tells the pump whether a poll found any.
    reported: AtomicU64,
}

impl Reporting {
    /// Whether a record handed over still waits for its report to be handed on: two loads, no
    /// call into librdkafka (whose flush wakes every broker thread).
    fn awaited(&self) -> bool {
        self.handed.load(Ordering::Acquire) != self.reported.load(Ordering::Acquire)
    }
}

impl ClientContext for Reporting {}

impl ProducerContext for Reporting {
    type DeliveryOpaque = Box<Receipt>;

    fn delivery(&self, result: &DeliveryResult<'_>, receipt: Box<Receipt>) {
        if let Ok(m) = result {
            receipt.witnessed(m.topic(), m.partition(), m.offset());
        }
        receipt.report(match result {
            Ok(_) => Ok(()),
            Err((e, msg)) if is_too_large(e) => Err(DeliveryError::TooLarge {
                key: msg.key().map(<[u8]>::to_vec),
                value: msg.payload().map(<[u8]>::to_vec),
            }),
            Err((e, msg)) => Err(DeliveryError::Failed(classify(e, msg.topic()))),
        });
        // Counted once handed on, so a drain that finds the counts equal finds every report in
        // its stream's inbox.
        self.reported.fetch_add(1, Ordering::Release);
    }
}

/// A Kafka error of a record for `topic` by what it takes to get past it. Only codes that
/// cannot pass by themselves are permanent; anything else (timeouts, transport, leadership) is
/// retriable. The message says what an operator does about a missing ACL or topic.
fn classify(e: &KafkaError, topic: &str) -> ProduceError {
    use RDKafkaErrorCode as C;
    let class = match e.rdkafka_error_code() {
        _ if is_too_large(e) => ErrorClass::TooLarge,
        Some(
            C::TopicAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::TransactionalIdAuthorizationFailed
            | C::SaslAuthenticationFailed
            | C::UnknownTopicOrPartition
            | C::UnknownTopic
            | C::InvalidRecord
            | C::InvalidMessage
            | C::InvalidMessageSize
            | C::InvalidRequiredAcks
            | C::UnsupportedVersion
            | C::UnsupportedForMessageFormat
            | C::InvalidConfig
            | C::Fatal
            | C::Fenced
            | C::OutOfOrderSequenceNumber
            | C::InvalidProducerEpoch,
        ) => ErrorClass::Permanent,
        _ => ErrorClass::Retriable,
    };
    let hint = match e.rdkafka_error_code() {
        Some(C::TopicAuthorizationFailed) => {
            format!("; grant the relay's principal the ACLs Write and Describe on topic {topic}")
        }
        Some(C::ClusterAuthorizationFailed) => {
            "; grant the relay's principal the ACL IdempotentWrite on the cluster".into()
        }
        Some(C::UnknownTopicOrPartition | C::UnknownTopic) => {
            format!(
                "; create topic {topic} (the relay never has a channel topic created on demand)"
            )
        }
        _ => String::new(),
    };
    ProduceError {
        class,
        message: format!("{e}{hint}"),
    }
}

fn is_too_large(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::MessageBatchTooLarge)
    )
}

/// The idempotent Kafka producer every stream of a process shares.
///
/// Its delivery reports are served on the runtime by the pump [`Kafka::start`] spawns, and by a
/// flush or a commit while it waits for them.
pub struct Kafka {
    producer: BaseProducer<Reporting>,
    /// Told of every send, so an idle pump wakes for its report.
    sent: Arc<tokio::sync::Notify>,
    /// Counts the servings that handed reports on, for a flush waiting for the last one.
    served: Served,
}

impl Kafka {
    /// A producer with `cfg`, and the task on the current tokio runtime that serves its delivery
    /// reports for as long as the producer lives. The error never contains a property's value.
    pub fn start(cfg: &KafkaConfig) -> Result<Arc<Self>, String> {
        let kafka = Arc::new(Self::new(cfg)?);
        tokio::spawn(pump(Arc::downgrade(&kafka), kafka.sent.clone()));
        Ok(kafka)
    }

    /// A producer with `cfg` whose reports nothing serves but a flush: for the topic admin and
    /// the membership topic's reader (records are sent through [`Kafka::start`]'s, which adds
    /// the pump). The error never contains a property's value.
    pub fn new(cfg: &KafkaConfig) -> Result<Self, String> {
        Self::create(cfg).map_err(|e| match e {
            KafkaError::ClientConfig(_, message, key, value) => {
                format!("kafka property {key}: {}", redact(&message, &value))
            }
            e => cfg
                .properties
                .values()
                .fold(e.to_string(), |m, v| redact(&m, v)),
        })
    }

    fn create(cfg: &KafkaConfig) -> Result<Self, KafkaError> {
        Ok(Self {
            producer: cfg
                .client_config()
                .create_with_context(Reporting::default())?,
            sent: Arc::default(),
            served: Served::default(),
        })
    }

    /// Hands every delivery report librdkafka has ready to its stream's inbox, without waiting.
    /// Returns whether records are still in flight, and whether any report was handed on.
    fn serve(&self) -> (bool, bool) {
        let reported = &self.producer.context().reported;
        let start = reported.load(Ordering::Relaxed);
        for _ in 0..EVENTS_PER_SERVE {
            let (before, queued) = (
                reported.load(Ordering::Relaxed),
                self.producer.in_flight_count(),
            );
            self.producer.poll(Duration::ZERO);
            // Taking any event shortens the queue, a report also counts: a log line taken
            // (librdkafka queues them with the reports) does not end the serving, an empty
            // poll does. A send meanwhile may end it early, as an empty poll would.
            if reported.load(Ordering::Relaxed) == before
                && self.producer.in_flight_count() >= queued
            {
                break;
            }
        }
        let served = reported.load(Ordering::Relaxed) != start;
        if served {
            self.served.one_more();
        }
        (self.producer.in_flight_count() > 0, served)
    }

    /// Waits until every record handed over was delivered and its report served, up to
    /// `timeout`; whether it was. Blocks.
    ///
    /// rdkafka's own flush waits in slices of 100 ms (its poll returns only at its deadline),
    /// so a flush with anything in flight took 100 ms at least, a whole commit interval for a
    /// transaction. This one looks again after each serving that handed reports on (the pump's,
    /// or its own), or after [`DRAIN_TICK`] at most: it wakes with the reports, not on a clock
    /// of its own. A look counts the reports against the records handed over; only once they
    /// match does it ask librdkafka (a flush without a wait, which wakes the producer's broker
    /// threads), which frees a record just after its report was handed on.
    fn drain(&self, timeout: Duration) -> bool {
        let until = std::time::Instant::now() + timeout;
        loop {
            let seen = self.served.count();
            // Every record's report handed on. Not the queue's length: that counts librdkafka's
            // other events too (its logs), which can keep it above zero.
            if !self.producer.context().awaited() && self.producer.flush(Duration::ZERO).is_ok() {
                return true;
            }
            let now = std::time::Instant::now();
            if now >= until {
                return false;
            }
            // Served here too; a serving of reports wakes any other drain of this producer.
            if self.serve().1 {
                continue;
            }
            self.served.wait(seen, (until - now).min(DRAIN_TICK));
        }
    }
}

/// How many servings handed reports on, and the wake-up of a [`Kafka::drain`] waiting for one.
#[derive(Default)]
struct Served {
    /// The servings so far, and how many drains wait (a serving wakes none when none waits).
    state: std::sync::Mutex<(u64, usize)>,
    wake: std::sync::Condvar,
}

impl Served {
    fn count(&self) -> u64 {
        self.state.lock().expect("served lock poisoned").0
    }

    fn one_more(&self) {
        let mut state = self.state.lock().expect("served lock poisoned");
        state.0 += 1;
        if state.1 > 0 {
            self.wake.notify_all();
        }
    }

    /// Waits until a serving after the `seen`th, or `most`.
    fn wait(&self, seen: u64, most: Duration) {
        let mut state = self.state.lock().expect("served lock poisoned");
        state.1 += 1;
        let (mut state, _) = self
            .wake
            .wait_timeout_while(state, most, |s| s.0 == seen)
            .expect("served lock poisoned");
        state.1 -= 1;
    }
}

/// Serves `kafka`'s delivery reports until it is dropped; `sent` is its send notification.
///
/// States: *busy* while records are in flight (serve, sleep [`BUSY_TICK`], serve again);
/// *quiet* while records are in flight but no report came for [`QUIET_AFTER`] ticks (an outage:
/// the tick doubles up to [`QUIET_TICK`], and a send or a report makes it busy again); *idle*
/// otherwise (sleep until a send or [`IDLE_TICK`]). A send while busy leaves a wake-up stored,
/// so the first idle or quiet wait after it returns at once and serves again: no report is left
/// waiting for the idle tick. The pump holds the producer only while serving, so dropping the
/// last other reference drops the producer where it is dropped, and the pump ends within a tick.
async fn pump(kafka: Weak<Kafka>, sent: Arc<tokio::sync::Notify>) {
    let (mut empty, mut tick) = (0u32, BUSY_TICK);
    loop {
        let Some((busy, served)) = kafka.upgrade().map(|k| k.serve()) else {
            return;
        };
        if !busy || served {
            (empty, tick) = (0, BUSY_TICK);
        } else if empty < QUIET_AFTER {
            empty += 1;
        } else {
            tick = (tick * 2).min(QUIET_TICK);
        }
        if !busy {
            let _ = tokio::time::timeout(IDLE_TICK, sent.notified()).await;
        } else if tick == BUSY_TICK {
            tokio::time::sleep(BUSY_TICK).await;
        } else if tokio::time::timeout(tick, sent.notified()).await.is_ok() {
            (empty, tick) = (0, BUSY_TICK);
        }
    }
}

/// Why a transactional call failed, and what it takes to get past it.
#[derive(Debug)]
pub(crate) struct TxnError {
    pub(crate) message: String,
    /// The producer can do nothing more (fenced by a newer one with its id, say).
    pub(crate) fatal: bool,
    /// The call may be made again as it is (its outcome is not known yet: a commit that timed
    /// out may still be committed).
    pub(crate) retriable: bool,
    /// Kafka refused the relay's principal (an ACL on the transactional id, the cluster or a
    /// topic, or its credentials): it fails again until an operator acts.
    pub(crate) denied: bool,
}

impl TxnError {
    /// An error after which the transaction is aborted.
    pub(crate) fn abortable(message: &str) -> Self {
        Self {
            message: message.to_string(),
            fatal: false,
            retriable: false,
            denied: false,
        }
    }

    /// Kafka refused the relay's principal.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn denied(message: &str) -> Self {
        Self {
            denied: true,
            ..Self::abortable(message)
        }
    }
}

impl From<KafkaError> for TxnError {
    fn from(e: KafkaError) -> Self {
        let (fatal, retriable) = match &e {
            KafkaError::Transaction(t) => {
                (t.is_fatal(), t.is_retriable() && !t.txn_requires_abort())
            }
            _ => (false, false),
        };
        use RDKafkaErrorCode as C;
        let denied = matches!(
            e.rdkafka_error_code(),
            Some(
                C::TransactionalIdAuthorizationFailed
                    | C::ClusterAuthorizationFailed
                    | C::TopicAuthorizationFailed
                    | C::SaslAuthenticationFailed
            )
        );
        Self {
            message: e.to_string(),
            fatal,
            retriable,
            denied,
        }
    }
}

/// The transactional calls of a producer created with a `transactional.id`. Each blocks.
impl Kafka {
    pub(crate) fn init_transactions(&self, timeout: Duration) -> Result<(), TxnError> {
        Ok(self.producer.init_transactions(timeout)?)
    }

    pub(crate) fn begin_transaction(&self) -> Result<(), TxnError> {
        Ok(self.producer.begin_transaction()?)
    }

    /// Waits for every record handed over (their reports served) up to `timeout`, then
    /// commits, the commit's request given `timeout` of its own. Records still undelivered
    /// when the wait ran out fail the commit before it is asked.
    pub(crate) fn commit_transaction(&self, timeout: Duration) -> Result<(), TxnError> {
        if !self.drain(timeout) {
            return Err(TxnError::abortable(&format!(
                "records of the transaction were not acknowledged within {timeout:?}"
            )));
        }
        Ok(self.producer.commit_transaction(timeout)?)
    }

    pub(crate) fn abort_transaction(&self, timeout: Duration) -> Result<(), TxnError> {
        Ok(self.producer.abort_transaction(timeout)?)
    }
}

/// The consumer group the relay's readers of the membership topic name: they never join it or
/// commit in it, but an ACL may ask for Read on it.
pub(crate) const MEMBERSHIP_GROUP: &str = "watchrelay-membership";

/// Why the outcome of a transaction could not be read.
#[derive(Debug)]
pub(crate) struct Unread {
    pub(crate) message: String,
    /// Asking again cannot help (no permission to read, the record gone): only a restart from
    /// the committed positions can.
    pub(crate) fatal: bool,
}

/// Whether the record Kafka wrote at `offset` of `topic`'s `partition` is committed: a
/// `read_committed` reader (with `cfg`'s connection, in the membership reader's group, which
/// it never joins or commits in) positioned there first sees it, or, its transaction aborted,
/// skips it. Only once the transaction is settled (a newer producer under its id was
/// initialized) is the answer final. Blocks, up to `timeout`, while records before it are still
/// in open transactions.
pub(crate) fn committed_at(
    cfg: &KafkaConfig,
    topic: &str,
    partition: i32,
    offset: i64,
    timeout: Duration,
) -> Result<bool, Unread> {
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    use rdkafka::{Offset, TopicPartitionList};
    let transient = |e: KafkaError| Unread {
        fatal: false,
        message: e.to_string(),
    };
    let mut settings = cfg.connection_config();
    settings
        .remove("transactional.id")
        .remove("transaction.timeout.ms")
        .set("group.id", MEMBERSHIP_GROUP)
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        // Gone (retention, compaction): never read past it as if it were aborted.
        .set("auto.offset.reset", "error")
        .set("isolation.level", "read_committed");
    let consumer: BaseConsumer = settings.create().map_err(transient)?;
    let mut at = TopicPartitionList::new();
    at.add_partition_offset(topic, partition, Offset::Offset(offset))
        .map_err(transient)?;
    consumer.assign(&at).map_err(transient)?;
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            // The first committed record at or past it.
            Some(Ok(m)) => return Ok(m.offset() == offset),
            Some(Err(KafkaError::PartitionEOF(_))) => {
                let position = consumer.position().ok().and_then(|p| {
                    p.find_partition(topic, partition)
                        .and_then(|p| p.offset().to_raw())
                });
                // Read to the last stable offset past it without seeing it: aborted.
                if position.is_some_and(|p| p > offset) {
                    return Ok(false);
                }
            }
            Some(Err(e)) => {
                use RDKafkaErrorCode as C;
                let fatal = matches!(
                    e.rdkafka_error_code(),
                    Some(
                        C::TopicAuthorizationFailed
                            | C::GroupAuthorizationFailed
                            | C::ClusterAuthorizationFailed
                            | C::OffsetOutOfRange
                            | C::AutoOffsetReset
                    )
                );
                return Err(Unread {
                    fatal,
                    message: e.to_string(),
                });
            }
            None => {}
        }
    }
    Err(Unread {
        fatal: false,
        message: format!(
            "{topic} [{partition}] was not readable past offset {offset} within {timeout:?}"
        ),
    })
}

impl Producer for Kafka {
    fn send(&self, rec: &Record, receipt: Box<Receipt>) -> Result<(), Refused> {
        let mut headers = OwnedHeaders::new_with_capacity(rec.headers.len());
        for (key, value) in rec.headers.iter() {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        let mut record = BaseRecord::<[u8], [u8], _>::with_opaque_to(&rec.topic, receipt)
            .key(rec.key.as_bytes())
            .headers(headers);
        if let Some(p) = rec.partition {
            record = record.partition(p);
        }
        if !rec.tombstone {
            record = record.payload(&rec.value);
        }
        let handed = &self.producer.context().handed;
        handed.fetch_add(1, Ordering::Release);
        let sent = self.producer.send(record);
        if sent.is_err() {
            handed.fetch_sub(1, Ordering::Release);
        }
        match sent {
            Ok(()) => {
                self.sent.notify_one();
                Ok(())
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                Err(Refused::Full(back.delivery_opaque))
            }
            Err((e, back)) if is_too_large(&e) => Err(Refused::TooLarge(back.delivery_opaque)),
            Err((e, _)) => Err(Refused::Failed(classify(&e, &rec.topic))),
        }
    }

    fn flush(&self, timeout: Duration) -> Result<(), FlushError> {
        if self.drain(timeout) {
            return Ok(());
        }
        self.producer.flush(Duration::ZERO).map_err(|e| match e {
            KafkaError::Flush(_) => FlushError::Undelivered {
                pending: usize::try_from(self.producer.in_flight_count()).unwrap_or(0),
            },
            e => FlushError::Client(e.to_string()),
        })
    }

    fn purge(&self) {
        self.producer
            .purge(PurgeConfig::default().queue().inflight());
    }

    fn fatal(&self) -> Option<String> {
        self.producer
            .client()
            .fatal_error()
            .map(|(code, reason)| format!("{code:?}: {reason}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_principal_is_told_from_other_transactional_failures() {
        use RDKafkaErrorCode as C;
        for (code, denied) in [
            (C::TransactionalIdAuthorizationFailed, true),
            (C::ClusterAuthorizationFailed, true),
            (C::SaslAuthenticationFailed, true),
            (C::CoordinatorNotAvailable, false),
            (C::RequestTimedOut, false),
        ] {
            let e = TxnError::from(KafkaError::MessageProduction(code));
            assert_eq!(e.denied, denied, "{code:?}");
        }
    }

    /// A flush waits for the next serving in either order: a serving before the wait began
    /// ends it at once, one while it waits wakes it, long before the wait's bound.
    #[test]
    fn a_waiting_flush_wakes_at_the_next_serving() {
        let served = Arc::new(Served::default());
        let waiter = |seen: u64| {
            let served = served.clone();
            std::thread::spawn(move || {
                let began = std::time::Instant::now();
                served.wait(seen, Duration::from_secs(60));
                assert!(
                    began.elapsed() < Duration::from_secs(30),
                    "woken by its bound"
                );
            })
        };
        // The serving first.
        let seen = served.count();
        served.one_more();
        waiter(seen).join().unwrap();
        // The wait first: the serving comes once it waits.
        let seen = served.count();
        let waiting = waiter(seen);
        while served.state.lock().unwrap().1 == 0 {
            std::thread::yield_now();
        }
        served.one_more();
        waiting.join().unwrap();
        assert_eq!(served.count(), seen + 1);
        // No wait left behind.
        assert_eq!(served.state.lock().unwrap().1, 0);
    }

    /// A producer whose broker never answers: records stay queued.
    fn unreachable() -> Kafka {
        Kafka::new(&KafkaConfig {
            bootstrap_servers: "127.0.0.1:1".into(),
            properties: Default::default(),
            max_in_flight_per_stream: 10,
            max_message_bytes: 1_000_000,
            oversize: crate::config::OversizePolicy::Trim,
            dead_letter_topic: None,
            unsafe_producer_overrides: false,
            topics: Default::default(),
            delivery: Default::default(),
            commit_interval_ms: 100,
        })
        .unwrap()
    }

    /// A drain of nothing handed over ends at once; one with a record unacknowledged ends at
    /// its timeout, saying so, and the record is still counted as awaited.
    #[test]
    fn a_drain_waits_for_every_record_handed_over_and_no_longer_than_asked() {
        let kafka = unreachable();
        assert!(kafka.drain(Duration::from_secs(60)), "nothing handed over");
        let rec = Record {
            topic: "t".into(),
            key: "k".into(),
            value: b"{}".to_vec(),
            headers: Default::default(),
            tombstone: false,
            partition: None,
        };
        let receipt = Receipt::new(
            crate::producer::Inbox::new(),
            0,
            crate::producer::Sent::Unordered,
        );
        Producer::send(&kafka, &rec, receipt).unwrap();
        let began = std::time::Instant::now();
        assert!(!kafka.drain(Duration::from_millis(50)));
        let took = began.elapsed();
        assert!(took >= Duration::from_millis(50) && took < Duration::from_secs(5));
        assert!(kafka.producer.context().awaited());
        // What is left is the caller's to purge: its report comes, the drain ends.
        Producer::purge(&kafka);
        let began = std::time::Instant::now();
        assert!(kafka.drain(Duration::from_secs(60)));
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "the drain after the purge waited for its timeout, not for the purged report"
        );
        assert!(!kafka.producer.context().awaited());
    }

    #[test]
    fn kafka_errors_are_classed_by_what_it_takes_to_get_past_them() {
        use RDKafkaErrorCode as Code;
        let cases = [
            (Code::MessageTimedOut, ErrorClass::Retriable),
            (Code::NotLeaderForPartition, ErrorClass::Retriable),
            (Code::BrokerTransportFailure, ErrorClass::Retriable),
            (Code::TopicAuthorizationFailed, ErrorClass::Permanent),
            (Code::UnknownTopicOrPartition, ErrorClass::Permanent),
            (Code::MessageSizeTooLarge, ErrorClass::TooLarge),
        ];
        for (code, class) in cases {
            let got = classify(&KafkaError::MessageProduction(code), "t").class;
            assert_eq!(got, class, "{code:?}");
        }
    }

    #[test]
    fn a_missing_acl_or_topic_is_named() {
        let denied = classify(
            &KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed),
            "pods",
        );
        assert!(
            denied.message.contains("Write and Describe on topic pods"),
            "{}",
            denied.message
        );
        let missing = classify(
            &KafkaError::MessageProduction(RDKafkaErrorCode::UnknownTopic),
            "pods",
        );
        assert!(
            missing.message.contains("create topic pods"),
            "{}",
            missing.message
        );
    }
}
