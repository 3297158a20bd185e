//! Exactly-once delivery (`kafka.delivery: exactlyOnce`): a term's records, the membership
//! records they need and its streams' positions, committed together in Kafka transactions.
//!
//! [`Transactional`] is a [`Producer`] over a librdkafka producer with a `transactional.id` of
//! the term's own (its checkpoint ConfigMap's). Creating it calls `init_transactions`, which
//! fences any earlier producer with that id (a deposed owner's, frozen or cut off: it can never
//! commit again) and aborts what that one left open. Then one transaction is open at a time:
//! - every [`Transactional::interval`] (`kafka.commitIntervalMs`, from one commit's start to the
//!   next), or at once when flushed, a transaction that took anything is closed, the latest
//!   position of each stream handed in it is written to the membership topic in it, and it is
//!   committed; what streams hand over meanwhile waits in memory for the next transaction,
//!   sent in order once it has begun, so no stream waits for a commit;
//! - the records' reports reach their streams only then ([`books`]): a checkpoint covers only
//!   what a `read_committed` consumer can read, and a membership join counts only once
//!   committed (the records announcing its object go in the same transaction or a later one);
//! - while the term cannot prove it owns the id (a shard's ownership deadline passed: its
//!   replica holds the shard), no commit starts and the producer is not built again: the open
//!   transaction waits until ownership is proven again, or the term is fenced and the next
//!   owner's producer aborts it (a commit already asked when the hold began ends as Kafka
//!   decides: the id's fencing, not the hold, keeps a deposed owner's commits out);
//! - a commit is asked once, and given up before librdkafka's own request for it times out
//!   (and is sent again): librdkafka lacks KIP-890's second part, every transaction of a
//!   producer has the same epoch, so a commit request arriving late would end the next
//!   transaction early, and a write whose request timed out could join it. Once a commit
//!   failed, for whatever reason, its outcome is not taken from the error: the producer is
//!   built again under the same id (a new epoch, fencing every late request of the old one),
//!   which settles the transaction (committed if the coordinator had the commit, else
//!   aborted), and a `read_committed` reader positioned at one of its records (its
//!   [`Witness`](books::Witness)) says which. Aborted, its records' reports come back failed:
//!   their streams replay from their checkpoints, and none of them may send until it did;
//! - a transaction that must abort before its commit was asked (a stream rewound with records
//!   in it, a record refused) is aborted, and the producer built again the same way. A fenced
//!   instance, while its term still owns the id (its lease or its shard proven), can only have
//!   been fenced by the coordinator aborting a transaction past `transaction.timeout.ms`: the
//!   transaction is taken for aborted and the producer rebuilt the same way. Once its term is
//!   fenced it is never rebuilt (that would fence the next owner's): it takes nothing more,
//!   and the next owner's producer settles what it left. Other fatal errors fail the producer
//!   ([`Producer::fatal`]).

mod books;
mod client;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

#[cfg(any(test, feature = "testing"))]
pub(crate) use books::Witness;
use books::{Books, Closed, Hold, Outcome, Refusal};
pub use client::TxnSource;
pub(crate) use client::{Client, Connect, KafkaConnect};

use super::kafka::TxnError;
use super::{
    stream_key, DeliveryError, FlushError, Inbox, ProduceError, Producer, Receipt, Record, Refused,
    Sent, StreamKey,
};
use crate::config::KafkaConfig;

/// How long `init_transactions` or an abort may take before it counts as failed, and the most
/// each of a commit's two waits may take, for its records and then for its request (see
/// [`commit_timeout`]): a commit may block for twice this.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long to wait before building the producer again after it failed to start.
const REBUILD_AGAIN: Duration = Duration::from_secs(1);
/// How often a producer to be built again looks whether its term's ownership is proven again.
const HELD_LOOK: Duration = Duration::from_millis(50);
/// How often a flush looks whether everything handed over was committed.
const FLUSH_POLL: Duration = Duration::from_millis(5);

