//! Producers: where the outbox hands its records, and how their delivery reports come back.
//!
//! [`Producer`] is the small seam under the outbox: it sends, flushes,
//! purges and reports a fatal error, and owns its input, the [`Record`]. [`Kafka`] is the
//! idempotent librdkafka producer every stream shares (`kafka.rs`); [`Stdout`] writes JSON
//! lines for a dry run. The test double that keeps records in memory is in `testing`, behind
//! the `testing` feature.
//!
//! Sends never wait for their delivery: each record carries a [`Receipt`] (its stream's
//! [`Inbox`], its place in the stream's order and what it is), and the producer reports back
//! through it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

mod kafka;
mod record;
mod transaction;

pub(crate) use kafka::TxnError;
#[cfg(any(test, feature = "testing"))]
pub(crate) use kafka::Unread;
pub(crate) use kafka::MEMBERSHIP_GROUP;
pub use kafka::{Kafka, Reporting};
pub use record::{Headers, Record};
pub(crate) use transaction::{fence, Connect, KafkaConnect};
#[cfg(any(test, feature = "testing"))]
pub(crate) use transaction::{Client, Witness};
pub use transaction::{Proof, Transactional, TxnMetrics, TxnSource};

/// The `kind` labels of delivery errors: where the record failed.
pub const ERROR_KINDS: [&str; 2] = ["enqueue", "delivery"];

/// What a produce error takes to get past: the `class` label of `delivery_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// May pass by itself (a broker unreachable, a timeout, a leader moving): the stream
    /// replays from its checkpoint.
    Retriable,
    /// Fails again until an operator acts (authorization, a missing topic, an invalid
    /// record, a fatal producer): the stream replays too, and says so at error level.
    Permanent,
    /// The record, or the batch it was in, is too large for the broker.
    TooLarge,
}

impl ErrorClass {
    /// Every class, in declaration order (`class as usize` indexes it).
    pub const ALL: [ErrorClass; 3] = [Self::Retriable, Self::Permanent, Self::TooLarge];

    /// The `class` label's value, e.g. `too_large`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Retriable => "retriable",
            Self::Permanent => "permanent",
            Self::TooLarge => "too_large",
        }
    }
}

/// A record the producer did not take or deliver: its class and what the client said.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ProduceError {
    /// What it takes to get past the error.
    pub class: ErrorClass,
    /// What the client said, for the log.
    pub message: String,
}

impl ProduceError {
    /// An error that may pass by itself.
    pub fn retriable(message: impl Into<String>) -> Self {
        Self {
            class: ErrorClass::Retriable,
            message: message.into(),
        }
    }

    /// An error that fails again until an operator acts.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self {
            class: ErrorClass::Permanent,
            message: message.into(),
        }
    }
}

/// Why a record was not delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryError {
    /// The broker refused the record's batch for its size (or librdkafka the record itself).
    /// Carries the record's key and value: the record can be tried on its own before it is
    /// taken for too large (one oversize record fails every record batched with it), and its
    /// reference is made from them.
    TooLarge {
        /// The record's key, as the client handed it back (`None`: a null key).
        key: Option<Vec<u8>>,
        /// The record's value, as the client handed it back (`None`: a null value).
        value: Option<Vec<u8>>,
    },
    /// Anything else the producer gave up on after its own retries.
    Failed(ProduceError),
}

impl DeliveryError {
    /// The error's class, for `delivery_errors_total` and the stream's decision.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::TooLarge { .. } => ErrorClass::TooLarge,
            Self::Failed(e) => e.class,
        }
    }
}

/// Where one stream's delivery reports gather. The producer's threads push; the stream takes
/// every ready report in one pass ([`Inbox::take`]). Only a push into an empty inbox wakes the
/// stream, so a batch of reports costs one wake-up, not one per record.
#[derive(Debug)]
pub struct Inbox {
    reports: Mutex<Vec<Report>>,
    ready: tokio::sync::Notify,
    /// Unique in the process: what tells its stream apart ([`StreamKey`]).
    id: StreamKey,
    /// Reports of the stream's entries that Kafka acknowledged and their transaction holds
    /// until its outcome ([`Holds`]).
    awaiting: AtomicUsize,
    /// Woken when one more is held.
    held: tokio::sync::Notify,
}

