//! The replicas' consumer group: which shards this replica owns, as Kafka's group coordinator
//! assigns them.
//!
//! The group subscribes to an empty topic with one partition per shard: partition `k` assigned
//! is shard `k` owned. Assignment is the coordinator's (cooperative: only moving shards stop);
//! nothing here allocates. Two threads of their own serve it, never the runtime's: the rebalance
//! callbacks block while shards hand over, and a runtime of one worker thread would deadlock.
//!
//! # Claims, epochs and the ownership deadline
//! A shard assigned is first claimed: its committed offset on the group's topic, plus one, is
//! committed as its new owner epoch. Commits are checked against the member's generation (its
//! epoch under KIP-848), so a successful one proves ownership when it was sent; every owner of a
//! shard has a higher epoch than the one before. The claimed shards are committed again every
//! [`RENEW`]; each success pushes the [`Deadline`] to `ownershipDeadlineMs` past when it was
//! sent. A replica whose deadline passes (cut from the coordinator, or frozen) must stop
//! producing for every shard it holds: it is the relay's to fence them.
//!
//! # Handover
//! A shard revoked is reported as [`Event::Revoked`] and the callback blocks until the relay says
//! its streams stopped, drained and wrote their final positions (bounded by the drain budget),
//! so the next owner starts from them. A lost assignment (the session expired) is reported the
//! same way with `lost`: nothing may be drained any more.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::mpsc;

use crate::config::{Config, GroupProtocol};

/// How often the claimed shards are committed again, renewing the ownership deadline.
pub const RENEW: Duration = Duration::from_secs(1);

/// How long a commit may take.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(5);

/// What the group tells the relay.
#[derive(Debug)]
pub enum Event {
    /// Shards now owned, each with its owner epoch.
    Claimed(Vec<(u32, u64)>),
    /// Shards taken away. The rebalance waits for `done` (or the drain budget): hand them over
    /// first. `lost`: the assignment was lost (the session expired); nothing may be written.
    Revoked {
        shards: Vec<u32>,
        lost: bool,
        done: std::sync::mpsc::SyncSender<()>,
    },
}

/// Until when this replica may act as the owner of its shards: pushed forward by every commit
/// the coordinator accepts.
#[derive(Debug)]
pub struct Deadline {
    base: Instant,
    /// Milliseconds past `base`.
    until: AtomicU64,
    span: Duration,
}

impl Deadline {
    fn new(span: Duration) -> Self {
        Self {
            base: Instant::now(),
            until: AtomicU64::new(0),
            span,
        }
    }

    /// A commit sent at `sent` succeeded.
    fn renew(&self, sent: Instant) {
        let until = (sent + self.span).duration_since(self.base).as_millis() as u64;
        self.until.fetch_max(until, Ordering::Relaxed);
    }

    /// Whether ownership can no longer be assumed.
    pub fn passed(&self) -> bool {
        self.base.elapsed().as_millis() as u64 >= self.until.load(Ordering::Relaxed)
    }

    /// How long until it passes (zero once it has).
    pub fn left(&self) -> Duration {
        let until = Duration::from_millis(self.until.load(Ordering::Relaxed));
        until.saturating_sub(self.base.elapsed())
    }
}

struct Context {
    topic: String,
    events: mpsc::UnboundedSender<Event>,
    /// Claimed shards and their epochs.
    owned: Mutex<BTreeMap<u32, u64>>,
    /// Assigned, not claimed yet.
    assigned: Mutex<Vec<u32>>,
    /// How long a revoke waits for the handover.
    handover: Duration,
}

impl ClientContext for Context {}

fn shards_of(tpl: &TopicPartitionList) -> Vec<u32> {
    tpl.elements()
        .iter()
        .filter_map(|e| u32::try_from(e.partition()).ok())
        .collect()
}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            if let Rebalance::Error(e) = rebalance {
                tracing::warn!(error = %e, "shard group rebalance error");
            }
            return;
        };
        let revoked = shards_of(tpl);
        self.assigned
            .lock()
            .expect("assigned lock poisoned")
            .retain(|s| !revoked.contains(s));
        let claimed: Vec<u32> = {
            let mut owned = self.owned.lock().expect("owned lock poisoned");
            revoked
                .iter()
                .filter(|s| owned.remove(s).is_some())
                .copied()
                .collect()
        };
        if claimed.is_empty() {
            return;
        }
        let lost = consumer.assignment_lost();
        let (done, wait) = std::sync::mpsc::sync_channel(1);
        let event = Event::Revoked {
            shards: claimed.clone(),
            lost,
            done,
        };
        if self.events.send(event).is_ok() && wait.recv_timeout(self.handover).is_err() {
            tracing::warn!(shards = ?claimed, "shards revoked before their handover finished");
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            let shards = shards_of(tpl);
            tracing::info!(topic = %self.topic, ?shards, "shards assigned");
            self.assigned
                .lock()
                .expect("assigned lock poisoned")
                .extend(shards);
        }
    }
}

