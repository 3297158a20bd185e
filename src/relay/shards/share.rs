//! A shard's term's share of the replica's producer ([`ShardProducer`]), and how a term's
//! share ends ([`settle`]).

use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounter;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::group::Deadline;
use crate::metrics::Metrics;
use crate::producer::{FlushError, Inbox, ProduceError, Producer, Receipt, Record, Refused, Tally};

/// The producer of one shard's term, a share of the replica's producer: its membership records
/// go to the shard's partition, every record carries the shard and the owner epoch (a stream's
/// records have them from its route; the others, such as retractions at a start, get them
/// here), and nothing is taken once the ownership deadline passed (its streams wait: the
/// replica holds) or the term is fenced or over (refused).
///
/// Every record it takes is counted in the term's [`Tally`] until reported: its flush waits
/// for the term's own records only (a handover does not wait for the other shards' traffic),
/// and a term that ends with records still counted has them purged ([`settle`]), so that none
/// of them lands after the next owner's.
pub(super) struct ShardProducer {
    pub(super) share: Share,
    pub(super) membership_topic: String,
    pub(super) shard: u32,
    pub(super) epoch: String,
    pub(super) deadline: Arc<Deadline>,
    pub(super) records: IntCounter,
}

impl Producer for ShardProducer {
    fn send(&self, record: &Record, receipt: Box<Receipt>) -> Result<(), Refused> {
        self.send_at(record, receipt, None, false)
    }

    /// A position goes to the shard's partition of the membership topic, as its members do,
    /// with its record in one call (see [`Producer::send_at`]).
    fn send_at(
        &self,
        record: &Record,
        mut receipt: Box<Receipt>,
        position: Option<Record>,
        more: bool,
    ) -> Result<(), Refused> {
        if self.share.closed.is_cancelled() {
            return Err(Refused::Failed(ProduceError::retriable(format!(
                "shard {}'s term is fenced or over on this replica: not producing for it",
                self.shard
            ))));
        }
        if self.deadline.passed() {
            // Held (see `Deadline`): a stream refused for good would rewind and replay (under
            // exactly once, its records in a transaction being committed would be published
            // again), though a renewal may yet prove ownership. It waits instead, until the
            // deadline is renewed or the term is fenced.
            return Err(Refused::Full(receipt));
        }
        let position = position.map(|p| self.pinned(p));
        self.records.inc();
        receipt.count_in(&self.share.tally);
        // A stream's records carry the headers already (its route says its shard).
        let pinned = record.topic == self.membership_topic;
        let inner = &self.share.inner;
        let sent = if !pinned && record.headers.get_bytes("ce_shard").is_some() {
            inner.send_at(record, receipt, position, more)
        } else {
            let mut record = record.clone();
            if pinned {
                record.partition = Some(self.shard.cast_signed());
            }
            record.headers.push("ce_shard", &[&self.shard.to_string()]);
            record.headers.push("ce_ownerepoch", &[&self.epoch]);
            inner.send_at(&record, receipt, position, more)
        };
        // A receipt handed back was not taken: it is not the term's to wait for.
        sent.map_err(|mut refused| {
            if let Refused::Full(r) | Refused::TooLarge(r) = &mut refused {
                r.uncount();
            }
            refused
        })
    }

    /// Waits for this term's records only.
    fn flush(&self, timeout: Duration) -> Result<(), FlushError> {
        if self.share.tally.wait(timeout) {
            return Ok(());
        }
        Err(FlushError::Undelivered {
            pending: self.share.tally.pending(),
        })
    }

    /// A fenced term's purge: the share takes nothing more first, so that no record its
    /// streams hand over while they stop is taken after the purge and delivered.
    fn purge(&self) {
        self.share.closed.cancel();
        self.share.inner.purge()
    }

    fn fatal(&self) -> Option<String> {
        self.share.inner.fatal()
    }

    fn transactional(&self) -> bool {
        self.share.inner.transactional()
    }

    fn positioned(&self, stream: &Arc<Inbox>, record: Record) {
        self.share.inner.positioned(stream, self.pinned(record));
    }

    fn rewound(&self, stream: &Arc<Inbox>) {
        self.share.inner.rewound(stream);
    }
}

impl ShardProducer {
    /// `record`, if of the membership topic, pinned to the shard's partition.
    fn pinned(&self, mut record: Record) -> Record {
        if record.topic == self.membership_topic {
            record.partition = Some(self.shard.cast_signed());
        }
        record
    }
}

/// A term's share of the replica's producer: the producer, the term's records not yet
/// reported, and whether the share still takes records ([`settle`] ends it).
#[derive(Clone)]
pub(super) struct Share {
    pub(super) inner: Arc<dyn Producer>,
    pub(super) tally: Arc<Tally>,
    /// Cancelled once the term is fenced or over: nothing more is taken.
    pub(super) closed: CancellationToken,
}

