//! Scale-out: this replica relays the shards the consumer group assigns it, each as a term of
//! its own.
//!
//! A shard's term is today's term cut to the shard: its streams (see
//! [`crate::config::ShardingConfig::shard_of_stream`]), its own checkpoint ConfigMap
//! (`<checkpoint.name>-s<k>`, stamped with the owner epoch so a deposed owner's write fails),
//! its own membership owner and its own partition `k` of the shards' membership topic, which
//! its restore alone reads, to an end marker it wrote. Every record it produces carries the shard
//! and the owner epoch (envelope metadata and `ce_shard`, `ce_ownerepoch` headers). Before its
//! first term, a shard copies its share of a single leader's state (`migrate.rs`).
//!
//! # A shard's lifecycle
//! Each shard's phase is decided by the pure machine in `lifecycle.rs` (claimed, starting,
//! running, revoking, fenced, lost, ended); [`Book`] feeds it what the group, the clock and the
//! shard's term report and performs its actions:
//! - **Claimed** ([`Event::Claimed`]): the owner epoch is stamped on the shard's ConfigMap
//!   (above every one stamped before), then its term starts: restore, then its streams.
//! - **Revoked** (not lost): its term stops as at a shutdown (streams drain, the term's own
//!   records are awaited, the final positions are written), then the group is answered and the
//!   rebalance goes on: the next owner resumes exactly there. Records of the term still
//!   undelivered then are purged first, so none lands after the next owner's.
//! - **Fenced** (the ownership deadline passed, or its writer found a newer owner) and **lost**
//!   (the assignment was lost): its term stops without draining, the producer's queued and
//!   in-flight records are purged and nothing more is written. A fenced shard is claimed
//!   again, under a new epoch, if the group still assigns it here.
//! - A shard claimed again while its previous term still stops starts once that one ended.
//!
//! A stop of the process leaves the group: every shard is handed over first. So does a replica
//! whose API server has not answered for `sharding.apiUnreachableSeconds`, which joins again
//! once it answers.
//!
//! # The loop
//! [`Relay::membership`] executes: it waits for what can happen and feeds it to [`Book`], then
//! performs what the book leaves to it (starting terms, claiming again). Nothing is polled:
//! - the group's [`Event`]s (claims, revokes, a fatal error of its client);
//! - each term's end, and its report (with its shard and claimed epoch) that every stream it
//!   started watches, which completes the takeover;
//! - the clock, only when the book asks for it ([`Book::next_look`]): the ownership deadline
//!   while a term may still produce, a claim due again, and the API server's silence reaching
//!   its grace while terms run. A deadline renewed meanwhile is looked at again, later.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use prometheus::IntCounter;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::lifecycle::{self, Action, Input, Phase};
use super::migrate::{LegacyCell, Target};
use super::others::{self, Others};
use super::reach::{Reach, PROBE};
use super::term::{Run, Term};
use super::{Relay, RelayError, Sink, RETRY};
use crate::checkpoint::{Ownership, Store};
use crate::config::{Config, ShardingConfig, CHECKPOINT_RESERVE};
use crate::envelope::ShardOwner;
use crate::group::{Deadline, Event, GroupError, Membership};
use crate::membership::{self, Log, Owner};
use crate::metrics::Metrics;
use crate::producer::{FlushError, ProduceError, Producer, Receipt, Record, Refused, Tally};
use crate::registry::Role;

/// A shard the group assigned this replica, with its owner epoch.
struct Claim {
    shard: u32,
    epoch: u64,
}

/// A shard's term, as the loop keeps it.
struct Running {
    stop: CancellationToken,
    fenced: CancellationToken,
    /// When it was claimed.
    claimed: Instant,
}

/// The producer of one shard's term, a share of the replica's producer: its membership records
/// go to the shard's partition, every record carries the shard and the owner epoch (a stream's
/// records have them from its route; the others, such as retractions at a start, get them
/// here), and nothing is taken once the ownership deadline passed or the term is fenced or
/// over.
///
/// Every record it takes is counted in the term's [`Tally`] until reported: its flush waits
/// for the term's own records only (a handover does not wait for the other shards' traffic),
/// and a term that ends with records still counted has them purged ([`settle`]), so that none
/// of them lands after the next owner's.
struct ShardProducer {
    share: Share,
    membership_topic: String,
    shard: u32,
    epoch: String,
    deadline: Arc<Deadline>,
    records: IntCounter,
}