/// This replica's membership in the group; [`Group::leave`] hands everything over and leaves.
pub struct Group {
    /// Until when this replica may act as the owner of what it claimed.
    pub deadline: Arc<Deadline>,
    consumer: Arc<BaseConsumer<Context>>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// The group's consumer settings: `cfg`'s connection, no offsets of its own committed.
fn settings(cfg: &Config, identity: &str) -> ClientConfig {
    let sharding = &cfg.sharding;
    let mut c = cfg.kafka.connection_config();
    c.set(
        "group.id",
        format!(
            "watchrelay.{}.{}",
            cfg.checkpoint.namespace, cfg.checkpoint.name
        ),
    )
    .set("client.id", format!("watchrelay-{identity}"))
    .set("enable.auto.commit", "false")
    .set("enable.auto.offset.store", "false")
    .set("enable.partition.eof", "false")
    .set("max.poll.interval.ms", "300000");
    match sharding.group_protocol {
        GroupProtocol::Classic => {
            c.set("group.protocol", "classic")
                .set("partition.assignment.strategy", "cooperative-sticky")
                .set(
                    "session.timeout.ms",
                    sharding.session_timeout_ms.to_string(),
                )
                .set(
                    "heartbeat.interval.ms",
                    (sharding.session_timeout_ms / 5).to_string(),
                );
        }
        GroupProtocol::Consumer => {
            c.set("group.protocol", "consumer");
        }
    }
    c
}

impl Group {
    /// Joins the group of `cfg`'s release as `identity`, subscribed to its shards' topic; what
    /// the group tells the relay comes in order on the receiver. `handover` bounds how long a
    /// revoke waits for the relay.
    pub fn join(
        cfg: &Config,
        identity: &str,
        handover: Duration,
    ) -> Result<(Self, mpsc::UnboundedReceiver<Event>), String> {
        let topic = cfg.sharding.owners_topic(&cfg.cluster_name);
        let (tx, events) = mpsc::unbounded_channel();
        let context = Context {
            topic: topic.clone(),
            events: tx,
            owned: Mutex::default(),
            assigned: Mutex::default(),
            handover,
        };
        let consumer: BaseConsumer<Context> = settings(cfg, identity)
            .create_with_context(context)
            .map_err(|e| format!("creating the shard group's consumer: {e}"))?;
        consumer
            .subscribe(&[&topic])
            .map_err(|e| format!("subscribing to {topic}: {e}"))?;
        let consumer = Arc::new(consumer);
        let deadline = Arc::new(Deadline::new(Duration::from_millis(u64::from(
            cfg.sharding.ownership_deadline_ms,
        ))));
        let stop = Arc::new(AtomicBool::new(false));
        let poller = {
            let (consumer, deadline, stop) = (consumer.clone(), deadline.clone(), stop.clone());
            std::thread::Builder::new()
                .name("shard-group".into())
                .spawn(move || poll(&consumer, &deadline, &stop))
                .map_err(|e| e.to_string())?
        };
        let renewer = {
            let (consumer, deadline, stop) = (consumer.clone(), deadline.clone(), stop.clone());
            std::thread::Builder::new()
                .name("shard-renew".into())
                .spawn(move || renew(&consumer, &deadline, &stop))
                .map_err(|e| e.to_string())?
        };
        let group = Self {
            deadline,
            consumer,
            stop,
            threads: vec![poller, renewer],
        };
        Ok((group, events))
    }

    /// Claims `shards` again, under new epochs, if the group still assigns them to this
    /// replica: after they were fenced while it may still own them.
    pub fn reclaim(&self, shards: &[u32]) {
        let cx = self.consumer.context();
        let mut assigned = cx.assigned.lock().expect("assigned lock poisoned");
        let mut owned = cx.owned.lock().expect("owned lock poisoned");
        for s in shards {
            if owned.remove(s).is_some() {
                assigned.push(*s);
            }
        }
    }

