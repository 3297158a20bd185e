//! One replica's memberships in the shard group: the loop that executes [`Book`]'s decisions
//! (see the module above), and the terms it starts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::book::{Book, Hold, Running};
use super::resyncs::pass_on_resyncs;
use super::share::{settle, ShardProducer, Share};
use crate::checkpoint::{Ownership, Store};
use crate::config::{ShardingConfig, CHECKPOINT_RESERVE};
use crate::envelope::ShardOwner;
use crate::group::{Deadline, Event, GroupError, Membership};
use crate::membership::{self, Log, Owner};
use crate::producer::{Producer, Tally};
use crate::relay::context::{Context, RelayError, Sink, Transactions, RETRY};
use crate::relay::lifecycle::{Action, Input};
use crate::relay::migrate::{LegacyCell, MigrateError, Migration, Target};
use crate::relay::others::Others;
use crate::relay::reach::{Reach, PROBE};
use crate::relay::term::{Run, Term};

/// A shard the group assigned this replica, with its owner epoch.
struct Claim {
    shard: u32,
    epoch: u64,
    /// Which term of this membership it starts (see [`Running::term`]).
    nth: u64,
}

/// Why a membership in the group ended.
pub(super) enum Left {
    /// The relay was shut down.
    Shutdown,
    /// The API server was out of reach: the shards were given up until it is back.
    Unreachable,
}

/// What every membership of this replica shares.
pub(super) struct Member {
    pub(super) producer: Arc<dyn Producer>,
    pub(super) log: Arc<dyn Log>,
    pub(super) identity: String,
    pub(super) legacy: LegacyCell,
    /// Whether this replica relays shard 0, and so passes resync requests on.
    pub(super) passes: Arc<AtomicBool>,
    /// Other releases' live claims in the single-leader topic and every partition of the
    /// shards' topic, read once at the replica's start (`None` until read): what each shard's
    /// streams are checked against beyond its own partition.
    pub(super) others: tokio::sync::watch::Receiver<Option<Arc<[membership::Claim]>>>,
}

/// A replica in the shard group: the relay's shared parts and what its memberships share.
pub(super) struct Replica<'r> {
    pub(super) relay: &'r Context,
    pub(super) member: Member,
}

