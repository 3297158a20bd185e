//! Producers: where the outbox hands its records, and how their delivery reports come back.
//!
//! [`Producer`] is the small seam under the [`Outbox`](crate::outbox::Outbox): [`Kafka`] is the
//! idempotent librdkafka producer every stream shares; [`Memory`] keeps records in memory and
//! can acknowledge out of order, refuse for size, fail and stall, so stream behaviour can be
//! tested in-process without a broker.
//!
//! Sends never wait for their delivery: each record carries a [`Receipt`] (its stream's
//! [`Inbox`], its place in the stream's order and what it is), and the producer reports back
//! through it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{
    BaseRecord, DeliveryResult, Producer as _, ProducerContext, PurgeConfig, ThreadedProducer,
};
use rdkafka::{ClientContext, Message as _};

use crate::config::KafkaConfig;
use crate::envelope::{Announcement, Record};

/// The `kind` labels of delivery errors.
pub const ERROR_KINDS: [&str; 2] = ["enqueue", "delivery"];

/// Why a record was not delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryError {
    /// The broker refused the record's batch for its size (or librdkafka the record itself).
    /// Carries the record's value, so the record can be tried on its own before it is taken
    /// for too large: one oversize record fails every record batched with it.
    TooLarge { value: Option<Vec<u8>> },
    /// Anything else the producer gave up on after its own retries.
    Failed(String),
}

/// Where one stream's delivery reports gather. The producer's threads push; the stream takes
/// every ready report in one pass ([`Inbox::take`]). Only a push into an empty inbox wakes the
/// stream, so a batch of reports costs one wake-up, not one per record.
#[derive(Debug, Default)]
pub struct Inbox {
    reports: Mutex<Vec<Report>>,
    ready: tokio::sync::Notify,
}

impl Inbox {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    fn push(&self, report: Report) {
        let was_empty = {
            let mut reports = self.reports.lock().expect("inbox lock poisoned");
            reports.push(report);
            reports.len() == 1
        };
        if was_empty {
            self.ready.notify_one();
        }
    }

    /// Waits until at least one report is ready, then moves every ready one to the end of
    /// `into`. Cancel-safe: nothing is taken unless it returns.
    pub async fn take(&self, into: &mut VecDeque<Report>) {
        loop {
            {
                let mut reports = self.reports.lock().expect("inbox lock poisoned");
                if !reports.is_empty() {
                    into.extend(reports.drain(..));
                    return;
                }
            }
            self.ready.notified().await;
        }
    }

    /// The next report: the first of `ready`, else the first taken from the inbox (moving
    /// every other ready one to `ready`). Cancel-safe.
    pub async fn next(&self, ready: &mut VecDeque<Report>) -> Report {
        loop {
            if let Some(report) = ready.pop_front() {
                return report;
            }
            self.take(ready).await;
        }
    }
}

/// What a record is, to the outbox that sent it.
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "receipts travel boxed, and most are entries"
)]
pub enum Sent {
    /// A record in its stream's order (an event, a tombstone, a retraction): it moves the
    /// checkpoint once acknowledged with everything before it.
    Entry {
        /// When the event it announces was read off the watch.
        arrived: Instant,
        /// Size of the record's value.
        bytes: usize,
        /// What the record announces: enough to send a reference instead.
        announcement: Announcement,
        /// Whether the record is being tried on its own after its batch was refused for size.
        alone: bool,
    },
    /// A membership join (see [`crate::membership`]): what announces its object waits for it.
    Join,
    /// A record outside the stream's order (a membership tombstone, a topic mark): nothing
    /// waits for it.
    Unordered,
}

/// What travels with a record and comes back in its [`Report`].
#[derive(Debug)]
pub struct Receipt {
    to: Arc<Inbox>,
    /// The record's place in its stream's order ([`Sent::Entry`]) or the join's number
    /// ([`Sent::Join`]).
    pub seq: u64,
    pub sent: Sent,
}