impl Producer for ShardProducer {
    fn send(&self, record: &Record, mut receipt: Box<Receipt>) -> Result<(), Refused> {
        if self.deadline.passed() || self.share.closed.is_cancelled() {
            return Err(Refused::Failed(ProduceError::retriable(format!(
                "this replica cannot prove it still owns shard {}: not producing for it",
                self.shard
            ))));
        }
        self.records.inc();
        receipt.count_in(&self.share.tally);
        // A stream's records carry the headers already (its route says its shard).
        let pinned = record.topic == self.membership_topic;
        let inner = &self.share.inner;
        let sent = if !pinned && record.headers.get_bytes("ce_shard").is_some() {
            inner.send(record, receipt)
        } else {
            let mut record = record.clone();
            if pinned {
                record.partition = Some(self.shard.cast_signed());
            }
            record.headers.push("ce_shard", &[&self.shard.to_string()]);
            record.headers.push("ce_ownerepoch", &[&self.epoch]);
            inner.send(&record, receipt)
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
}

/// A term's share of the replica's producer: the producer, the term's records not yet
/// reported, and whether the share still takes records ([`settle`] ends it).
#[derive(Clone)]
struct Share {
    inner: Arc<dyn Producer>,
    tally: Arc<Tally>,
    /// Cancelled once the term is fenced or over: nothing more is taken.
    closed: CancellationToken,
}

/// Why a membership in the group ended.
enum Left {
    /// The relay was shut down.
    Shutdown,
    /// The API server was out of reach: the shards were given up until it is back.
    Unreachable,
}

/// What every membership of this replica shares.
struct Member {
    producer: Arc<dyn Producer>,
    log: Arc<dyn Log>,
    identity: String,
    legacy: LegacyCell,
    /// Whether this replica relays shard 0, and so passes resync requests on.
    passes: Arc<AtomicBool>,
    /// Other releases' live claims in the single-leader topic and every partition of the
    /// shards' topic, read once at the replica's start (`None` until read): what each shard's
    /// streams are checked against beyond its own partition.
    others: tokio::sync::watch::Receiver<Option<Arc<[membership::Claim]>>>,
}

impl Relay {
    /// Relays the shards this replica owns until shut down, then hands them over and leaves
    /// the group. A replica that cannot reach the API server for
    /// `sharding.apiUnreachableSeconds` leaves the group too (its shards go to replicas that
    /// can relay them) and joins again once it answers.
    pub(super) async fn run_sharded(&self) -> Result<(), RelayError> {
        let cfg = &self.cfg;
        self.registry.begin_term(Role::Member);
        let (producer, log) = self.sink()?;
        if !self.ensure_topics(&log).await {
            return Ok(());
        }
        // No replica of the single-leader version may lead once shards run.
        let le = &cfg.leader_election;
        let lease_ns = cfg.lease_namespace();
        let mut elector = crate::leader::Elector::new(self.client.clone(), lease_ns, le);
        if !elector.park(&self.shutdown).await {
            return Ok(());
        }
        let mut topics = vec![cfg.sharding.topic(&cfg.cluster_name)];
        let single = cfg.checkpoint.membership.topic(&cfg.cluster_name);
        if !topics.contains(&single) {
            topics.push(single);
        }
        // Read while the replica joins, not before: a partition out of reach (its leader
        // stalled) must not keep the replica out of the group, and only a term's streams need
        // the claims. Failing past its session, the terms' streams start unchecked against
        // them (with a warning) and the read goes on: terms started after it check them.
        let (found, others) = tokio::sync::watch::channel(None);
        let read = async {
            let c = &cfg.checkpoint;
            let stop = &self.shutdown;
            let wait = others::claims_wait(&cfg.sharding);
            let read = match others::read(c, &log, &topics, Some(wait), stop).await {
                Some(read) => Some(read),
                None if stop.is_cancelled() => None,
                None => {
                    tracing::warn!(?topics, wait_seconds = wait.as_secs(), "other releases' claims still unread: this replica's streams start unchecked against them until they are read");
                    let _ = found.send(Some(Arc::from([])));
                    others::read(c, &log, &topics, None, stop).await
                }
            };
            if let Some(read) = read {
                let _ = found.send(Some(read.others));
            }
            std::future::pending::<()>().await;
        };
        let member = Member {
            producer,
            log: log.clone(),
            identity: crate::leader::identity(&cfg.leader_election),
            legacy: LegacyCell::default(),
            passes: Arc::default(),
            others,
        };
        tokio::select! {
            relayed = self.memberships(&member) => relayed,
            () = read => unreachable!("the read waits forever once done"),
        }
    }

    /// Memberships in the group, one after another, until shut down.
    async fn memberships(&self, member: &Member) -> Result<(), RelayError> {
        let cfg = &self.cfg;
        let passing = CancellationToken::new();
        let _passing = passing.clone().drop_guard();
        tokio::spawn(pass_on_resyncs(
            self.client.clone(),
            cfg.clone(),
            member.passes.clone(),
            passing,
        ));
        let probing = CancellationToken::new();
        let _probing = probing.clone().drop_guard();
        let reach = Reach::start(self.probe.clone(), probing);
        let grace = Duration::from_secs(u64::from(cfg.sharding.api_unreachable_seconds));
        loop {
            match self.membership(member, &reach).await? {
                Left::Shutdown => return Ok(()),
                Left::Unreachable => {
                    tracing::warn!("gave the shards up: the API server is out of reach; joining again once it answers");
                    while reach.silent() >= grace.min(PROBE * 2) {
                        tokio::select! {
                            _ = self.shutdown.cancelled() => return Ok(()),
                            _ = tokio::time::sleep(PROBE) => {}
                        }
                    }
                }
            }
        }
    }

    /// One membership in the group: joins, relays the shards it is given, and leaves (handing
    /// every shard over) when shut down or cut from the API server.
    async fn membership(&self, member: &Member, reach: &Reach) -> Result<Left, RelayError> {
        let cfg = &self.cfg;
        let Member {
            identity, passes, ..
        } = member;
        let handover = cfg.drain_time() + CHECKPOINT_RESERVE;
        let grace = Duration::from_secs(u64::from(cfg.sharding.api_unreachable_seconds));
        let joined = {
            let (cfg, identity, coordinator) =
                (cfg.clone(), identity.clone(), self.coordinator.clone());
            tokio::task::spawn_blocking(move || coordinator.join(&cfg, &identity, handover))
                .await
                .map_err(|e| GroupError::Panicked(e.to_string()))?
        };
        let (group, mut events) = joined?;
        tracing::info!(%identity, shards = cfg.sharding.shards, "joined the shard group");
        self.metrics.shards.set(i64::from(cfg.sharding.shards));
        // A member relays: the leader gauge says so, as without election.
        self.metrics.leader.set(1);
        let deadline = group.deadline();
        let mut group = Some(group);
        let mut leaving: Option<(Left, tokio::task::JoinHandle<()>)> = None;
        let leave = |why: Left, group: &mut Option<Box<dyn Membership>>| {
            let g = group.take().expect("the group is left once");
            Some((why, tokio::task::spawn_blocking(move || g.leave())))
        };
        let mut terms = FuturesUnordered::new();
        let mut book = Book::default();
        // Each term says here, with its shard and claimed epoch, once its streams all watch.
        let (reports, mut watching) = mpsc::unbounded_channel();
        let left = loop {
            // What the machine asks of the loop itself: terms to start, shards to claim again.
            let mut todo: Vec<(u32, Action)> = Vec::new();
            let now = Instant::now();
            let unreachable = (leaving.is_none() && !grace.is_zero())
                .then(|| now + grace.saturating_sub(reach.silent()));
            let look = book.next_look(now + deadline.left(), unreachable);
            tokio::select! {
                _ = self.shutdown.cancelled(), if leaving.is_none() => {
                    tracing::info!("leaving the shard group: handing every shard over");
                    leaving = leave(Left::Shutdown, &mut group);
                }
                _ = async { (&mut leaving.as_mut().expect("guarded").1).await }, if leaving.is_some() => {
                    break leaving.take().expect("guarded").0;
                }
                Some(event) = events.recv() => match event {
                    Event::Claimed(claims) => {
                        let claimed: Vec<u32> = claims.iter().map(|(s, _)| *s).collect();
                        let release = Store::new(self.client.clone(), &cfg.checkpoint.namespace, &cfg.checkpoint.name);
                        let who = identity.clone();
                        tokio::spawn(async move {
                            if let Err(e) = release.record_shard_owner(&claimed, &who).await {
                                tracing::warn!(error = %e, "recording the claimed shards in the checkpoint ConfigMap failed");
                            }
                        });
                        for (shard, epoch) in claims {
                            self.metrics.shard_rebalances.with_label_values(&["claimed"]).inc();
                            tracing::info!(shard, epoch, "claimed shard");
                            todo.extend(book.feed(shard, Input::Claimed(epoch), &self.metrics));
                        }
                    }
                    Event::Fatal(e) => self.registry.fail(format!("the shard group's Kafka consumer failed fatally: {e}")),
                    Event::Revoked { shards, lost, done } => {
                        let kind = if lost { "lost" } else { "revoked" };
                        tracing::info!(?shards, kind, "shards revoked");
                        let input = if lost { Input::Lost } else { Input::Revoked };
                        book.handovers.push(Handover { pending: shards.iter().copied().collect(), done, revoked: Instant::now() });
                        for shard in shards {
                            self.metrics.shard_rebalances.with_label_values(&[kind]).inc();
                            todo.extend(book.feed(shard, input, &self.metrics));
                        }
                        // Shards with no term are handed over at once.
                        book.answer(&self.metrics.shard_handover_seconds);
                    }
                },
                Some((shard, result)) = terms.next(), if !terms.is_empty() => {
                    book.terms.remove(&shard);
                    let part = self.cfg.sharding.clone();
                    self.registry.forget(&move |id| part.shard_of_stream(id) == shard);
                    if let Err(e) = result {
                        tracing::error!(shard, error = %e, "shard term failed");
                    }
                    todo.extend(book.feed(shard, Input::TermEnded, &self.metrics));
                    book.answer(&self.metrics.shard_handover_seconds);
                }
                Some((shard, epoch)) = watching.recv() => {
                    todo.extend(book.feed(shard, Input::Watching(epoch), &self.metrics));
                }
                _ = tokio::time::sleep_until(look.unwrap_or(now)), if look.is_some() => {
                    let unfenced = book.unfenced();
                    if !unfenced.is_empty() && deadline.passed() {
                        self.metrics.shard_fences.inc();
                        tracing::error!(shards = ?unfenced, "could not prove ownership of the shards in time: fenced, purging the producer; claiming them again if still assigned");
                        for shard in unfenced {
                            todo.extend(book.feed(shard, Input::Fence, &self.metrics));
                        }
                    }
                    for shard in book.due(Instant::now()) {
                        tracing::warn!(shard, "claiming again a shard whose term ended unasked");
                        todo.extend(book.feed(shard, Input::ReclaimDue, &self.metrics));
                    }
                    if leaving.is_none() && !grace.is_zero() && !book.terms.is_empty() && reach.silent() >= grace {
                        tracing::error!(silent_seconds = reach.silent().as_secs(), "the API server has not answered for sharding.apiUnreachableSeconds: leaving the shard group so other replicas relay these shards");
                        leaving = leave(Left::Unreachable, &mut group);
                    }
                }
            }
            let mut reclaim = Vec::new();
            for (shard, action) in todo {
                match action {
                    Action::Start(epoch) => {
                        let (run, term) =
                            self.start_shard(Claim { shard, epoch }, member, &deadline, &reports);
                        book.terms.insert(shard, run);
                        terms.push(term);
                    }
                    Action::Reclaim => reclaim.push(shard),
                    _ => {}
                }
            }
            if let (false, Some(g)) = (reclaim.is_empty(), &group) {
                g.reclaim(&reclaim);
            }
            passes.store(
                book.phases.get(&0).is_some_and(|p| p.relaying()),
                Ordering::Relaxed,
            );
            self.metrics
                .shards_owned
                .set(i64::try_from(book.terms.len()).unwrap_or(i64::MAX));
        };
        passes.store(false, Ordering::Relaxed);
        // A handover the group stopped waiting for: stop what still runs.
        for run in book.terms.values() {
            run.stop.cancel();
        }
        while terms.next().await.is_some() {}
        self.metrics.shards_owned.set(0);
        self.metrics.leader.set(0);
        tracing::info!("left the shard group");
        Ok(left)
    }

    /// Creates the group's topic and the shards' membership topic unless they exist, and
    /// checks each has one partition per shard; retried until they do. `false` when shut down
    /// first.
    async fn ensure_topics(&self, log: &Arc<dyn Log>) -> bool {
        let sharding = &self.cfg.sharding;
        let cluster = &self.cfg.cluster_name;
        let shards = sharding.shards.cast_signed();
        let replication = self.cfg.checkpoint.membership.replication_factor;
        'retry: loop {
            for topic in [sharding.owners_topic(cluster), sharding.topic(cluster)] {
                let (log, t) = (log.clone(), topic.clone());
                let state = tokio::task::spawn_blocking(move || {
                    log.ensure_compacted(&t, shards, replication)
                })
                .await;
                let problem = match state {
                    Ok(Ok(s)) if s.partitions == shards as usize => continue,
                    Ok(Ok(s)) => format!(
                        "topic {topic} has {} partitions, not sharding.shards ({shards}): shards cannot change once their topics exist",
                        s.partitions
                    ),
                    Ok(Err(e)) => format!("topic {topic}: {e}"),
                    Err(e) => e.to_string(),
                };
                self.registry.block(Some(problem));
                tokio::select! {
                    _ = self.shutdown.cancelled() => return false,
                    _ = tokio::time::sleep(RETRY) => continue 'retry,
                }
            }
            self.registry.block(None);
            return true;
        }
    }

    /// Starts the term of a claimed shard: its share of a single-leader release's state copied
    /// first, if that was not done yet.
    fn start_shard<'a>(
        &'a self,
        claim: Claim,
        member: &Member,
        deadline: &Arc<Deadline>,
        reports: &mpsc::UnboundedSender<(u32, u64)>,
    ) -> (
        Running,
        impl std::future::Future<Output = (u32, Result<(), RelayError>)> + 'a,
    ) {
        let Claim { shard, epoch } = claim;
        let cfg = &self.cfg;
        let share = Share {
            inner: member.producer.clone(),
            tally: Tally::new(),
            closed: CancellationToken::new(),
        };
        let (log, identity, deadline) = (
            member.log.clone(),
            member.identity.clone(),
            deadline.clone(),
        );
        let others = member.others.clone();
        let run = Running {
            stop: CancellationToken::new(),
            fenced: CancellationToken::new(),
            claimed: Instant::now(),
        };
        let (stop, fenced, legacy) = (run.stop.clone(), run.fenced.clone(), member.legacy.clone());
        let was_fenced = fenced.clone();
        let drain = cfg.drain_time();
        let reports = reports.clone();
        let watching: Box<dyn FnOnce() + Send + Sync> = Box::new(move || {
            let _ = reports.send((shard, epoch));
        });
        let term = async move {
            let stopped = {
                let stop = stop.clone();
                tokio::spawn(async move {
                    stop.cancelled().await;
                    Instant::now()
                })
            };
            let result = match self.stamp_epoch(shard, epoch, &identity, &stop).await {
                Some(epoch) => {
                    let others = Others::Reading(others);
                    let (mut plan, old_log) = self.plan(
                        ShardOwner { shard, epoch },
                        &share,
                        &log,
                        &identity,
                        &deadline,
                        others,
                    );
                    plan.watching = Some(watching);
                    self.shard_term(shard, plan, &legacy, &old_log, stop, fenced)
                        .await
                }
                None => Ok(()),
            };
            // A fenced term's records get no drain budget: they are purged.
            let stopped = match stopped.is_finished() && !was_fenced.is_cancelled() {
                true => stopped.await.ok(),
                false => {
                    stopped.abort();
                    None
                }
            };
            settle(&self.metrics, shard, share, stopped, drain).await;
            (shard, result)
        };
        (run, term)
    }