/// The transactions' metrics: commits, aborts, rebuilds.
#[derive(Clone)]
pub struct TxnMetrics {
    /// Transactions committed.
    pub commits: prometheus::IntCounter,
    /// Transactions aborted (each followed by a new producer under the id).
    pub aborts: prometheus::IntCounter,
    /// Seconds each commit took.
    pub commit_seconds: prometheus::Histogram,
}

/// Whether a term can prove it owns its transactional id now ([`Transactional::start`]).
pub type Proof = Arc<dyn Fn() -> bool + Send + Sync>;

/// A transactional producer of one term (see the module).
pub struct Transactional {
    inside: Mutex<Inside>,
    /// Where its instances come from, and outcomes are read.
    connect: Arc<dyn Connect>,
    /// How often the open transaction is committed.
    pub interval: Duration,
    /// Wakes the committer before its interval: a flush waits.
    commit_now: Arc<tokio::sync::Notify>,
    fatal: Mutex<Option<String>>,
    /// Cancelled once the term lost what it owns (fenced): a failed commit is then not followed
    /// by a new producer under the id, which could fence the next owner's; the producer takes
    /// nothing more ([`Transactional::ended`]).
    owned: CancellationToken,
    /// Whether the term can prove it owns the id now: while it cannot (a shard's ownership
    /// deadline passed) no commit starts and no producer is built under the id, so that a
    /// replica that may have been deposed neither shows more to `read_committed` consumers nor
    /// fences its successor; a renewal lets the commits go on, a fence ends the term.
    proven: Proof,
    /// Set once a commit failed after the term lost its ownership: sends are refused, without
    /// failing the relay.
    ended: std::sync::atomic::AtomicBool,
    /// Where the reports of position records go, dropped after each commit.
    scratch: Arc<Inbox>,
    /// How long a commit may wait for its records, and then its request, before its outcome
    /// is learnt from a new producer.
    commit_timeout: Duration,
    /// What `pending` may take ([`Connect::queue_bytes`]).
    queue_bytes: usize,
    metrics: TxnMetrics,
}

struct Inside {
    books: Books,
    kafka: Arc<dyn Client>,
    /// Records taken while a transaction was being committed, in order: for the next one,
    /// sent once it has begun. A stream waits for a commit only once these take the
    /// producer's queue bound ([`Connect::queue_bytes`]).
    pending: Vec<Pending>,
    /// The bytes of `pending`'s records.
    pending_bytes: usize,
}

impl Inside {
    /// `pending` is now `kept` (what is left of it, in order).
    fn set_pending(&mut self, kept: Vec<Pending>) {
        self.pending_bytes = kept.iter().map(|p| p.record.size()).sum();
        self.pending = kept;
    }
}

/// A record taken while a transaction closed, its receipt already held by the next one.
struct Pending {
    record: Record,
    receipt: Box<Receipt>,
    stream: Option<StreamKey>,
}

impl Transactional {
    /// A producer whose `transactional.id` is `id`, its first transaction begun; `owned` is
    /// cancelled when the term owning the id is fenced, and no transaction is committed while
    /// `proven` says no. Blocks in `init_transactions` (on a thread of its own) until the id's
    /// earlier producer is fenced. The error never contains a property's value.
    pub async fn start(
        cfg: &KafkaConfig,
        id: &str,
        interval: Duration,
        owned: CancellationToken,
        proven: Proof,
        metrics: TxnMetrics,
    ) -> Result<Arc<Self>, String> {
        let connect = Arc::new(KafkaConnect::new(cfg, id, 1));
        Self::start_with(connect, interval, owned, proven, metrics)
            .await
            .map_err(|e| e.message)
    }

    /// [`Transactional::start`], its instances from `connect`.
    pub(crate) async fn start_with(
        connect: Arc<dyn Connect>,
        interval: Duration,
        owned: CancellationToken,
        proven: Proof,
        metrics: TxnMetrics,
    ) -> Result<Arc<Self>, TxnError> {
        let commit_timeout = connect.commit_timeout();
        let queue_bytes = connect.queue_bytes();
        let kafka = build(&*connect).await?;
        let txn = Arc::new(Self {
            inside: Mutex::new(Inside {
                books: Books::default(),
                kafka,
                pending: Vec::new(),
                pending_bytes: 0,
            }),
            connect,
            interval,
            commit_now: Arc::default(),
            fatal: Mutex::new(None),
            owned,
            proven,
            ended: std::sync::atomic::AtomicBool::new(false),
            scratch: Inbox::new(),
            commit_timeout,
            queue_bytes,
            metrics,
        });
        tokio::spawn(committer(
            Arc::downgrade(&txn),
            txn.commit_now.clone(),
            interval,
        ));
        Ok(txn)
    }