impl Receipt {
    pub fn new(to: Arc<Inbox>, seq: u64, sent: Sent) -> Box<Self> {
        Box::new(Self { to, seq, sent })
    }

    /// Reports the outcome. A stream that stopped meanwhile no longer listens; its replay from
    /// the checkpoint covers the record.
    pub fn report(self: Box<Self>, result: Result<(), DeliveryError>) {
        let to = Arc::clone(&self.to);
        to.push(Report {
            receipt: self,
            result,
        });
    }
}

/// The delivery report of one record.
#[derive(Debug)]
pub struct Report {
    pub receipt: Box<Receipt>,
    pub result: Result<(), DeliveryError>,
}

/// Why a producer did not take a record.
#[derive(Debug)]
pub enum Refused {
    /// Its queue is full: try again shortly (backpressure).
    Full(Box<Receipt>),
    /// Refused at once for its size.
    TooLarge(Box<Receipt>),
    /// Anything else.
    Failed(String),
}

/// What reading a topic hands each record to: its key, and its value (`None` for a tombstone).
pub type Apply<'a> = dyn FnMut(&[u8], Option<&[u8]>) + 'a;

/// Takes records and reports each one's delivery through its receipt.
pub trait Producer: Send + Sync {
    /// Hands `record` over; its report arrives later through `receipt`.
    fn send(&self, record: &Record, receipt: Box<Receipt>) -> Result<(), Refused>;

    /// Waits up to `timeout` for every record handed over to be reported.
    fn flush(&self, timeout: Duration) -> Result<(), String>;

    /// Drops every record not yet sent to a broker (their reports say so): a deposed leader's
    /// queue must not land after the new leader's records.
    fn purge(&self) {}

    /// A fatal error: the producer can deliver nothing more (the idempotent producer's
    /// sequence broke, say). Only a new process recovers.
    fn fatal(&self) -> Option<String> {
        None
    }

    /// Creates `topic` compacted (`cleanup.policy=compact`) unless it exists, and says what the
    /// broker reports of it. Blocks.
    fn ensure_compacted(
        &self,
        _topic: &str,
        _partitions: i32,
        _replication: Option<i32>,
    ) -> Result<TopicState, TopicError> {
        Ok(TopicState::compacted(1))
    }

    /// Reads `topic` from its beginning to its end as of the call, handing each record's key
    /// and value (`None` for a tombstone) to `apply`, in partition order, until `stopped` says
    /// to give up. Blocks.
    fn replay(
        &self,
        _topic: &str,
        _apply: &mut Apply<'_>,
        _stopped: &(dyn Fn() -> bool + Sync),
    ) -> Result<(), TopicError> {
        Ok(())
    }
}

/// What the broker reports of a topic the relay keeps its state in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicState {
    pub partitions: usize,
    /// The topic's configuration entries, as the broker describes them.
    pub configs: BTreeMap<String, String>,
    /// Whether this call created it.
    pub created: bool,
}

impl TopicState {
    /// A compacted topic of `partitions`, as the relay creates it.
    pub fn compacted(partitions: usize) -> Self {
        Self {
            partitions,
            configs: BTreeMap::from([("cleanup.policy".to_string(), "compact".to_string())]),
            created: false,
        }
    }
}

/// Why a topic could not be created, described or read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    /// The broker refused for lack of permission: retrying does not help until an ACL changes.
    #[error("not authorized: {0}")]
    Unauthorized(String),
    #[error("stopped")]
    Stopped,
    #[error("{0}")]
    Other(String),
}

impl TopicError {
    fn of(code: RDKafkaErrorCode, what: String) -> Self {
        match code {
            RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed
            | RDKafkaErrorCode::GroupAuthorizationFailed
            | RDKafkaErrorCode::SaslAuthenticationFailed => {
                Self::Unauthorized(format!("{what}: {code}"))
            }
            _ => Self::Other(format!("{what}: {code}")),
        }
    }

