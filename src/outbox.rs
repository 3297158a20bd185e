//! Delivery of one stream's records, in order.
//!
//! The [`Outbox`] owns everything between "this event is to be published" and "this position may
//! be checkpointed": the producer handle, the ordered acknowledgement [`Tracker`], in-flight
//! accounting and backpressure, the oversize path and the final drain. A stream hands it
//! announcements and reads the acknowledged position (and the known-object set at that position)
//! back from it.
//!
//! # Contract
//! - [`Outbox::checkpoint`] is the position of the longest prefix of handed-over entries that
//!   the producer acknowledged; it never covers an entry that was not delivered.
//! - An entry whose record is too large for Kafka is delivered as a reference (the object reduced
//!   to its identity), to the dead-letter topic or the channel's own; it keeps its place in the
//!   order.
//! - A delivery that fails for good ends in [`OutboxError::Failed`]; [`Outbox::rewind`] then
//!   forgets everything unacknowledged (late reports of it are ignored) so the stream replays
//!   from the checkpoint.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::{Histogram, IntCounter, IntGauge};
use thiserror::Error;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::Saved;
use crate::config::OversizePolicy;
use crate::envelope::{self, Announcement, Record, Route};
use crate::event::EventType;
use crate::metrics::Metrics;
use crate::producer::{DeliveryError, Producer, Receipt, Refused, Report};
use crate::tracker::{Change, Tracker};

/// How long a send waits before offering a record again to a full producer queue.
const FULL_RETRY: Duration = Duration::from_millis(5);

#[derive(Debug, Error, PartialEq, Eq)]
pub enum OutboxError {
    #[error("cancelled")]
    Cancelled,
    /// A record could not be delivered; replay from the checkpoint.
    #[error("{0}")]
    Failed(String),
}

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
}

/// The outbox's metric handles, labelled with its stream.
struct OutboxMetrics {
    in_flight: IntGauge,
    published: IntCounter,
    latency: Histogram,
    oversize_dead_letter: IntCounter,
    oversize_trim: IntCounter,
    enqueue_errors: IntCounter,
    delivery_errors: IntCounter,
}

pub struct Outbox {
    stream: String,
    route: Arc<Route>,
    producer: Arc<dyn Producer>,
    limits: Limits,
    tracker: Tracker,
    reports_tx: mpsc::UnboundedSender<Report>,
    reports_rx: mpsc::UnboundedReceiver<Report>,
    m: OutboxMetrics,
    cancel: CancellationToken,
    /// The last record's value buffer, reused for the next one (the producer copies it).
    spare: Vec<u8>,
    /// The checkpoint moved since [`Outbox::take_saved`] last ran.
    moved: bool,
}

impl Outbox {
    /// An outbox for `stream`, resuming from its saved checkpoint.
    pub fn new(
        stream: &str,
        route: Arc<Route>,
        producer: Arc<dyn Producer>,
        limits: Limits,
        saved: Option<Saved>,
        metrics: &Metrics,
        cancel: CancellationToken,
    ) -> Self {
        let (reports_tx, reports_rx) = mpsc::unbounded_channel();
        let (rv, known) = saved.map(|s| (s.rv, s.known)).unwrap_or_default();
        let oversize = |action| metrics.oversize.with_label_values(&[stream, action]);
        let errors = |kind| metrics.delivery_errors.with_label_values(&[stream, kind]);
        Self {
            m: OutboxMetrics {
                in_flight: metrics.in_flight.with_label_values(&[stream]),
                published: metrics.events_published.with_label_values(&[stream]),
                latency: metrics.publish_latency.with_label_values(&[stream]),
                oversize_dead_letter: oversize("dead_letter"),
                oversize_trim: oversize("trim"),
                enqueue_errors: errors("enqueue"),
                delivery_errors: errors("delivery"),
            },
            stream: stream.to_string(),
            route,
            producer,
            limits,
            tracker: Tracker::resume(rv, known),
            reports_tx,
            reports_rx,
            cancel,
            spare: Vec::new(),
            moved: false,
        }
    }

    /// Entries handed over and not yet acknowledged (entries waiting behind them included).
    pub fn in_flight(&self) -> usize {
        self.tracker.in_flight()
    }

    /// Whether another entry may be handed over without exceeding the in-flight bound.
    pub fn has_room(&self) -> bool {
        self.in_flight() < self.limits.max_in_flight
    }

    /// The position of the longest acknowledged prefix.
    pub fn checkpoint(&self) -> Option<&str> {
        self.tracker.checkpoint()
    }