    fn kafka(&self) -> Arc<dyn Client> {
        self.inside.lock().expect("txn lock poisoned").kafka.clone()
    }

    fn fail(&self, why: String) {
        tracing::error!(error = %why, "the transactional producer failed fatally");
        *self.fatal.lock().expect("fatal lock poisoned") = Some(why.clone());
        self.drop_pending(|_| true, &why);
    }

    /// Reports the pending records of the streams `which` selects failed, unsent: their
    /// streams replay them.
    fn drop_pending(&self, which: impl Fn(Option<StreamKey>) -> bool, why: &str) {
        let dropped: Vec<Pending> = {
            let mut inside = self.inside.lock().expect("txn lock poisoned");
            let (dropped, kept): (Vec<Pending>, Vec<Pending>) = std::mem::take(&mut inside.pending)
                .into_iter()
                .partition(|p| which(p.stream));
            inside.set_pending(kept);
            dropped
        };
        for Pending { mut receipt, .. } in dropped {
            receipt.hold = None;
            receipt.report(Err(DeliveryError::Failed(ProduceError::retriable(why))));
        }
    }

    /// Closes the open transaction if it holds anything, writes its positions and commits it;
    /// aborts it, and builds the producer anew, if the commit cannot succeed. Returns once the
    /// next transaction is open, or the producer failed for good, or its term was fenced.
    ///
    /// A commit that failed is never taken for an abort by its error: a new producer settles
    /// it, and one of its records read back says how it ended; the records are reported failed
    /// only once it is known aborted. Once the term is fenced nothing is decided: the next
    /// owner's producer settles the transaction. A fenced instance of a term that still owns
    /// the id, before a commit was asked, counts as an abort (see the module).
    async fn commit(&self) {
        if !(self.proven)() {
            // Held: the transaction stays open until ownership is proven again or the term is
            // fenced (its next owner's producer then aborts it).
            return;
        }
        let (closed, kafka) = {
            let mut inside = self.inside.lock().expect("txn lock poisoned");
            let books = &inside.books;
            if books.is_empty() || books.is_closed() || books.is_pinned(self.interval) {
                return;
            }
            let doomed = books.is_doomed();
            ((inside.books.close(), doomed), inside.kafka.clone())
        };
        let started = std::time::Instant::now();
        let (
            Closed {
                hold,
                positions,
                streams,
            },
            doomed,
        ) = closed;
        let doomed = || {
            doomed || {
                let inside = self.inside.lock().expect("txn lock poisoned");
                inside.books.is_closing_doomed()
            }
        };
        // Whether a commit was asked for: from then on only Kafka knows the outcome.
        let mut asked = false;
        let committed = match self.write_positions(&*kafka, positions, &hold).await {
            Err(e) => Err(e),
            Ok(()) if doomed() => Err(TxnError::abortable("a stream rewound with records in it")),
            Ok(()) => {
                // Asked once, and given up before librdkafka's own request times out (and is
                // sent again): a commit request that arrives late could otherwise end the next
                // transaction early, since librdkafka lacks KIP-890's second part and every
                // transaction of a producer has the same epoch. A producer built anew fences
                // the old one's late requests.
                asked = true;
                let (k, timeout) = (kafka.clone(), self.commit_timeout);
                tokio::task::spawn_blocking(move || k.commit_transaction(timeout))
                    .await
                    .unwrap_or_else(|e| Err(TxnError::abortable(&e.to_string())))
            }
        };
        self.scratch.discard();
        let e = match committed {
            Ok(()) => {
                self.committed(&hold, started);
                match kafka.begin_transaction() {
                    Ok(()) => self.reopen(None).await,
                    Err(e) => self.rebuild(kafka, e).await,
                }
                return;
            }
            Err(_) if self.owned.is_cancelled() => return self.end(),
            Err(e) => e,
        };
        if asked {
            // A commit was asked for and failed: its request may have reached the coordinator
            // after all (timed out on the way, or held up), so no error tells the outcome. A new
            // producer under the id settles the transaction (committed if the coordinator had
            // the commit, else aborted) and fences the old one, whose late requests are then
            // refused; where Kafka wrote one of its records then says how it ended.
            tracing::warn!(error = %e.message, "a commit failed: building the producer again to learn the outcome");
            drop(kafka);
            let Some(kafka) = self.build_again().await else {
                return;
            };
            let Some(committed) = self.outcome(&hold).await else {
                if self.owned.is_cancelled() {
                    self.end();
                }
                return;
            };
            if committed {
                tracing::info!("the transaction had committed");
                self.committed(&hold, started);
            } else {
                tracing::info!(
                    "the transaction was aborted; its streams replay from their checkpoints"
                );
                self.aborted(&hold, &streams, &e.message);
            }
            return self.reopen(Some(kafka)).await;
        }
        // No commit was asked: the transaction cannot have committed.
        tracing::warn!(error = %e.message, streams = streams.len(), "a transaction cannot commit: aborting it; its streams replay from their checkpoints");
        // Its records delivered or failed first: an abort with records in flight can fail
        // fatally in librdkafka.
        let k = kafka.clone();
        let _ = tokio::task::spawn_blocking(move || Producer::flush(&*k, CALL_TIMEOUT)).await;
        if let Err(a) = self
            .call(&kafka, |k| k.abort_transaction(CALL_TIMEOUT))
            .await
        {
            if !a.fatal && !self.owned.is_cancelled() {
                return self.fail(a.message);
            }
            // Fenced meanwhile: the next owner's producer aborts it. Otherwise the instance is
            // dead: while the term owns the id (its lease or its shard proven), only the
            // coordinator can have fenced it, by aborting the transaction past
            // `transaction.timeout.ms` (a new epoch).
            if self.owned.is_cancelled() {
                return self.end();
            }
            tracing::warn!(error = %a.message, "the transaction outlived its timeout and was aborted by the coordinator");
        }
        self.aborted(&hold, &streams, &e.message);
        self.rebuild(kafka, TxnError::abortable(&e.message)).await;
    }