impl Replica<'_> {
    /// Memberships in the group, one after another, until shut down.
    pub(super) async fn memberships(&self) -> Result<(), RelayError> {
        let member = &self.member;
        let cfg = &self.relay.cfg;
        let passing = CancellationToken::new();
        let _passing = passing.clone().drop_guard();
        tokio::spawn(pass_on_resyncs(
            self.relay.client.clone(),
            cfg.clone(),
            member.passes.clone(),
            passing,
        ));
        let probing = CancellationToken::new();
        let _probing = probing.clone().drop_guard();
        let reach = Reach::start(self.relay.probe.clone(), probing);
        let grace = Duration::from_secs(u64::from(cfg.sharding.api_unreachable_seconds));
        loop {
            match self.membership(&reach).await? {
                Left::Shutdown => return Ok(()),
                Left::Unreachable => {
                    tracing::warn!("gave the shards up: the API server is out of reach; joining again once it answers");
                    while reach.silent() >= grace.min(PROBE * 2) {
                        tokio::select! {
                            _ = self.relay.shutdown.cancelled() => return Ok(()),
                            _ = tokio::time::sleep(PROBE) => {}
                        }
                    }
                }
            }
        }
    }

    /// One membership in the group: joins, relays the shards it is given, and leaves (handing
    /// every shard over) when shut down or cut from the API server.
    async fn membership(&self, reach: &Reach) -> Result<Left, RelayError> {
        let cfg = &self.relay.cfg;
        let Member {
            identity, passes, ..
        } = &self.member;
        let handover = cfg.drain_time() + CHECKPOINT_RESERVE;
        let grace = Duration::from_secs(u64::from(cfg.sharding.api_unreachable_seconds));
        let joined = {
            let (cfg, identity, coordinator) = (
                cfg.clone(),
                identity.clone(),
                self.relay.coordinator.clone(),
            );
            tokio::task::spawn_blocking(move || coordinator.join(&cfg, &identity, handover))
                .await
                .map_err(|e| GroupError::Panicked(e.to_string()))?
        };
        let (group, mut events) = joined?;
        tracing::info!(%identity, shards = cfg.sharding.shards, "joined the shard group");
        self.relay
            .metrics
            .shards
            .set(i64::from(cfg.sharding.shards));
        // A member relays: the leader gauge says so, as without election.
        self.relay.metrics.leader.set(1);
        let deadline = group.deadline();
        let mut group = Some(group);
        let mut leaving: Option<(Left, tokio::task::JoinHandle<()>)> = None;
        let leave = |why: Left, group: &mut Option<Box<dyn Membership>>| {
            let g = group.take().expect("the group is left once");
            Some((why, tokio::task::spawn_blocking(move || g.leave())))
        };
        let mut terms = FuturesUnordered::new();
        let mut book = Book::default();
        // Each term says here, with its shard and its count, once its streams all watch.
        let (reports, mut watching) = mpsc::unbounded_channel();
        // Terms started in this membership: each report names its term by this count.
        let mut started = 0u64;
        let left = loop {
            // What the machine asks of the loop itself: terms to start, shards to claim again.
            let mut todo: Vec<(u32, Action)> = Vec::new();
            let now = Instant::now();
            let unreachable = (leaving.is_none() && !grace.is_zero())
                .then(|| now + grace.saturating_sub(reach.silent()));
            let look = book.next_look(deadline.next_look(now), unreachable);
            tokio::select! {
                _ = self.relay.shutdown.cancelled(), if leaving.is_none() => {
                    tracing::info!("leaving the shard group: handing every shard over");
                    leaving = leave(Left::Shutdown, &mut group);
                }
                _ = async { (&mut leaving.as_mut().expect("guarded").1).await }, if leaving.is_some() => {
                    break leaving.take().expect("guarded").0;
                }
                Some(event) = events.recv() => match event {
                    Event::Claimed(claims) => {
                        let claimed: Vec<u32> = claims.iter().map(|(s, _)| *s).collect();
                        let release = Store::new(self.relay.client.clone(), &cfg.checkpoint.namespace, &cfg.checkpoint.name);
                        let who = identity.clone();
                        tokio::spawn(async move {
                            if let Err(e) = release.record_shard_owner(&claimed, &who).await {
                                tracing::warn!(error = %e, "recording the claimed shards in the checkpoint ConfigMap failed");
                            }
                        });
                        for (shard, epoch) in claims {
                            self.relay.metrics.shard_rebalances.with_label_values(&["claimed"]).inc();
                            tracing::info!(shard, epoch, "claimed shard");
                            todo.extend(book.feed(shard, Input::Claimed(epoch), &self.relay.metrics));
                        }
                    }
                    Event::Fatal(e) => self.relay.registry.fail(format!("the shard group's Kafka consumer failed fatally: {e}")),
                    Event::Revoked { shards, lost, done } => {
                        let kind = if lost { "lost" } else { "revoked" };
                        tracing::info!(?shards, kind, "shards revoked");
                        let input = if lost { Input::Lost } else { Input::Revoked };
                        book.revoked(&shards, done);
                        for shard in shards {
                            self.relay.metrics.shard_rebalances.with_label_values(&[kind]).inc();
                            todo.extend(book.feed(shard, input, &self.relay.metrics));
                        }
                        // Shards with no term are handed over at once.
                        book.answer(&self.relay.metrics.shard_handover_seconds);
                    }
                },
                Some((shard, result)) = terms.next(), if !terms.is_empty() => {
                    book.ended(shard);
                    let part = self.relay.cfg.sharding.clone();
                    self.relay.registry.forget(&move |id| part.shard_of_stream(id) == shard);
                    if let Err(e) = result {
                        tracing::error!(shard, error = %e, "shard term failed");
                    }
                    todo.extend(book.feed(shard, Input::TermEnded, &self.relay.metrics));
                    book.answer(&self.relay.metrics.shard_handover_seconds);
                }
                Some((shard, term)) = watching.recv() => {
                    // From the shard's running term only: a report of an earlier one, still
                    // queued when it ended, is not this claim's (the group's epoch may repeat).
                    if let Some(epoch) = book.running_term(shard, term) {
                        todo.extend(book.feed(shard, Input::Watching(epoch), &self.relay.metrics));
                    }
                }
                _ = tokio::time::sleep_until(look.unwrap_or(now)), if look.is_some() => {
                    let unfenced = book.unfenced();
                    if !unfenced.is_empty() && deadline.lapsed() {
                        self.relay.metrics.shard_fences.inc();
                        tracing::error!(shards = ?unfenced, "could not prove ownership of the shards in time: fenced, purging the producer; claiming them again if still assigned");
                        for shard in unfenced {
                            todo.extend(book.feed(shard, Input::Fence, &self.relay.metrics));
                        }
                    }
                    for shard in book.due(Instant::now()) {
                        tracing::warn!(shard, "claiming again a shard whose term ended unasked");
                        todo.extend(book.feed(shard, Input::ReclaimDue, &self.relay.metrics));
                    }
                    if leaving.is_none() && !grace.is_zero() && book.running() > 0 && reach.silent() >= grace {
                        tracing::error!(silent_seconds = reach.silent().as_secs(), "the API server has not answered for sharding.apiUnreachableSeconds: leaving the shard group so other replicas relay these shards");
                        leaving = leave(Left::Unreachable, &mut group);
                    }
                }
            }
            // Whatever woke the loop: a renewal may have ended a hold, or the deadline begun one.
            match book.hold(!deadline.passed(), Instant::now()) {
                Some(Hold::Began) => {
                    self.relay.metrics.shard_holds.inc();
                    tracing::warn!(shards = ?book.unfenced(), "cannot prove ownership of the shards: taking and committing nothing for them until a renewal is answered, fencing them if none is within half the session's margin");
                }
                Some(Hold::Ended(held)) if !book.unfenced().is_empty() => {
                    tracing::info!(
                        held_ms = held.as_millis() as u64,
                        "ownership of the shards proven again: they go on"
                    );
                }
                _ => {}
            }
            let mut reclaim = Vec::new();
            for (shard, action) in todo {
                match action {
                    Action::Start(epoch) => {
                        started += 1;
                        let claim = Claim {
                            shard,
                            epoch,
                            nth: started,
                        };
                        let (run, term) = self.start_shard(claim, &deadline, &reports);
                        book.started(shard, run);
                        terms.push(term);
                    }
                    Action::Reclaim => reclaim.push(shard),
                    _ => {}
                }
            }
            if let (false, Some(g)) = (reclaim.is_empty(), &group) {
                g.reclaim(&reclaim);
            }
            passes.store(book.relays(0), Ordering::Relaxed);
            self.relay
                .metrics
                .shards_owned
                .set(i64::try_from(book.running()).unwrap_or(i64::MAX));
        };
        passes.store(false, Ordering::Relaxed);
        // A handover the group stopped waiting for: stop what still runs.
        book.stop_all();
        while terms.next().await.is_some() {}
        self.relay.metrics.shards_owned.set(0);
        self.relay.metrics.leader.set(0);
        tracing::info!("left the shard group");
        Ok(left)
    }

    /// Starts the term of a claimed shard: its share of a single-leader release's state copied
    /// first, if that was not done yet.
    fn start_shard<'a>(
        &'a self,
        claim: Claim,
        deadline: &Arc<Deadline>,
        reports: &mpsc::UnboundedSender<(u32, u64)>,
    ) -> (
        Running,
        impl std::future::Future<Output = (u32, Result<(), RelayError>)> + 'a,
    ) {
        let Claim { shard, epoch, nth } = claim;
        let member = &self.member;
        let cfg = &self.relay.cfg;
        let mut share = Share {
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
            epoch,
            term: nth,
        };
        let (stop, fenced, legacy) = (run.stop.clone(), run.fenced.clone(), member.legacy.clone());
        let was_fenced = fenced.clone();
        let drain = cfg.drain_time();
        let reports = reports.clone();
        let watching: Box<dyn FnOnce() + Send + Sync> = Box::new(move || {
            let _ = reports.send((shard, nth));
        });
        // Taken at the claim, so that the shards claimed together are all counted before the
        // first of them joins a read.
        let starting = self.relay.fanouts.as_ref().map(|f| f.starting());
        // Whether the term still owns the shard's transactional id: until it is fenced or over.
        // A commit that fails after that never builds the producer again (which would fence the
        // next owner's).
        let owns = fenced.child_token();
        // Nothing is committed while the replica holds its shards (see `Deadline`).
        let proven: crate::producer::Proof = {
            let deadline = deadline.clone();
            Arc::new(move || !deadline.passed())
        };
        let term = async move {
            let stopped = {
                let stop = stop.clone();
                tokio::spawn(async move {
                    stop.cancelled().await;
                    Instant::now()
                })
            };
            let stamped = match self.stamp_epoch(shard, epoch, &identity, &stop).await {
                // With exactly-once delivery the term has a producer of its own, fencing the
                // previous owner's before anything of the shard is read back.
                Some(epoch) => match self
                    .relay
                    .transactional(&self.shard_owner(shard), &stop, &owns, &proven)
                    .await
                {
                    Transactions::Off => Some(epoch),
                    Transactions::Stopped => None,
                    Transactions::On(p) => {
                        share.inner = p;
                        Some(epoch)
                    }
                },
                None => None,
            };
            let result = match stamped {
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
                    plan.starting = starting;
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
            settle(&self.relay.metrics, shard, share, stopped, drain).await;
            owns.cancel();
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
        let cfg = &self.relay.cfg;
        let name = ShardingConfig::configmap(&cfg.checkpoint.name, shard);
        let store = Store::new(self.relay.client.clone(), &cfg.checkpoint.namespace, &name);
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

    /// Whose membership records, positions and transactions a term of `shard` keeps: its
    /// checkpoint ConfigMap's.
    fn shard_owner(&self, shard: u32) -> Owner {
        let cfg = &self.relay.cfg;
        let name = ShardingConfig::configmap(&cfg.checkpoint.name, shard);
        Owner::new(&cfg.checkpoint.namespace, &name)
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
        let cfg = &self.relay.cfg;
        let sharding = cfg.sharding.clone();
        let name = ShardingConfig::configmap(&cfg.checkpoint.name, shard);
        let membership_topic = sharding.topic(&cfg.cluster_name);
        let (shard_log, old_log): (Arc<dyn Log>, Arc<dyn Log>) = match &self.relay.sink {
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
                .relay
                .metrics
                .shard_records
                .with_label_values(&[&shard.to_string()]),
        });
        let plan = Term {
            producer,
            log: shard_log,
            store: Store::new(self.relay.client.clone(), &cfg.checkpoint.namespace, &name).owned(
                Ownership {
                    replica: identity.to_string(),
                    epoch,
                },
            ),
            owner: self.shard_owner(shard),
            membership_topic,
            partitions: sharding.shards.cast_signed(),
            part: Arc::new(move |id| sharding.shard_of_stream(id) == shard),
            shard: Some(owner),
            others,
            watching: None,
            starting: None,
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
        let cfg = &self.relay.cfg;
        let leader = Owner::new(&cfg.checkpoint.namespace, &cfg.checkpoint.name);
        let migration = Migration {
            cfg,
            client: &self.relay.client,
            leader: self.relay.txn_connect(&leader).map(|(_, connect)| connect),
        };
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
                copied = migration.migrate(to, legacy, old_log, &stop) => copied,
            };
            match &copied {
                Err(MigrateError::Fence(e)) => self.relay.refused(&leader, Some(e)),
                Ok(()) if migration.leader.is_some() => self.relay.refused(&leader, None),
                _ => {}
            }
            let Err(e) = copied else {
                break;
            };
            tracing::warn!(shard, error = %e, "copying the single-leader state failed; retrying");
            tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = tokio::time::sleep(RETRY) => {}
            }
        }
        Run::new(self.relay, plan, stop, fenced).run().await
    }
}

/// Creates the group's topic and the shards' membership topic unless they exist, and
/// checks each has one partition per shard; retried until they do. `false` when shut down
/// first.
pub(super) async fn ensure_topics(relay: &Context, log: &Arc<dyn Log>) -> bool {
    let sharding = &relay.cfg.sharding;
    let cluster = &relay.cfg.cluster_name;
    let shards = sharding.shards.cast_signed();
    let replication = relay.cfg.checkpoint.membership.replication_factor;
    'retry: loop {
        for topic in [sharding.owners_topic(cluster), sharding.topic(cluster)] {
            let (log, t) = (log.clone(), topic.clone());
            let state =
                tokio::task::spawn_blocking(move || log.ensure_compacted(&t, shards, replication))
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
            relay.registry.block(Some(problem));
            tokio::select! {
                _ = relay.shutdown.cancelled() => return false,
                _ = tokio::time::sleep(RETRY) => continue 'retry,
            }
        }
        relay.registry.block(None);
        return true;
    }
}
