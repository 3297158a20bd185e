//! The group on Kafka: a consumer group over the shards' owners topic.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::mpsc;

use super::{Coordinator, Deadline, Event, GroupError, Membership};
use crate::config::{Config, GroupProtocol};

/// How often the claimed shards are committed again, renewing the ownership deadline.
const RENEW: Duration = Duration::from_secs(1);

/// How long a commit may take.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(5);

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

/// Kafka's group coordinator: a consumer group over the shards' owners topic.
pub struct Kafka;

/// This replica's membership in the Kafka group.
struct Group {
    deadline: Arc<Deadline>,
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
                // A tenth of the session: the survivors of a crash learn of the rebalance at
                // their next heartbeat after the eviction, so a shard of a dead replica waits
                // the session plus up to one heartbeat (a kill lands anywhere between two of
                // the dead replica's own). Joins and leaves are learnt just as late.
                .set(
                    "heartbeat.interval.ms",
                    (sharding.session_timeout_ms / 10).max(1).to_string(),
                );
        }
        GroupProtocol::Consumer => {
            c.set("group.protocol", "consumer");
        }
    }
    c
}

impl Coordinator for Kafka {
    /// Joins as a consumer subscribed to the release's shards' owners topic.
    fn join(
        &self,
        cfg: &Config,
        identity: &str,
        handover: Duration,
    ) -> Result<(Box<dyn Membership>, mpsc::UnboundedReceiver<Event>), GroupError> {
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
            .map_err(|e| GroupError::Client(e.to_string()))?;
        consumer
            .subscribe(&[&topic])
            .map_err(|e| GroupError::Subscribe {
                topic: topic.clone(),
                message: e.to_string(),
            })?;
        let consumer = Arc::new(consumer);
        let deadline = Arc::new(
            Deadline::new(Duration::from_millis(u64::from(
                cfg.sharding.ownership_deadline_ms,
            )))
            .holding(cfg.sharding.hold_grace()),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let poller = {
            let (consumer, deadline, stop) = (consumer.clone(), deadline.clone(), stop.clone());
            std::thread::Builder::new()
                .name("shard-group".into())
                .spawn(move || poll(&consumer, &deadline, &stop))
                .map_err(|source| GroupError::Thread {
                    thread: "poll",
                    source,
                })?
        };
        let renewer = {
            let (consumer, deadline, stop) = (consumer.clone(), deadline.clone(), stop.clone());
            std::thread::Builder::new()
                .name("shard-renew".into())
                .spawn(move || renew(&consumer, &deadline, &stop))
                .map_err(|source| GroupError::Thread {
                    thread: "renew",
                    source,
                })?
        };
        let group = Group {
            deadline,
            consumer,
            stop,
            threads: vec![poller, renewer],
        };
        Ok((Box::new(group), events))
    }

    /// Commits every shard's next epoch as a consumer outside the group (generation -1, which
    /// the classic protocol's client sends): the coordinator refuses such a commit with
    /// `UNKNOWN_MEMBER_ID` (or a rebalance or generation error) while the group has members,
    /// whichever protocol they speak.
    fn claim_idle(&self, cfg: &Config) -> Result<BTreeMap<u32, u64>, GroupError> {
        let topic = cfg.sharding.owners_topic(&cfg.cluster_name);
        let consumer: BaseConsumer = settings(cfg, "outside-the-group")
            .set("group.protocol", "classic")
            .create()
            .map_err(|e| GroupError::Client(e.to_string()))?;
        let shards: Vec<u32> = (0..cfg.sharding.shards).collect();
        let claims = raised(&consumer, &topic, &shards)
            .map_err(|e| GroupError::Claim(format!("reading the shards' epochs: {e}")))?;
        match consumer.commit(&epochs(&topic, &claims), CommitMode::Sync) {
            Ok(()) => Ok(claims),
            Err(e) => match e.rdkafka_error_code() {
                Some(
                    RDKafkaErrorCode::UnknownMemberId
                    | RDKafkaErrorCode::IllegalGeneration
                    | RDKafkaErrorCode::RebalanceInProgress
                    | RDKafkaErrorCode::StaleMemberEpoch,
                ) => Err(GroupError::Busy(e.to_string())),
                _ => Err(GroupError::Claim(e.to_string())),
            },
        }
    }
}

impl Membership for Group {
    fn deadline(&self) -> Arc<Deadline> {
        self.deadline.clone()
    }