    fn kafka(e: KafkaError, what: &str) -> Self {
        match e.rdkafka_error_code() {
            Some(code) => Self::of(code, what.to_string()),
            None => Self::Other(format!("{what}: {e}")),
        }
    }
}

/// librdkafka's context: turns its delivery callback into a [`Report`].
pub struct Reporting;

impl ClientContext for Reporting {}

impl ProducerContext for Reporting {
    type DeliveryOpaque = Box<Receipt>;

    fn delivery(&self, result: &DeliveryResult<'_>, receipt: Box<Receipt>) {
        receipt.report(match result {
            Ok(_) => Ok(()),
            Err((e, msg)) if is_too_large(e) => Err(DeliveryError::TooLarge {
                value: msg.payload().map(<[u8]>::to_vec),
            }),
            Err((e, _)) => Err(DeliveryError::Failed(e.to_string())),
        });
    }
}

fn is_too_large(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::MessageBatchTooLarge)
    )
}

/// Whether the Kafka client knows `key` and accepts `value` for it, offline. The error names
/// what is wrong and never contains the value (it may be a secret from the environment).
pub fn check_property(key: &str, value: &str) -> Result<(), String> {
    let mut c = ClientConfig::new();
    c.set(key, value);
    match c.create_native_config() {
        Ok(_) => Ok(()),
        Err(KafkaError::ClientConfig(_, message, _, _)) => Err(redact(&message, value)),
        Err(e) => Err(redact(&e.to_string(), value)),
    }
}

/// `message` with every occurrence of `secret` masked.
fn redact(message: &str, secret: &str) -> String {
    if secret.is_empty() {
        message.to_string()
    } else {
        message.replace(secret, "<redacted>")
    }
}

/// The producer settings the relay relies on; `kafka.properties` may override any of them.
pub fn client_config(cfg: &KafkaConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &cfg.bootstrap_servers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("compression.type", "lz4")
        .set("linger.ms", "5")
        // A record is retried until delivered; outages become backpressure, not loss. Shutdown
        // bounds the wait separately with shutdownTimeoutSeconds.
        .set("message.timeout.ms", "0")
        .set("queue.buffering.max.messages", "200000")
        .set("queue.buffering.max.kbytes", "262144")
        .set("client.id", "watchrelay");
    for (k, v) in &cfg.properties {
        c.set(k, v);
    }
    c
}

/// The idempotent Kafka producer every stream of a process shares.
pub struct Kafka {
    producer: ThreadedProducer<Reporting>,
    /// The connection settings (`bootstrap.servers`, security), for the admin client and the
    /// consumer reading the membership topic.
    connection: ClientConfig,
}

/// Producer-only settings left out of the admin and consumer clients.
const PRODUCER_ONLY: &[&str] = &[
    "enable.idempotence",
    "acks",
    "request.required.acks",
    "compression.type",
    "compression.codec",
    "linger.ms",
    "queue.buffering.max.ms",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "queue.buffering.max.messages",
    "queue.buffering.max.kbytes",
    "max.in.flight.requests.per.connection",
    "max.in.flight",
    "message.send.max.retries",
    "retries",
    "batch.num.messages",
    "batch.size",
    "partitioner",
];

/// Consumer buffers for reading the membership topic, unless kafka.properties sets them.
const REPLAY_BUFFERS: &[(&str, &str)] = &[
    ("queued.max.messages.kbytes", "8192"),
    ("fetch.max.bytes", "4194304"),
];

/// How long the membership topic may go without a record before its reading is given up.
const REPLAY_IDLE: Duration = Duration::from_secs(60);