    /// Whether the transaction of `hold`, settled by a newer producer under the id, committed:
    /// read at its [`Witness`](books::Witness) (none: nothing of it was written, so nothing of
    /// it can be read). Asked again while the answer waits (another producer's transaction open
    /// before it in the partition holds the reader back, at most until that one's timeout);
    /// `None` once the term is fenced, or once reading it failed for good (no permission to
    /// read, the record gone): the producer then fails ([`Transactional::fail`]), and a restart
    /// resumes from the committed positions.
    async fn outcome(&self, hold: &Hold) -> Option<bool> {
        let Some(w) = hold.witness() else {
            return Some(false);
        };
        loop {
            let (connect, w) = (self.connect.clone(), w.clone());
            let read = tokio::task::spawn_blocking(move || connect.committed_at(&w, CALL_TIMEOUT))
                .await
                .unwrap_or_else(|e| {
                    Err(super::kafka::Unread {
                        fatal: false,
                        message: e.to_string(),
                    })
                });
            match read {
                Ok(committed) => return Some(committed),
                Err(_) if self.owned.is_cancelled() => return None,
                Err(why) if why.fatal => {
                    self.fail(format!(
                        "whether a transaction committed cannot be read: {}",
                        why.message
                    ));
                    return None;
                }
                Err(why) => {
                    tracing::warn!(error = %why.message, "reading whether a transaction committed; trying again");
                    tokio::time::sleep(REBUILD_AGAIN).await;
                }
            }
        }
    }

    /// The closed transaction of `hold`, begun at `started`, committed.
    fn committed(&self, hold: &Hold, started: std::time::Instant) {
        self.metrics.commits.inc();
        self.metrics
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        hold.decide(Outcome::Committed);
    }