    fn reclaim(&self, shards: &[u32]) {
        let cx = self.consumer.context();
        let mut assigned = cx.assigned.lock().expect("assigned lock poisoned");
        let mut owned = cx.owned.lock().expect("owned lock poisoned");
        for s in shards {
            if owned.remove(s).is_some() {
                assigned.push(*s);
            }
        }
    }

    fn leave(mut self: Box<Self>) {
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
    let mut fatal = false;
    while !stop.load(Ordering::Relaxed) {
        if let Some(Err(e)) = consumer.poll(Duration::from_millis(100)) {
            tracing::warn!(error = %e, "shard group");
        }
        // Read from the client on this thread, which polls anyway, and told once.
        if let (false, Some((code, reason))) = (fatal, consumer.client().fatal_error()) {
            fatal = true;
            let _ = cx.events.send(Event::Fatal(format!("{code:?}: {reason}")));
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
        // A client failed beyond repair hands nothing over: the group moves the shards once
        // this member's session expires. Said, rather than waited out in silence.
        if let Some((code, reason)) = consumer.client().fatal_error() {
            if !fatal {
                tracing::error!(error = %format!("{code:?}: {reason}"), "the shard group's Kafka consumer failed fatally while leaving; its shards move once its session expires");
            }
            break;
        }
    }
}

/// Claims `shards`: reads their epochs and commits each one higher.
fn claim(consumer: &BaseConsumer<Context>, deadline: &Deadline, shards: &[u32]) {
    let cx = consumer.context();
    let claims = match raised(consumer, &cx.topic, shards) {
        Ok(c) => c,
        Err(e) => return tracing::warn!(error = %e, "reading the shards' epochs failed"),
    };
    let sent = tokio::time::Instant::now();
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

/// The epochs of `shards` as a claim makes them: each one above the epoch its committed offset
/// on `topic` holds.
fn raised<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    shards: &[u32],
) -> rdkafka::error::KafkaResult<BTreeMap<u32, u64>> {
    let mut tpl = TopicPartitionList::new();
    for &s in shards {
        tpl.add_partition(topic, s.cast_signed());
    }
    let committed = consumer.committed_offsets(tpl, COMMIT_TIMEOUT)?;
    Ok(committed
        .elements()
        .iter()
        .map(|e| {
            let before = match e.offset() {
                Offset::Offset(o) if o > 0 => o as u64,
                _ => 0,
            };
            (e.partition() as u32, before + 1)
        })
        .collect())
}

/// Commits the claimed shards' epochs every [`RENEW`]: each success renews the deadline, and
/// one that took [`RENEW`] or more (a broker stalling) is logged with what is left of it.
fn renew(consumer: &BaseConsumer<Context>, deadline: &Deadline, stop: &AtomicBool) {
    let cx = consumer.context();
    // Every RENEW from the last sending: one answered late (a broker that stalled) is followed
    // at once by the next, which may end a hold.
    let mut next = tokio::time::Instant::now() + RENEW;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(next.saturating_duration_since(tokio::time::Instant::now()));
        let sent = tokio::time::Instant::now();
        next = sent + RENEW;
        let owned = cx.owned.lock().expect("owned lock poisoned").clone();
        if owned.is_empty() {
            continue;
        }
        match consumer.commit(&epochs(&cx.topic, &owned), CommitMode::Sync) {
            Ok(()) => {
                deadline.renew(sent);
                let took = sent.elapsed();
                if took >= RENEW {
                    tracing::warn!(
                        took_ms = took.as_millis() as u64,
                        left_ms = deadline.left().as_millis() as u64,
                        "renewing shard ownership was slow"
                    );
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, left_ms = deadline.left().as_millis() as u64, "renewing shard ownership failed")
            }
        }
    }
}
