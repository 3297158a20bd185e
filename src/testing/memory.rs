//! A producer and a membership log in memory, for tests.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::membership::log::{Apply, Log, TopicError, TopicState};
use crate::producer::{
    DeliveryError, FlushError, ProduceError, Producer, Receipt, Record, Refused,
};

/// In what order [`Memory::release`] acknowledges the records it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// In the order they were sent, as one partition acknowledges them.
    Sent,
    /// Last sent first.
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

/// Deliveries to fail among those to topics starting with `prefix` (only tombstones, with
/// `tombstones`): `skip` of them let through first, then `fail` failed.
struct TopicFailures {
    prefix: String,
    tombstones: bool,
    skip: usize,
    fail: usize,
}

impl TopicFailures {
    /// Whether `record` fails, counting it.
    fn fails(&mut self, record: &Record) -> bool {
        if !record.topic.starts_with(self.prefix.as_str()) || (self.tombstones && !record.tombstone)
        {
            return false;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        let fails = self.fail > 0;
        self.fail = self.fail.saturating_sub(1);
        fails
    }
}

#[derive(Default)]
struct MemoryState {
    /// Delivered records and their place in the send order.
    log: Vec<(u64, Record)>,
    sent: u64,
    held: VecDeque<(u64, Record, Box<Receipt>)>,
    hold: bool,
    /// Holds only the records of topics starting with this.
    hold_topic: Option<String>,
    /// Holds only the records whose key starts with this.
    hold_key: Option<String>,
    capacity: Option<usize>,
    too_large: Option<(usize, bool)>,
    /// Releases holding a record larger than this fail whole, as a broker refuses a batch.
    batch_limit: Option<usize>,
    fail_next: usize,
    /// Fails some deliveries to topics starting with a prefix.
    fail_topic: Option<TopicFailures>,
    fatal: Option<String>,
    /// What `ensure_compacted` reports of each topic (created compacted when first asked).
    topics: std::collections::HashMap<String, TopicState>,
    /// What `ensure_compacted` fails with, when set.
    topic_error: Option<TopicError>,
    /// A pause before each record a replay hands over: a slow read.
    replay_pause: Option<Duration>,
    /// The topic whose replays fail, as one with a partition out of reach.
    unreadable: Option<String>,
    /// Records replays handed over.
    replayed: usize,
    /// Sends refused as [`Refused::Full`].
    refused_full: usize,
    /// Says it is transactional ([`Memory::transactional`]).
    transactional: bool,
}

impl Memory {
    /// A producer that acknowledges every record as it is sent.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many sends were refused because it was full ([`Memory::capacity`]).
    pub fn refused_full(&self) -> usize {
        self.state().refused_full
    }

    fn state(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.state.lock().expect("memory producer lock poisoned")
    }

    /// The place in the send order of the next record sent: what a transactional double
    /// takes for a record's offset when it hands it to its open transaction.
    pub(crate) fn next_place(&self) -> u64 {
        let mut s = self.state();
        s.sent += 1;
        s.sent
    }

    /// Delivers `records` at once, each at the place in the send order it was given: what a
    /// committed transaction makes readable.
    pub(crate) fn deliver(&self, records: Vec<(u64, Record)>) {
        self.state().log.extend(records);
    }

    /// Every record delivered so far, in the order it was sent.
    pub fn log(&self) -> Vec<Record> {
        let mut log = self.state().log.clone();
        log.sort_by_key(|(n, _)| *n);
        log.into_iter().map(|(_, r)| r).collect()
    }

    /// Says records become durable only with their transaction, as `delivery: exactlyOnce`'s
    /// producer does: what a stream hands over then needs no join acknowledged first. Reports
    /// still come as [`Memory::release`] orders them (a transaction's, across partitions, in
    /// any order).
    pub fn transactional(&self, on: bool) {
        self.state().transactional = on;
    }

    /// Holds records unacknowledged (`true`) or acknowledges them as they come (`false`).
    pub fn hold(&self, hold: bool) {
        self.state().hold = hold;
    }

    /// Holds the records of topics whose name starts with `prefix` (`None`: stops), as a
    /// partition below its minimum in-sync replicas would; the others go through.
    pub fn hold_to(&self, prefix: Option<&str>) {
        self.state().hold_topic = prefix.map(str::to_string);
    }