    /// The owner epoch of this claim of `shard`, stamped on the shard's ConfigMap (see
    /// [`Store::claim_epoch`]): what the group gave, or above every epoch stamped before.
    /// Tried again until it lands; `None` once `stop` fires first.
    async fn stamp_epoch(
        &self,
        shard: u32,
        claimed: u64,
        identity: &str,
        stop: &CancellationToken,
    ) -> Option<u64> {
        let cfg = &self.cfg;
        let name = ShardingConfig::configmap(&cfg.checkpoint.name, shard);
        let store = Store::new(self.client.clone(), &cfg.checkpoint.namespace, &name);
        loop {
            let stamped = tokio::select! {
                _ = stop.cancelled() => return None,
                stamped = store.claim_epoch(identity, claimed) => stamped,
            };
            match stamped {
                Ok(epoch) => {
                    if epoch != claimed {
                        tracing::warn!(shard, claimed, epoch, "the group's epoch is not above the one stamped on the shard's ConfigMap (its committed offsets were lost?): relaying under an epoch above the stamp");
                    }
                    return Some(epoch);
                }
                Err(e) => {
                    tracing::warn!(shard, error = %e, "stamping the owner epoch on the shard's ConfigMap failed; retrying")
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = tokio::time::sleep(RETRY) => {}
            }
        }
    }

    /// What a term of `shard` under `epoch` works with, and the single leader's membership
    /// log its copy reads.
    fn plan(
        &self,
        owner: ShardOwner,
        share: &Share,
        log: &Arc<dyn Log>,
        identity: &str,
        deadline: &Arc<Deadline>,
        others: Others,
    ) -> (Term, Arc<dyn Log>) {
        let ShardOwner { shard, epoch } = owner;
        let cfg = &self.cfg;
        let sharding = cfg.sharding.clone();
        let name = ShardingConfig::configmap(&cfg.checkpoint.name, shard);
        let membership_topic = sharding.topic(&cfg.cluster_name);
        let (shard_log, old_log): (Arc<dyn Log>, Arc<dyn Log>) = match &self.sink {
            Sink::Kafka => (
                Arc::new(membership::log::Kafka::new(&cfg.kafka).partition(shard.cast_signed())),
                Arc::new(membership::log::Kafka::new(&cfg.kafka)),
            ),
            Sink::Given(..) => (log.clone(), log.clone()),
        };
        let producer: Arc<dyn Producer> = Arc::new(ShardProducer {
            share: share.clone(),
            membership_topic: membership_topic.clone(),
            shard,
            epoch: epoch.to_string(),
            deadline: deadline.clone(),
            records: self
                .metrics
                .shard_records
                .with_label_values(&[&shard.to_string()]),
        });
        let plan = Term {
            producer,
            log: shard_log,
            store: Store::new(self.client.clone(), &cfg.checkpoint.namespace, &name).owned(
                Ownership {
                    replica: identity.to_string(),
                    epoch,
                },
            ),
            owner: Owner::new(&cfg.checkpoint.namespace, &name),
            membership_topic,
            partitions: sharding.shards.cast_signed(),
            part: Arc::new(move |id| sharding.shard_of_stream(id) == shard),
            shard: Some(owner),
            others,
            watching: None,
        };
        (plan, old_log)
    }

    /// A shard's term: its share of a single leader's state copied first, if that was not done
    /// yet, then the term itself ([`Run`]).
    async fn shard_term(
        &self,
        shard: u32,
        plan: Term,
        legacy: &LegacyCell,
        old_log: &Arc<dyn Log>,
        stop: CancellationToken,
        fenced: CancellationToken,
    ) -> Result<(), RelayError> {
        loop {
            let to = Target {
                shard,
                producer: &plan.producer,
                store: &plan.store,
                owner: &plan.owner,
                topic: &plan.membership_topic,
            };
            // A shard revoked while it copies stops at once: the copy is repeated by whoever
            // owns it next.
            let copied = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                copied = self.migrate(to, legacy, old_log, &stop) => copied,
            };
            let Err(e) = copied else {
                break;
            };
            tracing::warn!(shard, error = %e, "copying the single-leader state failed; retrying");
            tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = tokio::time::sleep(RETRY) => {}
            }
        }
        Run::new(self, plan, stop, fenced).run().await
    }
}