impl Kafka {
    /// A producer with `cfg`. The error never contains a property's value.
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
        let all = client_config(cfg);
        let mut connection = ClientConfig::new();
        for (k, v) in all.config_map() {
            if !PRODUCER_ONLY.contains(&k) {
                connection.set(k, v);
            }
        }
        Ok(Self {
            producer: all.create_with_context(Reporting)?,
            connection,
        })
    }
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
        if !rec.tombstone {
            record = record.payload(&rec.value);
        }
        match self.producer.send(record) {
            Ok(()) => Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                Err(Refused::Full(back.delivery_opaque))
            }
            Err((e, back)) if is_too_large(&e) => Err(Refused::TooLarge(back.delivery_opaque)),
            Err((e, _)) => Err(Refused::Failed(e.to_string())),
        }
    }

    fn flush(&self, timeout: Duration) -> Result<(), String> {
        self.producer.flush(timeout).map_err(|e| e.to_string())
    }

    fn purge(&self) {
        self.producer.purge(PurgeConfig::default().queue());
    }

    fn fatal(&self) -> Option<String> {
        self.producer
            .client()
            .fatal_error()
            .map(|(code, reason)| format!("{code:?}: {reason}"))
    }

    fn ensure_compacted(
        &self,
        topic: &str,
        partitions: i32,
        replication: Option<i32>,
    ) -> Result<TopicState, TopicError> {
        use rdkafka::admin::{
            AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication,
        };
        use rdkafka::types::RDKafkaRespErr;
        let timeout = Duration::from_secs(30);
        let admin: AdminClient<rdkafka::client::DefaultClientContext> = self
            .connection
            .create()
            .map_err(|e| TopicError::kafka(e, "creating an admin client"))?;
        let options = AdminOptions::new().operation_timeout(Some(timeout));
        // Created only when missing: where the relay may not create topics, one made by hand
        // is used as it is (and verified like any other).
        let md = admin
            .inner()
            .fetch_metadata(Some(topic), timeout)
            .map_err(|e| TopicError::kafka(e, &format!("reading the metadata of {topic}")))?;
        let found = md.topics().iter().find(|t| t.name() == topic);
        let mut created = false;
        match found.and_then(|t| t.error()) {
            None if found.is_some_and(|t| !t.partitions().is_empty()) => {}
            Some(e) if e != RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART => {
                return Err(TopicError::of(
                    e.into(),
                    format!("reading the metadata of {topic}"),
                ));
            }
            _ => {
                let new = NewTopic::new(
                    topic,
                    partitions,
                    TopicReplication::Fixed(replication.unwrap_or(-1)),
                )
                .set("cleanup.policy", "compact");
                let results = futures::executor::block_on(admin.create_topics([&new], &options))
                    .map_err(|e| TopicError::kafka(e, &format!("creating {topic}")))?;
                for result in results {
                    match result {
                        Ok(_) => {
                            created = true;
                            tracing::info!(%topic, partitions, "created the membership topic (compacted)")
                        }
                        Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                        Err((_, code)) => {
                            return Err(TopicError::of(code, format!("creating {topic}")))
                        }
                    }
                }
            }
        }
        let md = admin
            .inner()
            .fetch_metadata(Some(topic), timeout)
            .map_err(|e| TopicError::kafka(e, &format!("reading the metadata of {topic}")))?;
        let partitions = md
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .map_or(0, |t| t.partitions().len());
        let described = futures::executor::block_on(
            admin.describe_configs([&ResourceSpecifier::Topic(topic)], &options),
        )
        .map_err(|e| TopicError::kafka(e, &format!("describing {topic}")))?;
        let mut configs = BTreeMap::new();
        for resource in described {
            let resource =
                resource.map_err(|code| TopicError::of(code, format!("describing {topic}")))?;
            for entry in resource.entries {
                if let Some(value) = entry.value {
                    configs.insert(entry.name, value);
                }
            }
        }
        Ok(TopicState {
            partitions,
            configs,
            created,
        })
    }

    fn replay(
        &self,
        topic: &str,
        apply: &mut Apply<'_>,
        stopped: &(dyn Fn() -> bool + Sync),
    ) -> Result<(), TopicError> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::{Offset, TopicPartitionList};
        let timeout = Duration::from_secs(30);
        let other = |e: String| TopicError::Other(e);
        let mut settings = self.connection.clone();
        settings
            .set("group.id", "watchrelay-membership")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false");
        // What is fetched ahead stays small, the sets being what must fit in memory; the
        // configuration's kafka.properties may say otherwise.
        for (k, v) in REPLAY_BUFFERS {
            if settings.get(k).is_none() {
                settings.set(*k, *v);
            }
        }
        let consumer: BaseConsumer = settings
            .create()
            .map_err(|e| TopicError::kafka(e, "creating a consumer"))?;
        let md = consumer
            .fetch_metadata(Some(topic), timeout)
            .map_err(|e| TopicError::kafka(e, &format!("reading the metadata of {topic}")))?;
        let partitions = md
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .map(|t| t.partitions().len())
            .unwrap_or(0);
        // Where reading stops: an end marker (a tombstone no stream owns) produced to every
        // partition now; the offset Kafka acknowledged for it is exact on any broker, unlike a
        // high watermark fetched separately.
        let marker: rdkafka::producer::FutureProducer = self
            .connection
            .create()
            .map_err(|e| TopicError::kafka(e, "creating a producer"))?;
        let mut ends = std::collections::HashMap::new();
        let mut tpl = TopicPartitionList::new();
        for p in 0..i32::try_from(partitions).map_err(|e| other(e.to_string()))? {
            let record = rdkafka::producer::FutureRecord::<str, [u8]>::to(topic)
                .partition(p)
                .key(crate::membership::END_MARKER);
            let end = futures::executor::block_on(marker.send(record, timeout))
                .map_err(|(e, _)| {
                    TopicError::kafka(e, &format!("marking the end of {topic}[{p}]"))
                })?
                .offset;
            ends.insert(p, end);
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .map_err(|e| other(e.to_string()))?;
        }
        consumer.assign(&tpl).map_err(|e| other(e.to_string()))?;
        let mut idle = Instant::now();
        while !ends.is_empty() {
            if stopped() {
                return Err(TopicError::Stopped);
            }
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    idle = Instant::now();
                    apply(m.key().unwrap_or_default(), m.payload());
                    if ends
                        .get(&m.partition())
                        .is_some_and(|&end| m.offset() + 1 >= end)
                    {
                        ends.remove(&m.partition());
                    }
                }
                Some(Err(e)) => {
                    if let Some(
                        code @ (RDKafkaErrorCode::TopicAuthorizationFailed
                        | RDKafkaErrorCode::GroupAuthorizationFailed),
                    ) = e.rdkafka_error_code()
                    {
                        return Err(TopicError::of(code, format!("reading {topic}")));
                    }
                    tracing::warn!(%topic, error = %e, "reading the membership topic")
                }
                None if idle.elapsed() > REPLAY_IDLE => {
                    return Err(other(format!(
                        "reading {topic}: nothing for {REPLAY_IDLE:?} before its end offsets"
                    )))
                }
                None => {}
            }
        }
        Ok(())
    }
}