    /// Holds the records whose key starts with `prefix` (`None`: stops), as the partition of
    /// those keys would with its leader stalled; the others go through.
    pub fn hold_keys(&self, prefix: Option<&str>) {
        self.state().hold_key = prefix.map(str::to_string);
    }

    /// Records held, not yet acknowledged: the streams' and their membership records, not the
    /// copies of the checkpoint write counter, which come with every checkpoint write.
    pub fn held(&self) -> usize {
        let suffix = crate::membership::WRITES_SUFFIX;
        self.state()
            .held
            .iter()
            .filter(|(_, r, _)| !r.key.ends_with(suffix))
            .count()
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

    /// Fails the next `n` deliveries to topics whose name starts with `prefix`.
    pub fn fail_next_to(&self, prefix: &str, n: usize) {
        self.fail_to_after(prefix, 0, n);
    }

    /// Lets the next `skip` deliveries to topics whose name starts with `prefix` through, then
    /// fails `n` of them.
    pub fn fail_to_after(&self, prefix: &str, skip: usize, n: usize) {
        self.fail_topic(prefix, false, skip, n);
    }

    /// Fails the next `n` tombstones to topics whose name starts with `prefix` (other records
    /// to them go through).
    pub fn fail_next_tombstones_to(&self, prefix: &str, n: usize) {
        self.fail_topic(prefix, true, 0, n);
    }

    /// How many of the failures armed by [`Memory::fail_to_after`] or
    /// [`Memory::fail_next_tombstones_to`] are still to come.
    pub fn topic_failures_left(&self) -> usize {
        self.state().fail_topic.as_ref().map_or(0, |f| f.fail)
    }

    fn fail_topic(&self, prefix: &str, tombstones: bool, skip: usize, fail: usize) {
        self.state().fail_topic = Some(TopicFailures {
            prefix: prefix.to_string(),
            tombstones,
            skip,
            fail,
        });
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

    /// Fails every replay of `topic` (`None`: stops failing), as a topic with a partition
    /// without a leader.
    pub fn fail_replays_of(&self, topic: Option<&str>) {
        self.state().unreadable = topic.map(str::to_string);
    }

    /// Records replays handed over so far.
    pub fn replayed(&self) -> usize {
        self.state().replayed
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
                receipt.report(Err(DeliveryError::TooLarge {
                    key: Some(record.key.into_bytes()),
                    value: Some(record.value),
                }));
            } else {
                self.settle(n, record, receipt);
            }
        }
    }