/// Passes the resync requests set on the release's checkpoint ConfigMap (`kubectl annotate`,
/// as without sharding) on to every shard's ConfigMap, whose owners take them, until `stop`.
/// The ConfigMap is created if missing, so there is one to annotate. Every replica runs this,
/// but only the one relaying shard 0 (`passes`) passes requests on, so a request is passed on
/// once (twice at worst, while shard 0 moves, or after a crash in between).
async fn pass_on_resyncs(
    client: kube::Client,
    cfg: Arc<Config>,
    passes: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    let ns = &cfg.checkpoint.namespace;
    let release = Store::new(client.clone(), ns, &cfg.checkpoint.name);
    if let Err(e) = release.create_if_missing().await {
        tracing::warn!(error = %e, "creating the checkpoint ConfigMap, where resync requests are set, failed");
    }
    let shards: Vec<Store> = cfg
        .sharding
        .configmaps(&cfg.checkpoint.name)
        .iter()
        .map(|name| Store::new(client.clone(), ns, name))
        .collect();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(super::term::writer::RESYNC_POLL) => {}
        }
        if !passes.load(Ordering::Relaxed) {
            continue;
        }
        match release.pass_on_resync_request(&shards).await {
            Ok(Some(what)) => {
                tracing::info!(%what, shards = shards.len(), "passed a resync request on to every shard")
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "passing a resync request on to the shards failed")
            }
        }
    }
}