/// In what order [`Memory::release`] acknowledges the records it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Sent,
    Reversed,
    /// A permutation drawn from the seed.
    Shuffled(u64),
}

/// A producer in memory, for tests: what it delivered is in [`Memory::log`], in the order it was
/// sent (a partition's order), whatever the order of acknowledgements.
///
/// By default every record is acknowledged as it is sent. [`Memory::hold`] keeps records
/// unacknowledged until [`Memory::release`] (a stall, or out-of-order acknowledgements);
/// [`Memory::refuse_larger_than`] refuses records for size, at send or in the report;
/// [`Memory::fail_next`] fails deliveries; [`Memory::capacity`] bounds what it holds, past
/// which sends are refused as [`Refused::Full`].
#[derive(Default)]
pub struct Memory {
    state: Mutex<MemoryState>,
}

#[derive(Default)]
struct MemoryState {
    /// Delivered records and their place in the send order.
    log: Vec<(u64, Record)>,
    sent: u64,
    held: VecDeque<(u64, Record, Box<Receipt>)>,
    hold: bool,
    capacity: Option<usize>,
    too_large: Option<(usize, bool)>,
    /// Releases holding a record larger than this fail whole, as a broker refuses a batch.
    batch_limit: Option<usize>,
    fail_next: usize,
    fatal: Option<String>,
    /// What `ensure_compacted` reports of each topic (created compacted when first asked).
    topics: std::collections::HashMap<String, TopicState>,
    /// What `ensure_compacted` fails with, when set.
    topic_error: Option<TopicError>,
    /// A pause before each record a replay hands over: a slow read.
    replay_pause: Option<Duration>,
}

