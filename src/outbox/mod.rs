//! Delivery of one stream's records, in order.
//!
//! The [`Outbox`] owns everything between "this event is to be published" and "this position may
//! be checkpointed": the producer handle, the ordered acknowledgement [`Tracker`], in-flight
//! accounting and backpressure, the oversize path, the final drain, and the stream's
//! [`Members`] with the membership records that keep them in Kafka. A stream hands it
//! announcements and reads the acknowledged position and the members back from it.
//!
//! # Contract
//! - [`Outbox::checkpoint`] is the position of the longest prefix of handed-over entries that
//!   the producer acknowledged; it never covers an entry that was not delivered.
//! - An entry whose record is too large for Kafka is delivered as a reference (the object reduced
//!   to its identity), to the dead-letter topic or the channel's own; it keeps its place in the
//!   order.
//! - A delivery that fails for good ends in [`OutboxError::Failed`] with its typed [`Failure`];
//!   the outbox has then rewound, forgetting everything unacknowledged (late reports of it are
//!   ignored), and the error carries the checkpoint the stream replays from.
//! - An object joins the members before anything announcing it is sent: with a membership topic,
//!   its membership record is acknowledged first, and the stream's records wait in order behind
//!   pending joins (the ledger's join gate). With a transactional producer the record goes at
//!   once, after its join: both commit together, or the join earlier. It leaves once its
//!   DELETED is in the acknowledged prefix, and its membership tombstone is produced then (see
//!   [`crate::membership`] for why this leaves no hole after a crash).
//! - At most [`Limits::max_in_flight`] entries are handed over and unacknowledged; with a
//!   transactional producer, entries Kafka acknowledged that wait for their commit count apart,
//!   up to [`AWAITING_WINDOWS`] bounds more.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::{Histogram, IntCounter, IntGauge};
use tokio_util::sync::CancellationToken;

use crate::checkpoint::Saved;
use crate::config::OversizePolicy;
use crate::envelope::{self, Announcement, Route};
use crate::event::EventType;
use crate::event::Meta;
use crate::membership::Change;
use crate::membership::{Ledger, Members, Owner};
use crate::metrics::Metrics;
use crate::producer::Record;
use crate::producer::{
    DeliveryError, ErrorClass, Inbox, ProduceError, Producer, Receipt, Refused, Report, Sent,
    ERROR_KINDS,
};
use crate::tracker::Tracker;

/// How long a send first waits before offering a record again to a full producer queue; each
/// further refusal doubles it, up to [`FULL_RETRY_MAX`] (a queue that stays full is an outage,
/// not worth a wake-up every few milliseconds).
const FULL_RETRY: Duration = Duration::from_millis(5);
const FULL_RETRY_MAX: Duration = Duration::from_millis(100);
/// How many in-flight bounds of acknowledged entries may wait for their transaction's commit
/// beyond the bound itself ([`Outbox::has_room`]): each holds its report only (about 200
/// bytes), not its record.
const AWAITING_WINDOWS: usize = 3;

/// The outbox's limits and oversize route, from the configuration.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Entries that may await acknowledgement before the stream stops reading.
    pub max_in_flight: usize,
    /// The largest record value sent whole.
    pub max_message_bytes: usize,
    pub oversize: OversizePolicy,
    pub dead_letter_topic: Option<String>,
    /// Follow every DELETED with a tombstone (the key with a null value).
    pub tombstones: bool,
    /// The membership topic; without one (a dry run) members are kept in memory only.
    pub membership_topic: Option<String>,
    /// Whose membership records this stream writes.
    pub owner: Owner,
}

/// An entry waiting behind a pending join.
#[allow(
    clippy::large_enum_variant,
    reason = "every send passes through one; boxing would allocate for each"
)]
enum Held {
    /// A record, handed to the producer once released; `true`: the stream's next record is its
    /// pair (a DELETED's tombstone), in the same transaction.
    Send(Record, Box<Receipt>, bool),
    /// A position that needs no delivery, acknowledged once released.
    Pass(u64),
}

/// The outbox's metric handles, labelled with its stream.
struct OutboxMetrics {
    in_flight: IntGauge,
    members: IntGauge,
    published: IntCounter,
    latency: Histogram,
    oversize_dead_letter: IntCounter,
    oversize_trim: IntCounter,
    /// Errors by where (`ERROR_KINDS`: at enqueue, in the report) and class
    /// ([`ErrorClass::ALL`]).
    errors: [[IntCounter; 3]; 2],
}