/// A revocation waiting for its shards' terms to end.
struct Handover {
    /// Its shards whose part is not done yet.
    pending: BTreeSet<u32>,
    done: std::sync::mpsc::SyncSender<()>,
    revoked: Instant,
}

/// The shards of one membership in the group, as this replica holds them: each one's phase of
/// its lifecycle ([`lifecycle::step`] decides every change; nothing else does), the handle of
/// its term while one runs, the revokes waiting for their shards, and when to claim again the
/// shards whose term ended unasked.
#[derive(Default)]
struct Book {
    phases: BTreeMap<u32, Phase>,
    terms: HashMap<u32, Running>,
    handovers: Vec<Handover>,
    reclaims: BTreeMap<u32, Instant>,
}

impl Book {
    /// Steps `shard`'s lifecycle on `input` and performs what concerns its term and the
    /// revokes (stopping, fencing, answering, scheduling a claim); returns the actions the
    /// loop performs itself (starting a term, claiming again), each with its shard.
    fn feed(&mut self, shard: u32, input: Input, metrics: &Metrics) -> Vec<(u32, Action)> {
        let phase = self.phases.get(&shard).copied().unwrap_or(Phase::Ended);
        let (next, actions) = lifecycle::step(phase, input);
        tracing::debug!(shard, ?phase, ?input, ?next, ?actions, "shard lifecycle");
        if next == Phase::Ended {
            self.phases.remove(&shard);
        } else {
            self.phases.insert(shard, next);
        }
        let mut loop_does = Vec::new();
        for action in actions {
            match action {
                Action::Stop => {
                    if let Some(run) = self.terms.get(&shard) {
                        run.stop.cancel();
                    }
                }
                Action::Fence => {
                    if let Some(run) = self.terms.get(&shard) {
                        run.fenced.cancel();
                        run.stop.cancel();
                    }
                }
                Action::Answer => {
                    for h in &mut self.handovers {
                        h.pending.remove(&shard);
                    }
                }
                Action::ReclaimLater => {
                    self.reclaims.insert(shard, Instant::now() + RETRY);
                }
                Action::TakenOver => {
                    if let Some(claimed) = self.terms.get(&shard).map(|r| r.claimed) {
                        metrics
                            .shard_takeover_seconds
                            .observe(claimed.elapsed().as_secs_f64());
                    }
                }
                Action::Start(_) | Action::Reclaim => loop_does.push((shard, action)),
            }
        }
        loop_does
    }