    fn settle(&self, n: u64, record: Record, receipt: Box<Receipt>) {
        let result = {
            let mut s = self.state();
            let to_topic = s.fail_topic.as_mut().is_some_and(|f| f.fails(&record));
            if s.fail_next > 0 || to_topic {
                s.fail_next = s.fail_next.saturating_sub(usize::from(!to_topic));
                Err(DeliveryError::Failed(ProduceError::retriable(
                    "injected delivery failure",
                )))
            } else if s
                .too_large
                .is_some_and(|(max, late)| late && record.value.len() > max)
                || s.batch_limit.is_some_and(|max| record.value.len() > max)
            {
                Err(DeliveryError::TooLarge {
                    key: Some(record.key.clone().into_bytes()),
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
                s.refused_full += 1;
                return Err(Refused::Full(receipt));
            }
            s.sent += 1;
            let to_held = s
                .hold_topic
                .as_ref()
                .is_some_and(|p| record.topic.starts_with(p.as_str()))
                || s.hold_key
                    .as_ref()
                    .is_some_and(|p| record.key.starts_with(p.as_str()));
            (s.hold || to_held, s.sent)
        };
        if hold {
            self.state().held.push_back((n, record.clone(), receipt));
        } else {
            self.settle(n, record.clone(), receipt);
        }
        Ok(())
    }

    fn flush(&self, _timeout: Duration) -> Result<(), FlushError> {
        match self.held() {
            0 => Ok(()),
            pending => Err(FlushError::Undelivered { pending }),
        }
    }

    fn purge(&self) {
        let held: Vec<_> = self.state().held.drain(..).collect();
        purged(held.into_iter().map(|(_, _, receipt)| receipt));
    }

    fn fatal(&self) -> Option<String> {
        self.state().fatal.clone()
    }

    fn transactional(&self) -> bool {
        self.state().transactional
    }
}

/// Reports each of `receipts` as purged from the queue, as librdkafka's purge does.
fn purged(receipts: impl Iterator<Item = Box<Receipt>>) {
    for receipt in receipts {
        receipt.report(Err(DeliveryError::Failed(ProduceError::retriable(
            "purged from the queue",
        ))));
    }
}

impl Log for Memory {
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
        if self.state().unreadable.as_deref() == Some(topic) {
            return Err(TopicError::Other(format!(
                "{topic}: a partition has no leader"
            )));
        }
        for r in self.log().iter().filter(|r| r.topic == topic) {
            if stopped() {
                return Err(TopicError::Stopped);
            }
            if let Some(pause) = pause {
                std::thread::sleep(pause);
            }
            apply(r.key.as_bytes(), (!r.tombstone).then_some(&r.value[..]));
            self.state().replayed += 1;
        }
        Ok(())
    }
}

/// One replica's own producer over a shared [`Memory`], for tests of several replicas: the
/// records it holds ([`Lane::hold_to`]) reach the shared log only when released, in the order
/// of release, after whatever the other replicas delivered meanwhile, as a replica's backlog
/// for a partition that comes back does. Its purge drops only what it holds, as purging one
/// process's producer does. As a membership log it is the shared [`Memory`].
pub struct Lane {
    memory: Arc<Memory>,
    state: Mutex<LaneState>,
}

#[derive(Default)]
struct LaneState {
    held: VecDeque<(Record, Box<Receipt>)>,
    hold_topic: Option<String>,
}

impl Lane {
    /// A replica's producer delivering into `memory`.
    pub fn new(memory: Arc<Memory>) -> Arc<Self> {
        Arc::new(Self {
            memory,
            state: Mutex::default(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, LaneState> {
        self.state.lock().expect("lane lock poisoned")
    }

    /// Holds the records of topics whose name starts with `prefix` (`None`: stops), as a
    /// partition whose leader stalls; the others go through.
    pub fn hold_to(&self, prefix: Option<&str>) {
        self.state().hold_topic = prefix.map(str::to_string);
    }

    /// Records held, not yet delivered.
    pub fn held(&self) -> usize {
        self.state().held.len()
    }

    /// Delivers every held record now, in the order they were sent: under the lane's lock, so
    /// that a record sent meanwhile lands after them, as a partition's order has it (the
    /// shared memory never calls back into a lane).
    pub fn release(&self) {
        let mut s = self.state();
        while let Some((record, receipt)) = s.held.pop_front() {
            if let Err(refused) = self.memory.send(&record, receipt) {
                panic!("the shared memory refused a released record: {refused:?}");
            }
        }
    }
}

impl Producer for Lane {
    fn send(&self, record: &Record, receipt: Box<Receipt>) -> Result<(), Refused> {
        {
            let mut s = self.state();
            let stalled = s
                .hold_topic
                .as_ref()
                .is_some_and(|p| record.topic.starts_with(p.as_str()));
            // A partition's order: behind what is held, everything waits.
            if stalled || s.held.iter().any(|(r, _)| r.topic == record.topic) {
                s.held.push_back((record.clone(), receipt));
                return Ok(());
            }
        }
        self.memory.send(record, receipt)
    }

    fn flush(&self, _timeout: Duration) -> Result<(), FlushError> {
        match self.held() {
            0 => self.memory.flush(Duration::ZERO),
            pending => Err(FlushError::Undelivered { pending }),
        }
    }

    fn purge(&self) {
        let held: Vec<_> = self.state().held.drain(..).collect();
        purged(held.into_iter().map(|(_, receipt)| receipt));
    }

    fn fatal(&self) -> Option<String> {
        self.memory.fatal()
    }
}

impl Log for Lane {
    fn ensure_compacted(
        &self,
        topic: &str,
        partitions: i32,
        replication: Option<i32>,
    ) -> Result<TopicState, TopicError> {
        self.memory.ensure_compacted(topic, partitions, replication)
    }

    fn replay(
        &self,
        topic: &str,
        apply: &mut Apply<'_>,
        stopped: &(dyn Fn() -> bool + Sync),
    ) -> Result<(), TopicError> {
        self.memory.replay(topic, apply, stopped)
    }
}