    /// The objects known at the checkpoint.
    pub fn known(&self) -> &std::collections::HashMap<String, crate::tracker::Known> {
        self.tracker.known()
    }

    /// The checkpoint and its known-object set, if the checkpoint moved since the last call.
    pub fn take_saved(&mut self) -> Option<Saved> {
        if !std::mem::take(&mut self.moved) {
            return None;
        }
        Some(Saved {
            rv: self.tracker.checkpoint().map(str::to_string),
            at: Some(envelope::now_rfc3339()),
            query: None,
            known: self.tracker.complete_known().cloned(),
        })
    }

    /// Whether the checkpoint moved since [`Outbox::take_saved`] last ran.
    pub fn moved(&self) -> bool {
        self.moved
    }

    fn note(&mut self, moved: bool) {
        self.moved |= moved;
        self.m.in_flight.set(gauge(self.tracker.in_flight()));
    }

    /// Records a position (and known-set change) that needs no delivery: it becomes the
    /// checkpoint once everything before it is acknowledged.
    pub fn pass(&mut self, position: Option<String>, change: Option<Change>) {
        let moved = self.tracker.push_done(position, change);
        self.note(moved);
    }

    /// Publishes `a` with `object`; once acknowledged (with everything before it), `position`
    /// becomes the checkpoint and `change` applies to the known set. Waits only while the
    /// producer's queue is full.
    ///
    /// With tombstones on, a DELETED is followed by its tombstone, and `position` waits for
    /// both: a checkpoint never covers a DELETED whose tombstone was not delivered.
    pub async fn send(
        &mut self,
        a: Announcement,
        object: &[u8],
        arrived: Instant,
        position: Option<String>,
        change: Option<Change>,
    ) -> Result<(), OutboxError> {
        if self.limits.tombstones && a.event_type == EventType::Deleted {
            let deleted = a.clone();
            self.send_one(a, object, arrived, None, change).await?;
            return self.send_tombstone(deleted, arrived, position).await;
        }
        self.send_one(a, object, arrived, position, change).await
    }

    /// The tombstone of the DELETED `a`, taking `position`.
    async fn send_tombstone(
        &mut self,
        a: Announcement,
        arrived: Instant,
        position: Option<String>,
    ) -> Result<(), OutboxError> {
        let seq = self.tracker.push(position, None);
        self.note(false);
        let record = envelope::tombstone(&self.route, &a);
        let receipt = self.receipt(seq, arrived, 0, a);
        match self.offer(&record, receipt).await? {
            None => Ok(()),
            Some(_) => Err(OutboxError::Failed(
                "a tombstone was refused for size".into(),
            )),
        }
    }

    async fn send_one(
        &mut self,
        a: Announcement,
        object: &[u8],
        arrived: Instant,
        position: Option<String>,
        change: Option<Change>,
    ) -> Result<(), OutboxError> {
        let seq = self.tracker.push(position, change);
        self.note(false);
        let record = envelope::record(&self.route, &a, object, std::mem::take(&mut self.spare));
        let bytes = record.value.len();
        let receipt = self.receipt(seq, arrived, bytes, a);
        let result = if bytes > self.limits.max_message_bytes {
            self.send_reference(receipt).await
        } else {
            match self.offer(&record, receipt).await? {
                None => Ok(()),
                Some(receipt) => self.send_reference(receipt).await,
            }
        };
        self.spare = record.value;
        result
    }

    /// What travels with entry `seq`'s record and comes back in its report.
    fn receipt(&self, seq: u64, arrived: Instant, bytes: usize, a: Announcement) -> Box<Receipt> {
        Box::new(Receipt::new(
            self.reports_tx.clone(),
            seq,
            arrived,
            bytes,
            a,
        ))
    }

    /// Hands `record` to the producer, retrying while its queue is full. Gives the receipt back
    /// when the record was refused for its size.
    async fn offer(
        &mut self,
        record: &Record,
        mut receipt: Box<Receipt>,
    ) -> Result<Option<Box<Receipt>>, OutboxError> {
        loop {
            match self.producer.send(record, receipt) {
                Ok(()) => return Ok(None),
                Err(Refused::TooLarge(back)) => return Ok(Some(back)),
                Err(Refused::Full(back)) => {
                    receipt = back;
                    tokio::select! {
                        _ = self.cancel.cancelled() => return Err(OutboxError::Cancelled),
                        _ = tokio::time::sleep(FULL_RETRY) => {}
                    }
                }
                Err(Refused::Failed(e)) => {
                    self.m.enqueue_errors.inc();
                    return Err(OutboxError::Failed(e));
                }
            }
        }
    }