    /// The closed transaction of `hold`, which `streams` sent into, aborted (`why`).
    fn aborted(&self, hold: &Hold, streams: &HashSet<StreamKey>, why: &str) {
        self.metrics.aborts.inc();
        // The streams replay before anything else of theirs is taken, and only then do their
        // records come back failed.
        self.inside
            .lock()
            .expect("txn lock poisoned")
            .books
            .aborted(streams);
        // What they handed over while it closed goes too: they replay it.
        self.drop_pending(
            |s| s.is_some_and(|s| streams.contains(&s)),
            "the stream's records in an aborted transaction are replayed first",
        );
        hold.decide(Outcome::Aborted(why.to_string()));
    }

    /// Runs the blocking transactional `call` on a thread of its own, again while it fails
    /// retriably (every [`REBUILD_AGAIN`]) and the term is not fenced.
    async fn call(
        &self,
        kafka: &Arc<dyn Client>,
        call: fn(&dyn Client) -> Result<(), TxnError>,
    ) -> Result<(), TxnError> {
        loop {
            let k = kafka.clone();
            let result = tokio::task::spawn_blocking(move || call(&*k))
                .await
                .unwrap_or_else(|e| Err(TxnError::abortable(&e.to_string())));
            match result {
                Err(e) if e.retriable && !self.owned.is_cancelled() => {
                    tracing::warn!(error = %e.message, "a transactional call failed; trying it again");
                    tokio::time::sleep(REBUILD_AGAIN).await;
                }
                result => return result,
            }
        }
    }

    /// Hands the position records to the open (closed) transaction of `hold`, which learns
    /// where Kafka wrote them ([`Holds::witness`]).
    async fn write_positions(
        &self,
        kafka: &dyn Client,
        positions: Vec<Record>,
        hold: &Arc<Hold>,
    ) -> Result<(), TxnError> {
        for record in positions {
            let mut receipt = Receipt::new(self.scratch.clone(), 0, Sent::Unordered);
            receipt.hold = Some(hold.clone());
            loop {
                match kafka.send(&record, receipt) {
                    Ok(()) => break,
                    Err(Refused::Full(back)) => {
                        receipt = back;
                        tokio::time::sleep(FLUSH_POLL).await;
                    }
                    Err(Refused::TooLarge(_)) => {
                        return Err(TxnError::abortable(&format!(
                            "a position record is too large: {}",
                            record.key
                        )))
                    }
                    Err(Refused::Failed(e)) => return Err(TxnError::abortable(&e.message)),
                }
            }
        }
        Ok(())
    }

    /// Takes sends again, with `kafka` as the producer if given (the old one dropped outside
    /// the lock: its destruction may wait), once the records taken meanwhile are sent, in
    /// order, into the transaction just begun. One the producer refuses dooms it (it aborts):
    /// its stream's later records must not commit without it.
    async fn reopen(&self, kafka: Option<Arc<dyn Client>>) {
        let old = {
            let mut inside = self.inside.lock().expect("txn lock poisoned");
            kafka.map(|k| std::mem::replace(&mut inside.kafka, k))
        };
        drop(old);
        while !self.send_pending() {
            tokio::time::sleep(FLUSH_POLL).await;
        }
    }

    /// Sends the pending records, in order, into the open transaction, and takes sends again;
    /// false when the producer's queue was full (the rest stays pending, sends still wait).
    fn send_pending(&self) -> bool {
        let mut inside = self.inside.lock().expect("txn lock poisoned");
        let mut rest = std::mem::take(&mut inside.pending).into_iter();
        while let Some(Pending {
            record,
            receipt,
            stream,
        }) = rest.next()
        {
            match inside.kafka.send(&record, receipt) {
                Ok(()) => {}
                Err(Refused::Full(back)) => {
                    let full = Pending {
                        record,
                        receipt: back,
                        stream,
                    };
                    let rest = std::iter::once(full).chain(rest).collect();
                    inside.set_pending(rest);
                    return false;
                }
                Err(Refused::TooLarge(back)) => {
                    inside.books.doom();
                    back.report(Err(DeliveryError::TooLarge {
                        key: Some(record.key.into_bytes()),
                        value: Some(record.value),
                    }));
                }
                Err(Refused::Failed(e)) => {
                    inside.books.doom();
                    tracing::warn!(error = %e, "a record taken during a commit was refused");
                }
            }
        }
        inside.pending_bytes = 0;
        inside.books.open();
        true
    }