/// Where a record failed: the index of its `kind` label in `ERROR_KINDS`.
const AT_ENQUEUE: usize = 0;
const IN_REPORT: usize = 1;

impl OutboxMetrics {
    fn error(&self, at: usize, class: ErrorClass) {
        // `ErrorClass::ALL` lists the classes in their declaration order.
        self.errors[at][class as usize].inc();
    }
}

pub struct Outbox {
    stream: String,
    route: Arc<Route>,
    producer: Arc<dyn Producer>,
    limits: Limits,
    tracker: Tracker,
    /// Where the producer reports deliveries, and the reports taken from it not yet settled.
    inbox: Arc<Inbox>,
    ready: VecDeque<Report>,
    m: OutboxMetrics,
    cancel: CancellationToken,
    /// The last record's value buffer, reused for the next one (the producer copies it).
    spare: Vec<u8>,
    /// The checkpoint moved since [`Outbox::take_saved`] last ran.
    moved: bool,
    /// The objects this stream announced, the joins pending with the entries waiting behind
    /// them, and the tombstones owed (see [`crate::membership`]).
    ledger: Ledger<Held>,
    /// Records still to be sent one at a time, each alone in its batch, after a batch was
    /// refused for size (see [`Outbox::settle`]).
    serial: usize,
    /// The stream's era, stamped on every record it sends (see [`envelope::version`]) and
    /// saved with its position.
    era: u64,
    /// Rewinds so far (see [`Outbox::rewinds`]).
    rewinds: u64,
    /// Every new era is above it (see [`Outbox::raise_era_floor`]).
    era_floor: u64,
    /// With a transactional producer: the query, route and kind the stream's positions are
    /// written with (see [`Outbox::stamp`]).
    stamp: Option<Stamp>,
}

/// What a position record says beside the position (see [`Saved`]).
#[derive(Clone, Debug, Default)]
pub struct Stamp {
    /// [`Saved::query`].
    pub query: String,
    /// [`Saved::sum`].
    pub sum: Option<String>,
    /// [`Saved::table`].
    pub table: Option<String>,
    /// [`Saved::fences`], as integers: each record keeps those above its position.
    pub fences: BTreeMap<String, u64>,
    /// [`Saved::covered`].
    pub covered: Option<Arc<BTreeSet<String>>>,
    /// [`Saved::route`].
    pub route: String,
    /// [`Saved::kind`].
    pub kind: Option<String>,
}

impl Stamp {
    /// The fences above position `rv` (none without one: a stream without a position
    /// resumes nothing).
    pub fn fences_above(
        fences: &BTreeMap<String, u64>,
        rv: Option<&str>,
    ) -> BTreeMap<String, String> {
        let Some(at) = rv.and_then(crate::event::comparable) else {
            return BTreeMap::new();
        };
        fences
            .iter()
            .filter(|(_, f)| **f > at)
            .map(|(ns, f)| (ns.clone(), f.to_string()))
            .collect()
    }
}