    /// Sends the reference standing in for a record too large for Kafka, in its place.
    async fn send_reference(&mut self, receipt: Box<Receipt>) -> Result<(), OutboxError> {
        let (action, topic) = match (&self.limits.oversize, &self.limits.dead_letter_topic) {
            (OversizePolicy::DeadLetter, Some(dlq)) if *dlq != self.route.topic => {
                self.m.oversize_dead_letter.inc();
                ("dead_letter", dlq.clone())
            }
            _ => {
                self.m.oversize_trim.inc();
                ("trim", self.route.topic.clone())
            }
        };
        let record = envelope::reference(&self.route, &receipt.announcement, receipt.bytes, &topic);
        tracing::warn!(stream = %self.stream, bytes = receipt.bytes, key = %record.key, action, "event too large for Kafka; sending a reference");
        match self.offer(&record, receipt).await? {
            None => Ok(()),
            Some(_) => Err(OutboxError::Failed(
                "even the reference envelope is too large".into(),
            )),
        }
    }

    /// The next delivery report (cancel-safe, for `select!`).
    pub async fn report(&mut self) -> Report {
        self.reports_rx
            .recv()
            .await
            .expect("the outbox holds a sender of its own")
    }

    /// Applies a delivery report: an acknowledgement advances the checkpoint; a refusal for size
    /// sends a reference instead; a failure is returned.
    pub async fn settle(&mut self, report: Report) -> Result<(), OutboxError> {
        let Report { receipt, result } = report;
        if !self.tracker.is_pending(receipt.seq) {
            // Forgotten by a rewind: its stream replays it anyway.
            return Ok(());
        }
        match result {
            Ok(()) => {
                self.m
                    .latency
                    .observe(receipt.arrived.elapsed().as_secs_f64());
                self.m.published.inc();
                let moved = self.tracker.ack(receipt.seq);
                self.note(moved);
                Ok(())
            }
            Err(DeliveryError::TooLarge { value: Some(value) })
                if !receipt.alone && value.len() <= self.limits.max_message_bytes =>
            {
                // Its batch was refused: it may be innocent. Tried on its own once before it is
                // taken for too large.
                let mut receipt = receipt;
                receipt.alone = true;
                let record = envelope::record_of_value(&self.route, &receipt.announcement, value);
                match self.offer(&record, receipt).await? {
                    None => Ok(()),
                    Some(back) => self.send_reference(back).await,
                }
            }
            Err(DeliveryError::TooLarge { .. }) => self.send_reference(receipt).await,
            Err(DeliveryError::Failed(e)) => {
                self.m.delivery_errors.inc();
                Err(OutboxError::Failed(e))
            }
        }
    }

    /// Settles reports until at most `limit` entries are in flight.
    pub async fn wait_until(&mut self, limit: usize) -> Result<(), OutboxError> {
        while self.in_flight() > limit {
            let report = tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return Err(OutboxError::Cancelled),
                r = self.reports_rx.recv() => r.expect("the outbox holds a sender of its own"),
            };
            self.settle(report).await?;
        }
        Ok(())
    }

    /// Settles reports until there is room for one more entry.
    pub async fn wait_for_room(&mut self) -> Result<(), OutboxError> {
        self.wait_until(self.limits.max_in_flight - 1).await
    }

    /// Forgets every unacknowledged entry after a failed delivery and returns the checkpoint to
    /// replay from. Late reports of the forgotten entries are ignored.
    pub fn rewind(&mut self) -> Option<String> {
        self.tracker.reset();
        self.note(false);
        self.tracker.checkpoint().map(str::to_string)
    }

    /// At stop: waits until `deadline` for outstanding acknowledgements, so the final checkpoint
    /// covers them. Stops early at the first failed delivery (nothing after it can be
    /// checkpointed). Returns the entries left unacknowledged; they will be replayed.
    pub async fn drain(&mut self, deadline: tokio::time::Instant) -> usize {
        while self.in_flight() > 0 {
            let report = match tokio::time::timeout_at(deadline, self.report()).await {
                Ok(r) => r,
                Err(_) => break,
            };
            match report.result {
                Ok(()) => {
                    let moved = self.tracker.ack(report.receipt.seq);
                    self.note(moved);
                }
                Err(_) => break,
            }
        }
        self.in_flight()
    }
}

/// A count as a gauge value.
fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