impl Default for Inbox {
    fn default() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        Self {
            reports: Mutex::default(),
            ready: tokio::sync::Notify::new(),
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            awaiting: AtomicUsize::new(0),
            held: tokio::sync::Notify::new(),
        }
    }
}

impl Inbox {
    /// An empty inbox, shared between a stream and the receipts of its records.
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

    /// Reports of the stream's entries that left the producer (Kafka acknowledged them, or
    /// failed them) and wait for their transaction's outcome: their records' bytes are no
    /// longer held anywhere.
    pub fn awaiting(&self) -> usize {
        self.awaiting.load(Ordering::Relaxed)
    }

    /// Waits until a transaction holds one more of the stream's reports (see
    /// [`Inbox::awaiting`]). Cancel-safe; a hold while nobody waits wakes the next wait.
    pub async fn held_more(&self) {
        self.held.notified().await;
    }

    /// A transaction holds `report` until its outcome.
    fn hold(&self, report: &Report) {
        if matches!(report.receipt.sent, Sent::Entry { .. }) {
            self.awaiting.fetch_add(1, Ordering::Relaxed);
            self.held.notify_one();
        }
    }

    /// A held `report` is forwarded: its transaction's outcome is known.
    fn unhold(&self, report: &Report) {
        if matches!(report.receipt.sent, Sent::Entry { .. }) {
            self.awaiting.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Drops every ready report: for records whose outcome nobody waits for.
    pub(crate) fn discard(&self) {
        self.reports.lock().expect("inbox lock poisoned").clear();
    }

    /// Moves every ready report to the end of `into`, without waiting.
    pub(crate) fn take_ready(&self, into: &mut VecDeque<Report>) {
        into.extend(self.reports.lock().expect("inbox lock poisoned").drain(..));
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
        /// Whether the record is being tried on its own after its batch was refused for size.
        alone: bool,
    },
    /// A membership join (see [`crate::membership`]): what announces its object waits for it.
    Join,
    /// A record outside the stream's order (a membership tombstone, a topic mark): nothing
    /// waits for it.
    Unordered,
}

/// A stream, as a producer tells streams apart: the id of its inbox.
pub(crate) type StreamKey = usize;

/// The [`StreamKey`] of the stream whose inbox is `inbox`.
pub(crate) fn stream_key(inbox: &Arc<Inbox>) -> StreamKey {
    inbox.id
}

/// What holds a record's report before its stream gets it (its transaction, until the outcome
/// is known).
pub(crate) trait Holds: Send + Sync + std::fmt::Debug {
    /// Takes `report`, to hand it on (through its receipt, which left the hold) later.
    fn report(&self, report: Report);

    /// Kafka wrote one of its records at `offset` of `topic`'s `partition` (`entry`: a stream's
    /// entry in a channel topic; otherwise a membership record): where to look, if its outcome
    /// is ever unknown, whether it committed.
    fn witness(&self, _topic: &str, _partition: i32, _offset: i64, _entry: bool) {}
}

/// What travels with a record and comes back in its [`Report`].
#[derive(Debug)]
pub struct Receipt {
    to: Arc<Inbox>,
    /// The record's place in its stream's order ([`Sent::Entry`]) or the join's number
    /// ([`Sent::Join`]).
    pub seq: u64,
    /// What the record is, so the outbox knows what its report settles.
    pub sent: Sent,
    /// The [`Tally`] the record is counted in until it is reported, if any.
    counted: Option<Counted>,
    /// The transaction the record is in, which holds its report until the outcome is known.
    hold: Option<Arc<dyn Holds>>,
    /// Its report was held by its transaction ([`Inbox::awaiting`] counts it until forwarded).
    was_held: bool,
}

impl Receipt {
    /// A receipt that reports into `to`, boxed to travel with the record through the producer.
    pub fn new(to: Arc<Inbox>, seq: u64, sent: Sent) -> Box<Self> {
        Box::new(Self {
            to,
            seq,
            sent,
            counted: None,
            hold: None,
            was_held: false,
        })
    }

    /// Kafka wrote the record at `offset` of `topic`'s `partition`: its transaction, if it is
    /// in one, learns where to look for its outcome should it ever be unknown. A duplicate the
    /// broker dropped is acknowledged without an offset: no witness.
    pub(crate) fn witnessed(&self, topic: &str, partition: i32, offset: i64) {
        if let (Some(hold), true) = (&self.hold, offset >= 0) {
            let entry = matches!(self.sent, Sent::Entry { .. });
            hold.witness(topic, partition, offset, entry);
        }
    }

    /// Which stream the record is of, if it is in its stream's order (an entry, or a join an
    /// entry waits for); `None` for a record nothing waits for.
    pub(crate) fn stream(&self) -> Option<StreamKey> {
        match self.sent {
            Sent::Entry { .. } | Sent::Join => Some(stream_key(&self.to)),
            Sent::Unordered => None,
        }
    }

    /// Counts the record in `tally` until it is reported (or its receipt dropped), instead of
    /// any tally it was counted in before.
    pub fn count_in(&mut self, tally: &Arc<Tally>) {
        self.counted = Some(tally.add());
    }

    /// Stops counting the record in its tally: it was not taken.
    pub fn uncount(&mut self) {
        self.counted = None;
    }

    /// Reports the outcome. A stream that stopped meanwhile no longer listens; its replay from
    /// the checkpoint covers the record.
    pub fn report(mut self: Box<Self>, result: Result<(), DeliveryError>) {
        // Held by its transaction, it stays counted until the outcome is known.
        if let Some(hold) = self.hold.take() {
            self.was_held = true;
            let report = Report {
                receipt: self,
                result,
            };
            report.receipt.to.hold(&report);
            hold.report(report);
            return;
        }
        self.counted = None;
        let to = Arc::clone(&self.to);
        let report = Report {
            receipt: self,
            result,
        };
        if report.receipt.was_held {
            to.unhold(&report);
        }
        to.push(report);
    }
}

/// The records one user of a shared producer (a shard's term) handed over whose report has not
/// come: what a handover waits for instead of flushing everybody's records, and what is still
/// queued when it gives up. Counting is one atomic step per record; only a waiter and the
/// report that settles the last record take the lock.
#[derive(Debug, Default)]
pub struct Tally {
    pending: AtomicUsize,
    lock: Mutex<()>,
    settled: Condvar,
    /// Wakes an async waiter ([`Tally::settled`]) when the last record is reported.
    drained: tokio::sync::Notify,
}

impl Tally {
    /// An empty tally.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    fn add(self: &Arc<Self>) -> Counted {
        self.pending.fetch_add(1, Ordering::SeqCst);
        Counted(Arc::clone(self))
    }

    /// Records handed over and not yet reported.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }

    /// Waits up to `timeout` for every counted record to be reported: whether they all were.
    /// Blocks.
    pub fn wait(&self, timeout: Duration) -> bool {
        let guard = self.lock.lock().expect("tally lock poisoned");
        // The predicate is read under the lock the last report notifies under: no wake-up is
        // missed between the check and the wait.
        let _ = self
            .settled
            .wait_timeout_while(guard, timeout, |()| self.pending() > 0)
            .expect("tally lock poisoned");
        self.pending() == 0
    }

    /// [`Tally::wait`] on tokio's clock, without blocking: what a handover waits for.
    pub async fn settled(&self, timeout: Duration) -> bool {
        let all = async {
            loop {
                let notified = self.drained.notified();
                tokio::pin!(notified);
                // Registered before the check: a report in between still wakes it.
                notified.as_mut().enable();
                if self.pending() == 0 {
                    return;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(timeout, all).await;
        self.pending() == 0
    }
}

/// One record counted in a [`Tally`], until dropped.
#[derive(Debug)]
struct Counted(Arc<Tally>);

impl Drop for Counted {
    fn drop(&mut self) {
        if self.0.pending.fetch_sub(1, Ordering::SeqCst) == 1 {
            let _held = self.0.lock.lock().expect("tally lock poisoned");
            self.0.settled.notify_all();
            self.0.drained.notify_waiters();
        }
    }
}

/// The delivery report of one record.
#[derive(Debug)]
pub struct Report {
    /// The receipt the record was sent with.
    pub receipt: Box<Receipt>,
    /// Delivered (acknowledged by the broker), or why not.
    pub result: Result<(), DeliveryError>,
}

/// Why a flush did not end with every record reported.
#[derive(Debug, thiserror::Error)]
pub enum FlushError {
    /// The wait ran out with records still unreported.
    #[error("{pending} records undelivered when the wait ran out")]
    Undelivered {
        /// Records handed over and not yet reported (as far as the producer counts them).
        pending: usize,
    },
    /// The client failed otherwise.
    #[error("{0}")]
    Client(String),
}

/// Why a producer did not take a record.
#[derive(Debug)]
pub enum Refused {
    /// Its queue is full: try again shortly (backpressure).
    Full(Box<Receipt>),
    /// Refused at once for its size.
    TooLarge(Box<Receipt>),
    /// Anything else.
    Failed(ProduceError),
}

/// Takes records and reports each one's delivery through its receipt.
pub trait Producer: Send + Sync {
    /// Hands `record` over; its report arrives later through `receipt`.
    fn send(&self, record: &Record, receipt: Box<Receipt>) -> Result<(), Refused>;

    /// Waits up to `timeout` for every record handed over to be reported.
    fn flush(&self, timeout: Duration) -> Result<(), FlushError>;

    /// Drops every record not yet delivered, queued or in flight (their reports say so): a
    /// deposed owner's records must not land after the new owner's. A request already on the
    /// wire may still be written by its broker.
    fn purge(&self) {}

    /// A fatal error: the producer can deliver nothing more (the idempotent producer's
    /// sequence broke, say). Only a new process recovers.
    fn fatal(&self) -> Option<String> {
        None
    }

    /// Whether records become durable only with their transaction (`delivery: exactlyOnce`):
    /// streams then hand their positions over too ([`Producer::positioned`]).
    fn transactional(&self) -> bool {
        false
    }

    /// With transactions: the stream whose inbox is `stream` handed over every record before
    /// the position `record` writes, which then becomes durable with them (the latest of its
    /// key is written at the commit).
    fn positioned(&self, _stream: &Arc<Inbox>, _record: Record) {}

    /// [`Producer::send`], with transactions also [`Producer::positioned`] with `position`
    /// if given, in the same transaction as the record; `more`: the stream's next record goes
    /// in the same transaction too (a DELETED and its tombstone).
    fn send_at(
        &self,
        record: &Record,
        receipt: Box<Receipt>,
        position: Option<Record>,
        more: bool,
    ) -> Result<(), Refused> {
        let _ = more;
        let Some(position) = position else {
            return self.send(record, receipt);
        };
        let stream = receipt.to.clone();
        self.send(record, receipt)?;
        self.positioned(&stream, position);
        Ok(())
    }

    /// The stream whose inbox is `stream` forgot every record not yet reported and replays
    /// from its checkpoint.
    fn rewound(&self, _stream: &Arc<Inbox>) {}
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
            Err(e) => Err(Refused::Failed(ProduceError::permanent(format!(
                "writing to standard output: {e}"
            )))),
        }
    }

    fn flush(&self, _timeout: Duration) -> Result<(), FlushError> {
        use std::io::Write;
        std::io::stdout()
            .flush()
            .map_err(|e| FlushError::Client(format!("writing to standard output: {e}")))
    }
}