impl Outbox {
    /// An outbox for `stream`, resuming from its saved checkpoint with its members.
    #[allow(
        clippy::too_many_arguments,
        reason = "each is a different part of the wiring"
    )]
    pub fn new(
        stream: &str,
        route: Arc<Route>,
        producer: Arc<dyn Producer>,
        limits: Limits,
        saved: Option<Saved>,
        members: Members,
        metrics: &Metrics,
        cancel: CancellationToken,
    ) -> Self {
        let era = saved.as_ref().map_or(0, |s| s.era);
        let rv = saved.and_then(|s| s.rv);
        let topic = limits.membership_topic.clone();
        let ledger = Ledger::new(stream, limits.owner.clone(), topic, members);
        let oversize = |action| metrics.oversize.with_label_values(&[stream, action]);
        let errors = |kind| {
            ErrorClass::ALL.map(|class| {
                metrics
                    .delivery_errors
                    .with_label_values(&[stream, kind, class.label()])
            })
        };
        Self {
            m: OutboxMetrics {
                in_flight: metrics.in_flight.with_label_values(&[stream]),
                members: metrics.members.with_label_values(&[stream]),
                published: metrics.events_published.with_label_values(&[stream]),
                latency: metrics.publish_latency.with_label_values(&[stream]),
                oversize_dead_letter: oversize("dead_letter"),
                oversize_trim: oversize("trim"),
                errors: ERROR_KINDS.map(errors),
            },
            stream: stream.to_string(),
            route,
            producer,
            limits,
            tracker: Tracker::resume(rv),
            inbox: Inbox::new(),
            ready: VecDeque::new(),
            cancel,
            spare: Vec::new(),
            moved: false,
            ledger,
            serial: 0,
            era,
            rewinds: 0,
            era_floor: 0,
            stamp: None,
        }
    }

    /// Entries handed over and not yet acknowledged (entries waiting behind them included).
    pub fn in_flight(&self) -> usize {
        self.tracker.in_flight()
    }

    /// Entries that may be in flight now: one while records are sent one at a time.
    fn limit(&self) -> usize {
        if self.serial > 0 {
            1
        } else {
            self.limits.max_in_flight
        }
    }

    /// Entries that count against the in-flight bound: those whose record may still be in the
    /// producer's queue. With a transactional producer, an entry Kafka acknowledged waits for
    /// its transaction's commit ([`Inbox::awaiting`]), its record's bytes gone: it counts no
    /// more, up to [`AWAITING_WINDOWS`] bounds' worth, so a stream is not held to one bound a
    /// commit cycle.
    fn unacknowledged(&self) -> usize {
        let awaiting = self.inbox.awaiting().min(AWAITING_WINDOWS * self.limit());
        self.in_flight().saturating_sub(awaiting)
    }

    /// Whether another entry may be handed over without exceeding the in-flight bound.
    pub fn has_room(&self) -> bool {
        self.unacknowledged() < self.limit()
    }

    /// What wakes once a transaction holds one more of the stream's reports: there may be room
    /// again ([`Outbox::has_room`], [`Inbox::held_more`]).
    pub fn acknowledgements(&self) -> Arc<Inbox> {
        self.inbox.clone()
    }

    /// The position of the longest acknowledged prefix.
    pub fn checkpoint(&self) -> Option<&str> {
        self.tracker.checkpoint()
    }

    /// How many times the outbox rewound (a delivery failed for good) so far.
    pub fn rewinds(&self) -> u64 {
        self.rewinds
    }

    /// The era the stream's records are stamped with now.
    pub fn era(&self) -> u64 {
        self.era
    }

    /// Where the stream's records go.
    pub fn route(&self) -> &Route {
        &self.route
    }

    /// The objects the stream announced and has not seen leave.
    pub fn members(&self) -> &Members {
        self.ledger.members()
    }

    /// The checkpoint, if it moved since the last call.
    pub fn take_saved(&mut self) -> Option<Saved> {
        if !std::mem::take(&mut self.moved) {
            return None;
        }
        Some(Saved {
            rv: self.tracker.checkpoint().map(str::to_string),
            at: Some(envelope::now_rfc3339()),
            query: None,
            sum: None,
            table: None,
            fences: BTreeMap::new(),
            covered: None,
            route: None,
            kind: None,
            known: None,
            era: self.era,
            rewound: false,
        })
    }

    /// Moves the stream to a new era (see [`envelope::next_era`]), above its own and above the
    /// floor of its checkpoint ConfigMap: what it sends from now on carries it, and so does the
    /// next [`Outbox::take_saved`].
    pub fn next_era(&mut self) {
        self.era = envelope::next_era(self.era.max(self.era_floor));
        self.moved = true;
    }

    /// Every new era of the stream is above `floor` (the highest its checkpoint ConfigMap
    /// held): versions never go back, whatever the clock says.
    pub fn raise_era_floor(&mut self, floor: u64) {
        self.era_floor = self.era_floor.max(floor);
    }

    /// Forgets the position: what follows is not a replay of the watch from it. The next
    /// [`Outbox::take_saved`] says so, and with a transactional producer so does the next
    /// commit, with what follows.
    pub fn forget_position(&mut self) {
        self.tracker.forget_position();
        self.moved = true;
        self.mark(None);
    }

    /// The stamp changed while the position did not: the position is checkpointed again with
    /// it, and with a transactional producer committed again, after what was handed over
    /// before it.
    pub fn restamp(&mut self) {
        self.moved = true;
        let rv = self.tracker.checkpoint().map(str::to_string);
        self.mark(rv.as_deref());
    }

    /// What the stream's positions go with from now on: with a transactional producer, each
    /// position handed over is written with it.
    pub fn stamp(&mut self, stamp: Stamp) {
        if self.producer.transactional() {
            self.stamp = Some(stamp);
        }
    }

    /// With a transactional producer: every record before position `rv` (`None`: no position)
    /// was handed over, so the position commits with them.
    fn mark(&self, rv: Option<&str>) {
        if let Some(record) = self.position(rv) {
            self.producer.positioned(&self.inbox, record);
        }
    }

    /// The record of position `rv` with the stream's stamp, with a transactional producer.
    fn position(&self, rv: Option<&str>) -> Option<Record> {
        let (Some(stamp), Some(topic)) = (&self.stamp, &self.limits.membership_topic) else {
            return None;
        };
        let saved = Saved {
            rv: rv.map(str::to_string),
            at: None,
            query: Some(stamp.query.clone()),
            sum: stamp.sum.clone(),
            table: stamp.table.clone(),
            fences: Stamp::fences_above(&stamp.fences, rv),
            covered: stamp.covered.as_deref().filter(|_| rv.is_some()).cloned(),
            route: Some(stamp.route.clone()),
            kind: stamp.kind.clone(),
            known: None,
            era: self.era,
            rewound: false,
        };
        Some(crate::membership::position_record(
            topic,
            &self.limits.owner,
            &self.stream,
            Some(&saved),
        ))
    }

    /// Whether the checkpoint moved since [`Outbox::take_saved`] last ran.
    pub fn moved(&self) -> bool {
        self.moved
    }

    /// Holds `entry` behind pending joins when it (`wait`) or anything before it must wait;
    /// otherwise lets it go at once.
    async fn hand(&mut self, entry: Held, wait: bool) -> Result<(), OutboxError> {
        match self.ledger.admit(entry, wait) {
            Some(entry) => self.dispatch(entry).await,
            None => Ok(()),
        }
    }

    /// Lets go, in order, the held entries whose joins are all acknowledged.
    async fn release(&mut self) -> Result<(), OutboxError> {
        while let Some(entry) = self.ledger.next_released() {
            self.dispatch(entry).await?;
        }
        Ok(())
    }

    async fn dispatch(&mut self, entry: Held) -> Result<(), OutboxError> {
        match entry {
            Held::Pass(seq) => {
                self.mark_entry(seq);
                let moved = self.tracker.ack(seq);
                self.note(moved);
                Ok(())
            }
            Held::Send(record, receipt, more) => {
                let seq = receipt.seq;
                // Too large at once, or refused for size by the producer: a reference instead.
                let refused = if bytes(&receipt) > self.limits.max_message_bytes {
                    Some(receipt)
                } else {
                    let position = self.position_record(seq);
                    self.offer(&record, receipt, position, more).await?
                };
                let sent = match refused {
                    None => Ok(()),
                    Some(receipt) => {
                        self.send_reference(receipt, record.key.as_bytes(), &record.value, more)
                            .await
                    }
                };
                self.spare = record.value;
                sent
            }
        }
    }

    /// The position record of entry `seq`, with a transactional producer, if it has a
    /// position (an entry of a list has none until the list ends).
    fn position_record(&self, seq: u64) -> Option<Record> {
        // Without a transactional producer (no stamp), nothing is looked up.
        self.stamp.as_ref()?;
        self.position(Some(self.tracker.position_of(seq)?))
    }

    /// [`Outbox::mark`] of entry `seq`'s position, if it has one.
    fn mark_entry(&self, seq: u64) {
        if let Some(record) = self.position_record(seq) {
            self.producer.positioned(&self.inbox, record);
        }
    }

    /// Records a position (and membership change) that needs no delivery: it becomes the
    /// checkpoint once everything before it is acknowledged. An object that joins delays it
    /// until its join is acknowledged.
    pub async fn pass(
        &mut self,
        position: Option<String>,
        change: Option<Change>,
    ) -> Result<(), OutboxError> {
        debug_assert!(
            change != Some(Change::Announced),
            "a pass announces nothing"
        );
        let (leaves, wait) = self.membership_change(change, None).await?;
        if !wait && !self.ledger.holding() {
            if position.is_some() {
                self.mark(position.as_deref());
            }
            let moved = self.tracker.push_done(position, leaves);
            self.note(moved);
            return Ok(());
        }
        let seq = self.tracker.push(position, leaves);
        self.note(false);
        self.hand(Held::Pass(seq), true).await
    }

    /// Publishes `a` with `object`; once acknowledged (with everything before it), `position`
    /// becomes the checkpoint and `change` applies to the members. Waits only while the
    /// producer's queue is full.
    ///
    /// With tombstones on, a DELETED is followed by its tombstone, and `position` waits for
    /// both: a checkpoint never covers a DELETED whose tombstone was not delivered.
    pub async fn send(
        &mut self,
        mut a: Announcement,
        object: &[u8],
        arrived: Instant,
        position: Option<String>,
        change: Option<Change>,
    ) -> Result<(), OutboxError> {
        a.era = self.era;
        if self.limits.tombstones && a.event_type == EventType::Deleted {
            let record = envelope::tombstone(&self.route, &a);
            self.send_one(&a, object, arrived, None, None, true).await?;
            let seq = self.tracker.push(position, leaves(change));
            self.note(false);
            let receipt = self.receipt(seq, arrived, 0);
            return self.hand(Held::Send(record, receipt, false), false).await;
        }
        self.send_one(&a, object, arrived, position, change, false)
            .await
    }

    async fn send_one(
        &mut self,
        a: &Announcement,
        object: &[u8],
        arrived: Instant,
        position: Option<String>,
        change: Option<Change>,
        more: bool,
    ) -> Result<(), OutboxError> {
        let (leaves, wait) = self.membership_change(change, Some(&a.meta)).await?;
        // In a transaction the record commits with its object's join, taken before it, or
        // after it: neither lands without the other, and nothing need wait for the join.
        let wait = wait && !self.producer.transactional();
        let seq = self.tracker.push(position, leaves);
        self.note(false);
        let record = envelope::record(&self.route, a, object, std::mem::take(&mut self.spare));
        let receipt = self.receipt(seq, arrived, record.value.len());
        self.hand(Held::Send(record, receipt, more), wait).await
    }

    /// What travels with entry `seq`'s record and comes back in its report. While records go
    /// one at a time, each is alone in its batch: a refusal for size is its own.
    fn receipt(&mut self, seq: u64, arrived: Instant, bytes: usize) -> Box<Receipt> {
        let alone = self.serial > 0;
        self.serial = self.serial.saturating_sub(1);
        let sent = Sent::Entry {
            arrived,
            bytes,
            alone,
        };
        Receipt::new(self.inbox.clone(), seq, sent)
    }

    /// Hands `record` to the producer, retrying while its queue is full. Gives the receipt back
    /// when the record was refused for its size.
    async fn offer(
        &mut self,
        record: &Record,
        mut receipt: Box<Receipt>,
        position: Option<Record>,
        more: bool,
    ) -> Result<Option<Box<Receipt>>, OutboxError> {
        let mut wait = FULL_RETRY;
        loop {
            match self
                .producer
                .send_at(record, receipt, position.clone(), more)
            {
                Ok(()) => return Ok(None),
                Err(Refused::TooLarge(back)) => return Ok(Some(back)),
                Err(Refused::Full(back)) => {
                    receipt = back;
                    tokio::select! {
                        _ = self.cancel.cancelled() => return Err(OutboxError::Cancelled),
                        _ = tokio::time::sleep(wait) => {}
                    }
                    wait = (wait * 2).min(FULL_RETRY_MAX);
                }
                Err(Refused::Failed(e)) => {
                    self.m.error(AT_ENQUEUE, e.class);
                    self.warn_permanent(&e);
                    return Err(self.fail(Failure::Produce(e)));
                }
            }
        }
    }

    /// The next delivery report (cancel-safe, for `select!`). Reports come from the producer
    /// in batches: one wake-up takes every report ready then, and [`Outbox::ready_report`]
    /// hands out the rest without waiting.
    pub async fn report(&mut self) -> Report {
        self.inbox.next(&mut self.ready).await
    }

    /// A delivery report already taken from the producer, if any: a stream settles every ready
    /// report in one pass.
    pub fn ready_report(&mut self) -> Option<Report> {
        self.ready.pop_front()
    }

    /// Applies a delivery report: an acknowledgement advances the checkpoint; a refusal for size
    /// sends a reference instead; a failure is returned.
    pub async fn settle(&mut self, report: Report) -> Result<(), OutboxError> {
        let Report { receipt, result } = report;
        let (arrived, alone) = match &receipt.sent {
            Sent::Entry { arrived, alone, .. } => (*arrived, *alone),
            Sent::Join => return self.settle_join(receipt.seq, result).await,
            Sent::Unordered => {
                self.settle_leave(receipt.seq, result);
                return Ok(());
            }
        };
        if !self.tracker.is_pending(receipt.seq) {
            // Forgotten by a rewind: its stream replays it anyway.
            return Ok(());
        }
        match result {
            Ok(()) => {
                self.m.latency.observe(arrived.elapsed().as_secs_f64());
                self.m.published.inc();
                let moved = self.tracker.ack(receipt.seq);
                self.note(moved);
                Ok(())
            }
            Err(DeliveryError::TooLarge {
                value: Some(value), ..
            }) if !alone && value.len() <= self.limits.max_message_bytes => {
                // Its batch was refused: it may be innocent, and newer records of its key may
                // have been delivered since. Resending it now would put it after them. Instead
                // everything from the checkpoint is replayed in order, one record at a time (so
                // each is judged alone) until past what was in flight.
                self.serial = self.tracker.in_flight().max(1);
                self.m.error(IN_REPORT, ErrorClass::TooLarge);
                Err(self.fail(Failure::BatchTooLarge))
            }
            Err(DeliveryError::TooLarge { key, value }) => {
                let (key, value) = (key.unwrap_or_default(), value.unwrap_or_default());
                self.send_reference(receipt, &key, &value, false).await
            }
            Err(DeliveryError::Failed(e)) => {
                self.m.error(IN_REPORT, e.class);
                self.warn_permanent(&e);
                Err(self.fail(Failure::Produce(e)))
            }
        }
    }

    /// A permanent error will come back on every replay until an operator acts: said at error
    /// level (the stream's replay says the rest).
    fn warn_permanent(&self, e: &ProduceError) {
        if e.class == ErrorClass::Permanent {
            tracing::error!(stream = %self.stream, error = %e, "Kafka refuses this stream's records for a reason that will not pass by itself");
        }
    }

    /// The next delivery report, unless cancelled first.
    async fn next_report(&mut self) -> Result<Report, OutboxError> {
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(OutboxError::Cancelled),
            r = self.inbox.next(&mut self.ready) => Ok(r),
        }
    }

    /// Settles reports until at most `limit` entries are in flight.
    pub async fn wait_until(&mut self, limit: usize) -> Result<(), OutboxError> {
        while self.in_flight() > limit {
            let report = self.next_report().await?;
            self.settle(report).await?;
        }
        Ok(())
    }

    /// Settles reports until there is room for one more entry.
    pub async fn wait_for_room(&mut self) -> Result<(), OutboxError> {
        while !self.has_room() {
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return Err(OutboxError::Cancelled),
                r = self.inbox.next(&mut self.ready) => self.settle(r).await?,
                () = self.inbox.held_more() => {}
            }
        }
        Ok(())
    }

    /// Settles reports until no join is pending: every object announced so far is then a
    /// member (or its join failed, and nothing announcing it was sent). A decision that reads
    /// the members (reconcile, leave scope) comes after this.
    pub async fn settle_joins(&mut self) -> Result<(), OutboxError> {
        while self.ledger.joins_pending() {
            let report = self.next_report().await?;
            self.settle(report).await?;
        }
        Ok(())
    }

    /// Sends the inferred DELETED of member `meta` at `list_rv` to `topic` under `key`, where
    /// it was announced (followed by its tombstone, with tombstones on); it leaves once that is
    /// acknowledged. Every inferred DELETED a stream publishes goes through here.
    pub async fn retract(
        &mut self,
        meta: Meta,
        list_rv: &str,
        topic: &str,
        key: &str,
    ) -> Result<(), OutboxError> {
        let uid = meta.uid().to_string();
        let record = envelope::retraction(&self.route, meta, list_rv, topic, key, self.era);
        let tombstone = self.limits.tombstones.then(|| record.tombstone());
        // With a tombstone, the object leaves once the tombstone is delivered.
        let seq = self
            .tracker
            .push(None, tombstone.is_none().then(|| uid.clone()));
        self.note(false);
        let receipt = self.receipt(seq, Instant::now(), record.value.len());
        let more = tombstone.is_some();
        self.hand(Held::Send(record, receipt, more), false).await?;
        if let Some(tombstone) = tombstone {
            let seq = self.tracker.push(None, Some(uid));
            self.note(false);
            let receipt = self.receipt(seq, Instant::now(), 0);
            self.hand(Held::Send(tombstone, receipt, false), false)
                .await?;
        }
        Ok(())
    }

    /// A delivery failed for good: the outbox rewinds and says where the replay starts.
    fn fail(&mut self, failure: Failure) -> OutboxError {
        OutboxError::Failed {
            failure,
            checkpoint: self.rewind(),
        }
    }

    /// Forgets every unacknowledged entry after a failed delivery and returns the checkpoint to
    /// replay from. Late reports of the forgotten entries are ignored.
    fn rewind(&mut self) -> Option<String> {
        self.rewinds += 1;
        let transactional = self.producer.transactional();
        if transactional {
            self.absorb_delivered();
        }
        self.producer.rewound(&self.inbox);
        self.tracker.reset();
        if transactional {
            self.ledger.clear_all();
        } else {
            self.ledger.clear_held();
        }
        self.note(false);
        self.tracker.checkpoint().map(str::to_string)
    }

    /// Before a rewind with a transactional producer: the entries already reported delivered
    /// (committed) move the checkpoint, so that the replay does not publish them again. Other
    /// reports stay ready, settled as before.
    fn absorb_delivered(&mut self) {
        self.inbox.take_ready(&mut self.ready);
        let mut moved = false;
        let tracker = &mut self.tracker;
        self.ready.retain(|r| {
            let delivered = matches!(r.receipt.sent, Sent::Entry { .. }) && r.result.is_ok();
            if delivered && tracker.is_pending(r.receipt.seq) {
                moved |= tracker.ack(r.receipt.seq);
                return false;
            }
            true
        });
        self.note(moved);
    }

    /// At stop: waits until `deadline` for outstanding acknowledgements, so the final checkpoint
    /// covers them, and for membership tombstones. Stops early at the first failed delivery
    /// (nothing after it can be checkpointed). Returns the records left undelivered: entries
    /// will be replayed; a tombstone left is a member too many.
    pub async fn drain(&mut self, deadline: tokio::time::Instant) -> usize {
        loop {
            self.send_leaves();
            if self.in_flight() == 0 && self.ledger.leaves_pending() == 0 {
                break;
            }
            // A tombstone the queue refused is offered again after a while.
            let wake = if !self.ledger.tombstones_owed() {
                deadline
            } else {
                deadline.min(tokio::time::Instant::now() + FULL_RETRY_MAX)
            };
            match tokio::time::timeout_at(wake, self.report()).await {
                Ok(report) => {
                    let in_flight = self.in_flight();
                    if self.settle(report).await.is_err() {
                        // What was in flight, the failed record among it, will be replayed.
                        return in_flight + self.ledger.leaves_pending();
                    }
                }
                Err(_) if tokio::time::Instant::now() >= deadline => break,
                Err(_) => {}
            }
        }
        self.in_flight() + self.ledger.leaves_pending()
    }
}

/// The object an entry's delivery makes leave the members.
fn leaves(change: Option<Change>) -> Option<String> {
    match change {
        Some(Change::Leave { uid }) => Some(uid),
        _ => None,
    }
}

/// A count as a gauge value.
fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The value size an entry's receipt carries (none for membership records).
fn bytes(receipt: &Receipt) -> usize {
    match receipt.sent {
        Sent::Entry { bytes, .. } => bytes,
        Sent::Join | Sent::Unordered => 0,
    }
}

mod failure;
mod members;
mod oversize;

pub use failure::{Failure, OutboxError};
#[cfg(test)]
mod tests;