    /// The shards whose term may still produce: running, or draining at a revoke.
    fn unfenced(&self) -> Vec<u32> {
        self.phases
            .iter()
            .filter(|(_, p)| p.relaying() || matches!(p, Phase::Revoking { .. }))
            .map(|(s, _)| *s)
            .collect()
    }

    /// The shards due to be claimed again at `now`, no longer scheduled.
    fn due(&mut self, now: Instant) -> Vec<u32> {
        let due: Vec<u32> = self
            .reclaims
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(s, _)| *s)
            .collect();
        self.reclaims.retain(|s, _| !due.contains(s));
        due
    }

    /// When the clock next asks something of the loop: the ownership deadline (`lapse`) while a
    /// term may still produce, the first claim due again, and when the API server's silence
    /// reaches `sharding.apiUnreachableSeconds` (`unreachable`, when it applies) while terms
    /// run. `None`: nothing, until the group or a term says something.
    fn next_look(&self, lapse: Instant, unreachable: Option<Instant>) -> Option<Instant> {
        let fence = (!self.unfenced().is_empty()).then_some(lapse);
        let reclaim = self.reclaims.values().min().copied();
        let leave = unreachable.filter(|_| !self.terms.is_empty());
        [fence, reclaim, leave].into_iter().flatten().min()
    }

    /// Answers every revoke whose shards are all handed over: the rebalance may go on. How
    /// long each took goes to `seconds`.
    fn answer(&mut self, seconds: &prometheus::Histogram) {
        self.handovers.retain(|h| {
            if h.pending.is_empty() {
                seconds.observe(h.revoked.elapsed().as_secs_f64());
                let _ = h.done.send(());
            }
            !h.pending.is_empty()
        });
    }
}