    /// The term was fenced with a transaction unsettled: the producer takes nothing more, and
    /// the next owner's settles the transaction. The relay goes on.
    fn end(&self) {
        tracing::info!(
            "a transaction was left unsettled by a fenced term: its producer takes nothing more"
        );
        self.ended.store(true, std::sync::atomic::Ordering::Relaxed);
        self.drop_pending(|_| true, "the term was fenced");
    }

    /// After `error` on `old` (its transaction aborted, or not begun): a new producer under the
    /// id, its transaction begun; none once the term is fenced, or when the error was fatal.
    async fn rebuild(&self, old: Arc<dyn Client>, error: TxnError) {
        drop(old);
        if error.fatal {
            return self.fail(error.message);
        }
        if let Some(kafka) = self.build_again().await {
            self.reopen(Some(kafka)).await;
        }
    }

    /// A new producer under the id (fencing the old one and settling its transaction), its
    /// transaction begun; none once the term is fenced ([`Transactional::end`]) or when building
    /// it failed fatally ([`Transactional::fail`]).
    async fn build_again(&self) -> Option<Arc<dyn Client>> {
        loop {
            if self.owned.is_cancelled() {
                self.end();
                return None;
            }
            if !(self.proven)() {
                // Held: a successor may be taking the id over; a producer built now could fence
                // its. Built once ownership is proven again, never once the term is fenced.
                tokio::select! {
                    _ = self.owned.cancelled() => {}
                    _ = tokio::time::sleep(HELD_LOOK) => {}
                }
                continue;
            }
            match build(&*self.connect).await {
                // A producer built after the fence would fence the next owner's: dropped.
                Ok(_) if self.owned.is_cancelled() => {
                    self.end();
                    return None;
                }
                Ok(kafka) => return Some(kafka),
                Err(e) if e.fatal => {
                    self.fail(e.message);
                    return None;
                }
                Err(e) => {
                    tracing::warn!(error = %e.message, "building the transactional producer again");
                    tokio::select! {
                        _ = self.owned.cancelled() => {}
                        _ = tokio::time::sleep(REBUILD_AGAIN) => {}
                    }
                }
            }
        }
    }
}

/// Fences every producer under `connect`'s transactional id and settles what the last one left
/// open (committed if its commit had reached the coordinator, else aborted), with an instance
/// dropped at once: for a term that takes over another id's state without producing under it
/// (a shard copying the single leader's). Blocks in `init_transactions` on a thread of its own.
pub(crate) async fn fence(connect: &dyn Connect) -> Result<(), TxnError> {
    let kafka = connect.client().map_err(|e| TxnError::abortable(&e))?;
    tokio::task::spawn_blocking(move || kafka.init_transactions(CALL_TIMEOUT))
        .await
        .unwrap_or_else(|e| Err(TxnError::abortable(&e.to_string())))
}

/// A new instance from `connect`, its earlier epochs fenced and its first transaction begun.
async fn build(connect: &dyn Connect) -> Result<Arc<dyn Client>, TxnError> {
    let kafka = connect.client().map_err(|message| TxnError {
        fatal: true,
        ..TxnError::abortable(&message)
    })?;
    let k = kafka.clone();
    tokio::task::spawn_blocking(move || {
        k.init_transactions(CALL_TIMEOUT)?;
        k.begin_transaction()
    })
    .await
    .unwrap_or_else(|e| Err(TxnError::abortable(&e.to_string())))?;
    Ok(kafka)
}

/// Commits every `interval`, or when `now` is notified, until the producer is dropped or
/// fails for good.
///
/// Commits begin at a steady cadence, `interval` apart, not `interval` after the last one ended:
/// a commit's own time does not stretch the cycle.
async fn committer(txn: Weak<Transactional>, now: Arc<tokio::sync::Notify>, interval: Duration) {
    let mut next = tokio::time::Instant::now() + interval;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = now.notified() => {}
        }
        let began = tokio::time::Instant::now();
        let Some(t) = txn.upgrade() else { return };
        if t.fatal().is_some() {
            return;
        }
        t.commit().await;
        next = began + interval;
    }
}