impl Memory {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.state.lock().expect("memory producer lock poisoned")
    }

    /// Every record delivered so far, in the order it was sent.
    pub fn log(&self) -> Vec<Record> {
        let mut log = self.state().log.clone();
        log.sort_by_key(|(n, _)| *n);
        log.into_iter().map(|(_, r)| r).collect()
    }

    /// Holds records unacknowledged (`true`) or acknowledges them as they come (`false`).
    pub fn hold(&self, hold: bool) {
        self.state().hold = hold;
    }

    /// Records held, not yet acknowledged.
    pub fn held(&self) -> usize {
        self.state().held.len()
    }

    /// Refuses sends while `n` records are held.
    pub fn capacity(&self, n: usize) {
        self.state().capacity = Some(n);
    }

    /// Refuses records whose value exceeds `bytes`: at send, or (`in_report`) in the delivery
    /// report, as a broker does.
    pub fn refuse_larger_than(&self, bytes: usize, in_report: bool) {
        self.state().too_large = Some((bytes, in_report));
    }

    /// Fails every record of a [`Memory::release`] that holds a record larger than `bytes`
    /// for its size, as a broker refuses a whole batch; records sent on their own are judged
    /// on their own.
    pub fn refuse_batches_with_larger_than(&self, bytes: usize) {
        self.state().batch_limit = Some(bytes);
    }

    /// Fails the next `n` deliveries.
    pub fn fail_next(&self, n: usize) {
        self.state().fail_next = n;
    }

    /// Sets what the broker reports of `topic`.
    pub fn set_topic(&self, topic: &str, state: TopicState) {
        self.state().topics.insert(topic.to_string(), state);
    }

    /// Fails every `ensure_compacted` with `error` (`None`: stops failing).
    pub fn fail_topics(&self, error: Option<TopicError>) {
        self.state().topic_error = error;
    }

    /// Pauses before each record a replay hands over.
    pub fn slow_replay(&self, pause: Duration) {
        self.state().replay_pause = Some(pause);
    }

    /// Fails fatally, as an idempotent producer whose sequence broke.
    pub fn fail_fatally(&self, reason: &str) {
        self.state().fatal = Some(reason.to_string());
    }

    /// Acknowledges every held record, in `order`.
    pub fn release(&self, order: Order) {
        self.release_first(usize::MAX, order);
    }

    /// Acknowledges the first `n` held records (in the order they were sent: what Kafka had
    /// written when the sender died), in `order`.
    pub fn release_first(&self, n: usize, order: Order) {
        let mut held: Vec<_> = {
            let mut s = self.state();
            let n = n.min(s.held.len());
            s.held.drain(..n).collect()
        };
        match order {
            Order::Sent => {}
            Order::Reversed => held.reverse(),
            Order::Shuffled(mut seed) => {
                for i in (1..held.len()).rev() {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    held.swap(i, (seed % (i as u64 + 1)) as usize);
                }
            }
        }
        let batch_limit = self.state().batch_limit;
        let refused = held.len() > 1
            && batch_limit.is_some_and(|max| held.iter().any(|(_, r, _)| r.value.len() > max));
        for (n, record, receipt) in held {
            if refused {
                let value = Some(record.value);
                receipt.report(Err(DeliveryError::TooLarge { value }));
            } else {
                self.settle(n, record, receipt);
            }
        }
    }

    fn settle(&self, n: u64, record: Record, receipt: Box<Receipt>) {
        let result = {
            let mut s = self.state();
            if s.fail_next > 0 {
                s.fail_next -= 1;
                Err(DeliveryError::Failed("injected delivery failure".into()))
            } else if s
                .too_large
                .is_some_and(|(max, late)| late && record.value.len() > max)
                || s.batch_limit.is_some_and(|max| record.value.len() > max)
            {
                Err(DeliveryError::TooLarge {
                    value: Some(record.value.clone()),
                })
            } else {
                s.log.push((n, record));
                Ok(())
            }
        };
        receipt.report(result);
    }
}