    /// Leaves the group: every owned shard is revoked (and handed over, while the relay still
    /// answers [`Event::Revoked`]) before this returns. Blocks.
    pub fn leave(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The offsets list of `shards` at their epochs.
fn epochs(topic: &str, shards: &BTreeMap<u32, u64>) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for (&shard, &epoch) in shards {
        let offset = Offset::Offset(i64::try_from(epoch).unwrap_or(i64::MAX));
        let _ = tpl.add_partition_offset(topic, shard.cast_signed(), offset);
    }
    tpl
}

/// Serves the group: rebalances, and claims of newly assigned shards; leaves when stopped.
fn poll(consumer: &BaseConsumer<Context>, deadline: &Deadline, stop: &AtomicBool) {
    let cx = consumer.context();
    let mut tried = Instant::now() - RENEW;
    while !stop.load(Ordering::Relaxed) {
        if let Some(Err(e)) = consumer.poll(Duration::from_millis(100)) {
            tracing::warn!(error = %e, "shard group");
        }
        let pending: Vec<u32> = cx.assigned.lock().expect("assigned lock poisoned").clone();
        if !pending.is_empty() && tried.elapsed() >= RENEW / 4 {
            tried = Instant::now();
            claim(consumer, deadline, &pending);
        }
    }
    // Leaving revokes every shard through the callback: each is handed over first.
    consumer.unsubscribe();
    let until = Instant::now() + cx.handover + Duration::from_secs(5);
    while Instant::now() < until
        && !(cx.owned.lock().expect("owned lock poisoned").is_empty()
            && consumer.assignment().map_or(true, |a| a.count() == 0))
    {
        let _ = consumer.poll(Duration::from_millis(100));
    }
}

/// Claims `shards`: reads their epochs and commits each one higher.
fn claim(consumer: &BaseConsumer<Context>, deadline: &Deadline, shards: &[u32]) {
    let cx = consumer.context();
    let mut tpl = TopicPartitionList::new();
    for &s in shards {
        tpl.add_partition(&cx.topic, s.cast_signed());
    }
    let committed = match consumer.committed_offsets(tpl, COMMIT_TIMEOUT) {
        Ok(c) => c,
        Err(e) => return tracing::warn!(error = %e, "reading the shards' epochs failed"),
    };
    let claims: BTreeMap<u32, u64> = committed
        .elements()
        .iter()
        .map(|e| {
            let before = match e.offset() {
                Offset::Offset(o) if o > 0 => o as u64,
                _ => 0,
            };
            (e.partition() as u32, before + 1)
        })
        .collect();
    let sent = Instant::now();
    match consumer.commit(&epochs(&cx.topic, &claims), CommitMode::Sync) {
        Ok(()) => {
            // A shard revoked meanwhile is not claimed: the revoke dropped it from `assigned`.
            let mut assigned = cx.assigned.lock().expect("assigned lock poisoned");
            let mut owned = cx.owned.lock().expect("owned lock poisoned");
            let claimed: Vec<(u32, u64)> = claims
                .into_iter()
                .filter(|(s, _)| assigned.contains(s))
                .collect();
            assigned.retain(|s| !claimed.iter().any(|(c, _)| c == s));
            owned.extend(claimed.iter().copied());
            deadline.renew(sent);
            let _ = cx.events.send(Event::Claimed(claimed));
        }
        Err(e) => tracing::warn!(error = %e, ?shards, "claiming shards failed; retrying"),
    }
}

/// Commits the claimed shards' epochs every [`RENEW`]: each success renews the deadline.
fn renew(consumer: &BaseConsumer<Context>, deadline: &Deadline, stop: &AtomicBool) {
    let cx = consumer.context();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(RENEW);
        let owned = cx.owned.lock().expect("owned lock poisoned").clone();
        if owned.is_empty() {
            continue;
        }
        let sent = Instant::now();
        match consumer.commit(&epochs(&cx.topic, &owned), CommitMode::Sync) {
            Ok(()) => deadline.renew(sent),
            Err(e) => {
                tracing::warn!(error = %e, left_ms = deadline.left().as_millis() as u64, "renewing shard ownership failed")
            }
        }
    }
}