/// Ends a term's share of the producer, whatever stopped the term (a revoke in any phase,
/// a fence, a failure): records still unreported get what is left of the drain budget,
/// counted from the stop (`None`: the term ended by itself, nothing is waited for); any
/// still unreported then are purged, with every other record of the replica's producer
/// (their streams replay them from their checkpoints), so that none lands after the next
/// owner's records. Nothing more is taken for the shard.
async fn settle(
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

    fn running() -> Running {
        Running {
            stop: CancellationToken::new(),
            fenced: CancellationToken::new(),
            claimed: Instant::now(),
        }
    }

    /// The loop sleeps until the clock asks something of it, and not at all when it asks
    /// nothing: no poll.
    #[tokio::test(start_paused = true)]
    async fn the_loop_looks_at_the_clock_only_when_it_asks_something() {
        let now = Instant::now();
        let s = Duration::from_secs;
        let (lapse, silent) = (now + s(9), Some(now + s(30)));
        let book = |phases: &[(u32, Phase)], terms: &[u32], reclaims: &[(u32, u64)]| Book {
            phases: phases.iter().copied().collect(),
            terms: terms.iter().map(|t| (*t, running())).collect(),
            handovers: Vec::new(),
            reclaims: reclaims.iter().map(|(k, at)| (*k, now + s(*at))).collect(),
        };
        let running_one = [(1, Phase::Running { epoch: 2 })];
        // (case, book, unreachable, wakes at)
        let table: Vec<(&str, Book, Option<Instant>, Option<Instant>)> = vec![
            ("nothing held: no wake", book(&[], &[], &[]), silent, None),
            (
                "a running term: the deadline, before the silence's grace",
                book(&running_one, &[1], &[]),
                silent,
                Some(lapse),
            ),
            (
                "a draining term may still produce: the deadline",
                book(&[(1, Phase::Revoking { then: None })], &[1], &[]),
                None,
                Some(lapse),
            ),
            (
                "a fenced term produces nothing: no deadline, the grace while it stops",
                book(
                    &[(
                        1,
                        Phase::Fenced {
                            then: None,
                            answer: false,
                        },
                    )],
                    &[1],
                    &[],
                ),
                silent,
                silent,
            ),
            (
                "a claim due again first",
                book(&[(3, Phase::Claimed)], &[], &[(3, 4), (5, 6)]),
                silent,
                Some(now + s(4)),
            ),
            (
                "the grace first when the server went silent long ago",
                book(&running_one, &[1], &[]),
                Some(now + s(1)),
                Some(now + s(1)),
            ),
            (
                "no grace without terms",
                book(&[(3, Phase::Claimed)], &[], &[]),
                Some(now),
                None,
            ),
        ];
        for (case, book, unreachable, expected) in table {
            assert_eq!(book.next_look(lapse, unreachable), expected, "{case}");
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
    /// takes records while it is, refuses them from the instant the deadline passes unrenewed,
    /// and takes them again once renewed.
    #[tokio::test(start_paused = true)]
    async fn the_deadline_fences_on_the_clock() {
        let memory = Arc::new(Memory::new());
        let deadline = Arc::new(Deadline::new(Duration::from_secs(10)));
        let p = producer(&memory, &deadline);
        assert!(p
            .send(&record("pods", Headers::default()), receipt())
            .is_err());
        deadline.renew(Instant::now());
        tokio::time::advance(Duration::from_millis(9_999)).await;
        p.send(&record("pods", Headers::default()), receipt())
            .unwrap();
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(matches!(
            p.send(&record("pods", Headers::default()), receipt()),
            Err(Refused::Failed(_))
        ));
        deadline.renew(Instant::now());
        p.send(&record("pods", Headers::default()), receipt())
            .unwrap();
        assert_eq!(memory.log().len(), 2);
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