/// Ends a term's share of the producer, whatever stopped the term (a revoke in any phase,
/// a fence, a failure): records still unreported get what is left of the drain budget,
/// counted from the stop (`None`: the term ended by itself, nothing is waited for); any
/// still unreported then are purged, with every other record of the replica's producer
/// (their streams replay them from their checkpoints), so that none lands after the next
/// owner's records. Nothing more is taken for the shard.
pub(super) async fn settle(
    metrics: &Metrics,
    shard: u32,
    share: Share,
    stopped: Option<Instant>,
    drain: Duration,
) {
    let budget = stopped.map_or(Duration::ZERO, |at| {
        (at + drain).saturating_duration_since(Instant::now())
    });
    let drained = share.tally.settled(budget).await;
    share.closed.cancel();
    if drained {
        return;
    }
    tracing::error!(shard, undelivered = share.tally.pending(), "handing the shard over with records undelivered: purging this replica's producer so that none lands after the next owner's; the other shards replay theirs from their checkpoints");
    metrics.shard_handover_purges.inc();
    let _ = tokio::task::spawn_blocking(move || share.inner.purge()).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::producer::{Headers, Inbox, Sent};
    use crate::testing::Memory;

    fn record(topic: &str, headers: Headers) -> Record {
        Record {
            topic: topic.into(),
            key: "k".into(),
            value: b"{}".to_vec(),
            headers,
            tombstone: false,
            partition: None,
        }
    }

    fn receipt() -> Box<Receipt> {
        Receipt::new(Inbox::new(), 0, Sent::Join)
    }

    fn producer(memory: &Arc<Memory>, deadline: &Arc<Deadline>) -> ShardProducer {
        ShardProducer {
            share: Share {
                inner: memory.clone(),
                tally: Tally::new(),
                closed: CancellationToken::new(),
            },
            membership_topic: "m".into(),
            shard: 5,
            epoch: "7".into(),
            deadline: deadline.clone(),
            records: IntCounter::new("records", "records").unwrap(),
        }
    }

    #[test]
    fn a_shards_flush_waits_for_its_own_records_only() {
        let memory = Arc::new(Memory::new());
        let deadline = Arc::new(Deadline::new(Duration::from_secs(60)));
        deadline.renew(Instant::now());
        let p = producer(&memory, &deadline);
        // Another shard's record, stuck in the shared producer.
        memory.hold(true);
        memory
            .send(&record("pods", Headers::default()), receipt())
            .unwrap();
        assert!(memory.flush(Duration::ZERO).is_err());
        assert!(
            p.flush(Duration::ZERO).is_ok(),
            "none of its own is pending"
        );
        p.send(&record("pods", Headers::default()), receipt())
            .unwrap();
        assert_eq!(p.share.tally.pending(), 1);
        assert!(p.flush(Duration::from_millis(10)).is_err());
        // Reported (here purged): no longer pending.
        memory.purge();
        assert_eq!(p.share.tally.pending(), 0);
        assert!(p.flush(Duration::ZERO).is_ok());
    }

    #[test]
    fn a_closed_share_takes_nothing() {
        let memory = Arc::new(Memory::new());
        let deadline = Arc::new(Deadline::new(Duration::from_secs(60)));
        deadline.renew(Instant::now());
        let p = producer(&memory, &deadline);
        p.share.closed.cancel();
        assert!(matches!(
            p.send(&record("pods", Headers::default()), receipt()),
            Err(Refused::Failed(_))
        ));
        assert!(memory.log().is_empty());
    }

    #[test]
    fn a_shards_records_carry_it_and_its_members_go_to_its_partition() {
        let memory = Arc::new(Memory::new());
        let deadline = Arc::new(Deadline::new(Duration::from_secs(60)));
        deadline.renew(Instant::now());
        let p = producer(&memory, &deadline);
        p.send(&record("m", Headers::default()), receipt()).unwrap();
        p.send(&record("pods", Headers::default()), receipt())
            .unwrap();
        // A stream's record has them from its route already: passed as it is.
        let mut h = Headers::default();
        h.push("ce_shard", &["5"]);
        p.send(&record("pods", h), receipt()).unwrap();
        let log = memory.log();
        assert_eq!(
            log[0].partition,
            Some(5),
            "a member goes to its shard's partition"
        );
        assert_eq!(log[1].partition, None, "an event is placed by its key");
        for r in &log[..2] {
            assert_eq!(r.headers.get("ce_shard"), Some("5"));
            assert_eq!(r.headers.get("ce_ownerepoch"), Some("7"));
        }
        assert_eq!(log[2].headers.iter().count(), 1);
    }

    /// On paused time: a shard's producer takes nothing before ownership is first proven,
    /// takes records while it is, holds them back (full: its streams wait, none rewinds) from
    /// the instant the deadline passes unrenewed, in both delivery modes, and takes them again
    /// once renewed.
    #[tokio::test(start_paused = true)]
    async fn the_deadline_holds_records_back_on_the_clock() {
        let memory = Arc::new(Memory::new());
        let deadline = Arc::new(Deadline::new(Duration::from_secs(10)));
        let p = producer(&memory, &deadline);
        let held = |p: &ShardProducer| {
            matches!(
                p.send(&record("pods", Headers::default()), receipt()),
                Err(Refused::Full(_))
            )
        };
        assert!(held(&p));
        deadline.renew(Instant::now());
        tokio::time::advance(Duration::from_millis(9_999)).await;
        p.send(&record("pods", Headers::default()), receipt())
            .unwrap();
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(held(&p));
        assert_eq!(memory.log().len(), 1, "a record held back is not taken");
        deadline.renew(Instant::now());
        p.send(&record("pods", Headers::default()), receipt())
            .unwrap();
        assert_eq!(memory.log().len(), 2);
    }

    /// On paused time: a deadline held for a grace lapses that long after it passed, unless a
    /// renewal comes first; the next look follows the hold.
    #[tokio::test(start_paused = true)]
    async fn a_held_deadline_lapses_after_its_grace_unless_renewed() {
        let s = Duration::from_secs;
        let deadline = Deadline::new(s(5)).holding(s(5));
        deadline.renew(Instant::now());
        let start = Instant::now();
        assert_eq!(
            deadline.next_look(start),
            start + s(5),
            "proven: when it passes"
        );
        tokio::time::advance(s(5)).await;
        assert!(deadline.passed() && !deadline.lapsed(), "held");
        let now = Instant::now();
        assert_eq!(
            deadline.next_look(now),
            now + Duration::from_millis(100),
            "held: looked at often"
        );
        // A renewal sent before the deadline, answered late (a broker that stalled).
        deadline.renew(start + s(4));
        assert!(!deadline.passed(), "proven again: the hold ends");
        tokio::time::advance(s(4)).await;
        assert!(deadline.passed() && !deadline.lapsed());
        tokio::time::advance(Duration::from_millis(4_900)).await;
        assert_eq!(
            deadline.next_look(Instant::now()),
            start + s(14),
            "its lapse first"
        );
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(deadline.lapsed(), "no renewal within the grace: lapsed");
    }

    #[test]
    fn a_fenced_share_takes_nothing_after_its_purge() {
        let deadline = Arc::new(Deadline::new(Duration::from_secs(600)));
        deadline.renew(Instant::now());
        let memory = Arc::new(Memory::new());
        memory.hold(true);
        let p = producer(&memory, &deadline);
        p.send(&record("pods", Headers::default()), receipt())
            .unwrap();
        p.purge();
        assert!(matches!(
            p.send(&record("pods", Headers::default()), receipt()),
            Err(Refused::Failed(_))
        ));
        memory.release(crate::testing::Order::Sent);
        assert!(memory.log().is_empty(), "a record landed after the purge");
    }

    /// On paused time: a revoked term's records get what is left of the drain budget from the
    /// stop; reported within it, nothing is purged; still unreported at its end, the replica's
    /// producer is purged and the share takes nothing more.
    #[tokio::test(start_paused = true)]
    async fn a_handover_waits_out_the_drain_then_purges() {
        let deadline = Arc::new(Deadline::new(Duration::from_secs(600)));
        deadline.renew(Instant::now());
        let drain = Duration::from_secs(10);
        for delivered in [true, false] {
            let memory = Arc::new(Memory::new());
            memory.hold(true);
            let p = producer(&memory, &deadline);
            p.send(&record("pods", Headers::default()), receipt())
                .unwrap();
            let stopped = Instant::now();
            tokio::time::advance(Duration::from_secs(4)).await;
            let share = p.share.clone();
            let settling = tokio::spawn({
                let metrics = Metrics::new();
                async move {
                    settle(&metrics, 5, share, Some(stopped), drain).await;
                    metrics.shard_handover_purges.get()
                }
            });
            tokio::time::advance(Duration::from_millis(5_999)).await;
            assert!(!settling.is_finished(), "gave up before the budget ran out");
            if delivered {
                memory.release(crate::testing::Order::Sent);
            } else {
                tokio::time::advance(Duration::from_millis(1)).await;
            }
            let purges = settling.await.unwrap();
            assert_eq!(purges, u64::from(!delivered));
            assert_eq!(memory.held(), 0);
            assert_eq!(memory.log().len(), usize::from(delivered));
            assert!(p
                .send(&record("pods", Headers::default()), receipt())
                .is_err());
        }
    }
}