impl Producer for Transactional {
    fn send(&self, record: &Record, receipt: Box<Receipt>) -> Result<(), Refused> {
        self.send_at(record, receipt, None, false)
    }

    /// The record and its position in one transaction, under one lock: the committer cannot
    /// close the transaction between them.
    fn send_at(
        &self,
        record: &Record,
        mut receipt: Box<Receipt>,
        position: Option<Record>,
        more: bool,
    ) -> Result<(), Refused> {
        if let Some(why) = self.fatal() {
            return Err(Refused::Failed(ProduceError::permanent(why)));
        }
        if self.ended.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Refused::Failed(ProduceError::retriable(
                "the term was fenced: its transactional producer takes nothing more",
            )));
        }
        let stream = receipt.stream();
        let mut inside = self.inside.lock().expect("txn lock poisoned");
        match inside.books.admit(stream) {
            Err(Refusal::Closed) => {
                // Taken for the next transaction, sent once it has begun; past the queue's
                // bound, refused as by a full queue (the stream offers it again).
                let bytes = record.size();
                if !inside.pending.is_empty() && inside.pending_bytes + bytes > self.queue_bytes {
                    return Err(Refused::Full(receipt));
                }
                inside.pending_bytes += bytes;
                receipt.hold = Some(inside.books.next_hold());
                inside.books.taken(stream, more);
                if let (Some(s), Some(p)) = (stream, position) {
                    inside.books.mark(s, p);
                }
                inside.pending.push(Pending {
                    record: record.clone(),
                    receipt,
                    stream,
                });
                Ok(())
            }
            Err(Refusal::Replay) => Err(Refused::Failed(ProduceError::retriable(
                "the stream's records in an aborted transaction are replayed first",
            ))),
            Ok(hold) => {
                receipt.hold = Some(hold);
                // Sent under the lock: the record is in the transaction its receipt's hold is.
                let sent = inside.kafka.send(record, receipt).map_err(|mut refused| {
                    if let Refused::Full(r) | Refused::TooLarge(r) = &mut refused {
                        r.hold = None;
                    }
                    refused
                });
                if sent.is_ok() {
                    inside.books.taken(stream, more);
                    if let (Some(s), Some(p)) = (stream, position) {
                        inside.books.mark(s, p);
                    }
                }
                sent
            }
        }
    }

    /// Commits what was handed over and waits until it was, up to `timeout`.
    fn flush(&self, timeout: Duration) -> Result<(), FlushError> {
        let until = std::time::Instant::now() + timeout;
        loop {
            if let Some(why) = self.fatal() {
                return Err(FlushError::Client(why));
            }
            let settled = {
                let inside = self.inside.lock().expect("txn lock poisoned");
                inside.books.is_empty() && !inside.books.is_closed()
            };
            if settled {
                return Ok(());
            }
            if std::time::Instant::now() >= until {
                return Err(FlushError::Undelivered {
                    pending: usize::from(!settled),
                });
            }
            self.commit_now.notify_one();
            std::thread::sleep(FLUSH_POLL);
        }
    }

    fn purge(&self) {
        self.kafka().purge();
    }

    /// Only what this producer decided is fatal: a fatal error of its librdkafka instance is
    /// met by the next transactional call, and may be outlived (see the module).
    fn fatal(&self) -> Option<String> {
        self.fatal.lock().expect("fatal lock poisoned").clone()
    }

    fn transactional(&self) -> bool {
        true
    }

    fn positioned(&self, stream: &Arc<Inbox>, record: Record) {
        let mut inside = self.inside.lock().expect("txn lock poisoned");
        inside.books.mark(stream_key(stream), record);
    }

    fn rewound(&self, stream: &Arc<Inbox>) {
        let mut inside = self.inside.lock().expect("txn lock poisoned");
        inside.books.rewound(stream_key(stream));
    }
}