impl Producer for Memory {
    fn send(&self, record: &Record, receipt: Box<Receipt>) -> Result<(), Refused> {
        let (hold, n) = {
            let mut s = self.state();
            if s.too_large
                .is_some_and(|(max, late)| !late && record.value.len() > max)
            {
                return Err(Refused::TooLarge(receipt));
            }
            if s.capacity.is_some_and(|c| s.held.len() >= c) {
                return Err(Refused::Full(receipt));
            }
            s.sent += 1;
            (s.hold, s.sent)
        };
        if hold {
            self.state().held.push_back((n, record.clone(), receipt));
        } else {
            self.settle(n, record.clone(), receipt);
        }
        Ok(())
    }

    fn flush(&self, _timeout: Duration) -> Result<(), String> {
        match self.held() {
            0 => Ok(()),
            n => Err(format!("{n} records held")),
        }
    }

    fn ensure_compacted(
        &self,
        topic: &str,
        partitions: i32,
        _replication: Option<i32>,
    ) -> Result<TopicState, TopicError> {
        let mut s = self.state();
        if let Some(e) = &s.topic_error {
            return Err(e.clone());
        }
        let partitions = usize::try_from(partitions).unwrap_or(1);
        Ok(s.topics
            .entry(topic.to_string())
            .or_insert_with(|| TopicState::compacted(partitions))
            .clone())
    }

    fn replay(
        &self,
        topic: &str,
        apply: &mut Apply<'_>,
        stopped: &(dyn Fn() -> bool + Sync),
    ) -> Result<(), TopicError> {
        let pause = self.state().replay_pause;
        for r in self.log().iter().filter(|r| r.topic == topic) {
            if stopped() {
                return Err(TopicError::Stopped);
            }
            if let Some(pause) = pause {
                std::thread::sleep(pause);
            }
            apply(r.key.as_bytes(), (!r.tombstone).then_some(&r.value[..]));
        }
        Ok(())
    }

    fn purge(&self) {
        let held: Vec<_> = self.state().held.drain(..).collect();
        for (_, _, receipt) in held {
            receipt.report(Err(DeliveryError::Failed("purged from the queue".into())));
        }
    }

    fn fatal(&self) -> Option<String> {
        self.state().fatal.clone()
    }
}

/// Envelopes as JSON lines on standard output, acknowledged as written: `run --dry-run`.
///
/// A closed standard output (the reader went away, as with `| head`) ends the process quietly,
/// as command-line tools do.
#[derive(Default)]
pub struct Stdout;

impl Producer for Stdout {
    fn send(&self, record: &Record, receipt: Box<Receipt>) -> Result<(), Refused> {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let written = out
            .write_all(&record.value)
            .and_then(|()| out.write_all(b"\n"));
        match written {
            Ok(()) => {
                receipt.report(Ok(()));
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
            Err(e) => Err(Refused::Failed(format!("writing to standard output: {e}"))),
        }
    }

    fn flush(&self, _timeout: Duration) -> Result<(), String> {
        use std::io::Write;
        std::io::stdout().flush().map_err(|e| e.to_string())
    }
}
