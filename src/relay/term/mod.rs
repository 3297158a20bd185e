//! A term: what one leadership term, or one shard's term, runs from its start to its stop.
//!
//! A [`Term`] is the plan (its producer, membership log, checkpoint ConfigMap, owner, part of
//! the streams); [`Run`] carries it with the relay's shared parts (one context) through the
//! term's phases, each a method:
//! 1. [`Run::restore`]: the positions loaded, the membership topic verified and read back
//!    ([`membership::Restore`]), other releases' claims added, and a checkpoint ConfigMap
//!    behind its copy in the topic (an etcd restore) made to forget its positions;
//! 2. [`Run::shapes`]: each channel's shape decided for the term;
//! 3. [`Run::prepare`]: members handed over between shapes ([`membership::Regroup`]), then what
//!    the configuration no longer runs retired ([`membership::Retire`]), before any stream
//!    starts: retractions come before announcements;
//! 4. [`Run::relay`]: the supervisor (`supervisor.rs`, one stream per channel and namespace,
//!    and the selectors' followers) and the checkpoint writer (`writer.rs`), until the term is
//!    stopped or fenced; then streams drain, the producer is flushed, and the positions are
//!    written one last time (none when fenced: its records are purged).
//!
//! Each phase returns `None` once the term is stopped meanwhile: nothing after it runs.

pub(super) mod supervisor;
pub(super) mod writer;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::context::{Context, RelayError};
use super::others::{self, Others};
use super::shapes;
use crate::checkpoint::{Loaded, Store};
use crate::config::{Channel, Scope, Shapes};
use crate::envelope::ShardOwner;
use crate::membership::regroup::{Move, ScopeNow};
use crate::membership::{self, Log, Owner, Restored};
use crate::producer::Producer;
use crate::registry::Part;
use crate::stream::Wiring;
use supervisor::Supervisor;

/// How often the producer is checked for a fatal error.
const FATAL_POLL: Duration = Duration::from_secs(1);

/// How long a term waits before trying again a handover or a retirement that failed.
const AGAIN: Duration = Duration::from_secs(5);

/// At most how many namespaces without a stream a switching channel reads, to tell whether a
/// watch from the gathered position shows all they hold (see
/// [`membership::regroup::ScopeNow::unseen`]); past it, a gather into a filtered stream lists
/// them as namespaces entering its scope, and one over every namespace takes their objects in
/// before it watches (see `stream::take_in`).
const UNSEEN_PROBES: usize = 32;

/// The checkpoints of a term, read until the API server answers (see
/// [`crate::checkpoint::until_read`]), or `None` once `stop` fires: nothing starts before the
/// positions are known.
async fn load(store: &Store, stop: &CancellationToken) -> Option<Loaded> {
    crate::checkpoint::until_read("reading the checkpoints", stop, || store.load()).await
}

/// What one term runs: the whole relay's streams, or one shard's.
pub(super) struct Term {
    pub(super) producer: Arc<dyn Producer>,
    pub(super) log: Arc<dyn Log>,
    /// The checkpoint ConfigMap.
    pub(super) store: Store,
    /// Whose membership records these are.
    pub(super) owner: Owner,
    pub(super) membership_topic: String,
    /// Partitions the membership topic is created with (and must have).
    pub(super) partitions: i32,
    /// Which streams it runs.
    pub(super) part: Part,
    /// The shard, and its owner epoch, it runs (with sharding on).
    pub(super) shard: Option<ShardOwner>,
    /// Other releases' claims its streams are checked against, beyond its own topic's.
    pub(super) others: Others,
    /// Called once every stream it starts with watches (a shard's takeover is then complete).
    pub(super) watching: Option<Box<dyn FnOnce() + Send + Sync>>,
    /// A claimed shard's mark, held until its streams are started (see
    /// [`crate::fanout::Starting`]).
    pub(super) starting: Option<crate::fanout::Starting>,
}

/// What a term holds once restored: its streams' positions, and their members.
struct Held {
    loaded: Loaded,
    members: Restored,
}

/// A term being run: its plan, the relay's shared parts, and how it is stopped (`stop`: drained
/// and written; `fenced` too: purged, nothing written).
pub(super) struct Run<'a> {
    relay: &'a Context,
    term: Term,
    stop: CancellationToken,
    fenced: CancellationToken,
}

impl<'a> Run<'a> {
    pub(super) fn new(
        relay: &'a Context,
        term: Term,
        stop: CancellationToken,
        fenced: CancellationToken,
    ) -> Self {
        Self {
            relay,
            term,
            stop,
            fenced,
        }
    }

    /// Runs the term until it is stopped (see the module's doc).
    pub(super) async fn run(mut self) -> Result<(), RelayError> {
        let Some(mut held) = self.restore().await? else {
            return Ok(());
        };
        let Some(shapes) = self.shapes(&held).await else {
            return Ok(());
        };
        if self.prepare(&shapes, &mut held).await.is_none() {
            return Ok(());
        }
        self.relay(shapes, held).await;
        Ok(())
    }

    /// The membership topic, when checkpoints are kept (not in a dry run).
    fn topic(&self) -> Option<&str> {
        self.relay
            .checkpoints
            .then_some(self.term.membership_topic.as_str())
    }

    /// Phase 1: positions and members.
    async fn restore(&mut self) -> Result<Option<Held>, RelayError> {
        let (relay, term, stop) = (self.relay, &self.term, &self.stop);
        let mut loaded = if relay.checkpoints {
            let Some(loaded) = load(&term.store, stop).await else {
                return Ok(None);
            };
            if !self.settled_for(&loaded) {
                return Ok(None);
            }
            tracing::info!(streams = loaded.streams.len(), owner = %term.owner, "loaded checkpoints");
            loaded
        } else {
            Loaded::default()
        };
        let Some(topic) = self.topic() else {
            let members = Restored::new(term.owner.clone(), None);
            return Ok(Some(Held { loaded, members }));
        };
        let membership = &relay.cfg.checkpoint.membership;
        let restore = membership::Restore {
            producer: &term.producer,
            log: &term.log,
            store: &term.store,
            metrics: &relay.metrics,
            registry: &relay.registry,
            owner: &term.owner,
            topic,
            partitions: term.partitions,
            replication: membership.replication_factor,
        };
        let permit = tokio::select! {
            _ = stop.cancelled() => return Ok(None),
            p = relay.restores.clone().acquire_owned() => p,
        };
        let Some(mut members) = restore.run(&mut loaded, stop).await else {
            return Ok(None);
        };
        drop(permit);
        let others = std::mem::replace(&mut self.term.others, Others::In(Vec::new()));
        let (term, stop) = (&self.term, &self.stop);
        let others = others::for_term(&relay.cfg.checkpoint, others, &term.log, term.shard, stop)
            .await
            .map_err(RelayError::Refused)?;
        let Some(others) = others else {
            return Ok(None);
        };
        members.add_claims(&others);
        if !self.positions(&mut loaded, &mut members).await {
            return Ok(None);
        }
        let term = &self.term;
        // Every new era is above the floor the ConfigMap last had, which a restore rewinds
        // with it, and its copy in Kafka does not: versions then never go back, whichever
        // replica's clock took the eras before the restore.
        loaded.era_floor = loaded.era_floor.max(members.era_floor);
        term.store.raise_era_floor(members.era_floor);
        if let Some(copied) = members.writes.filter(|&w| w > term.store.writes()) {
            // The ConfigMap is older than what was relayed from it: the cluster was restored
            // while the relay was down. No position of it may be resumed.
            relay.metrics.history_rewinds.inc();
            tracing::error!(configmap = term.store.writes(), copied, "the checkpoint ConfigMap is behind the copy of its write counter in the membership topic (an etcd restore?): every stream relists and re-announces every object");
            for saved in loaded.streams.values_mut() {
                saved.rv = None;
            }
        }
        Ok(Some(Held { loaded, members }))
    }

    /// Whether the shard's ConfigMap is still as the replica settled its configuration at its
    /// start: no split of streams kept whole under way or made since (see `relay::split`).
    /// Otherwise the replica stops (to be started again, and settle again) before its term
    /// runs anything: it would keep whole a stream now split into the shards' parts.
    fn settled_for(&self, loaded: &Loaded) -> bool {
        let seen = self.relay.cfg.sharding.splits_seen;
        if loaded.splitting.is_none() && loaded.splits <= seen {
            return true;
        }
        tracing::error!(splitting = ?loaded.splitting, splits = loaded.splits, seen, "the release's streams kept whole are being split, or were split, since this replica started: stopping it to start again on the release as it is now");
        self.relay.shutdown.cancel();
        false
    }

    /// The positions committed with the records in the membership topic: with a
    /// transactional producer they are the truth for the streams the ConfigMap holds and
    /// replace its positions. The ConfigMap may lag behind them; it runs ahead only by a
    /// position no record needs (a bookmark's, handed to the next commit), never past a record
    /// not yet committed, so either is safe to resume from. The others are removed from the topic: a stream retired, or handed to
    /// another shape, since its last commit would otherwise resume from a stale position
    /// should it come back (a new stream's first position is lost with them, which costs a
    /// list compared with its committed members). Without a transactional producer all are
    /// removed, so that none can later replace newer ConfigMap positions. False when stopped
    /// first.
    async fn positions(&self, loaded: &mut Loaded, members: &mut Restored) -> bool {
        let committed = std::mem::take(&mut members.positions);
        let transactional = self.term.producer.transactional();
        let mut stale = Vec::new();
        for (id, saved) in committed {
            match loaded.streams.get_mut(&id).filter(|_| transactional) {
                Some(entry) => entry.take_committed(saved),
                None => stale.push(id),
            }
        }
        let Some(topic) = self.topic().filter(|_| !stale.is_empty()) else {
            return true;
        };
        let records: Vec<_> = stale
            .iter()
            .map(|id| membership::position_record(topic, &self.term.owner, id, None))
            .collect();
        loop {
            match membership::send_all(&*self.term.producer, records.clone(), &self.stop).await {
                Ok(()) => return true,
                Err(membership::SendError::Stopped) => return false,
                Err(e) => {
                    tracing::warn!(error = %e, "removing stale positions from the membership topic; trying again");
                    tokio::select! {
                        _ = self.stop.cancelled() => return false,
                        _ = tokio::time::sleep(AGAIN) => {}
                    }
                }
            }
        }
    }

    /// Phase 2: each channel's shape this term, from what it holds.
    async fn shapes(&self, held: &Held) -> Option<Shapes> {
        let relay = self.relay;
        let ids = held
            .loaded
            .streams
            .keys()
            .map(String::as_str)
            .chain(held.members.streams());
        let shapes = shapes::decide(&relay.cfg, &relay.client, &relay.metrics, ids);
        tokio::select! {
            _ = self.stop.cancelled() => None,
            shapes = shapes => Some(shapes),
        }
    }

    /// Phase 3: members handed over between shapes, then the streams no longer run retired;
    /// each tried again until it is done.
    async fn prepare(&self, shapes: &Shapes, held: &mut Held) -> Option<()> {
        let Some(topic) = self.topic() else {
            return Some(());
        };
        let (relay, term, stop) = (self.relay, &self.term, &self.stop);
        let Held { loaded, members } = held;
        // A channel that changed shape hands its members over (in the shard), before anything
        // is retired: what moves is not retracted.
        let ids: Vec<&str> = loaded
            .streams
            .keys()
            .map(String::as_str)
            .chain(members.streams())
            .collect();
        let shard = term.shard.map(|s| s.shard);
        let plan = |namespaces: &HashMap<String, ScopeNow>| {
            let ids = ids.iter().copied();
            membership::regroup::plan(&relay.cfg, shapes, shard, ids, namespaces)
        };
        let mut moves = plan(&HashMap::new());
        // A channel over every namespace or a selector that changed shape: the namespaces its
        // scope holds now say whether its streams' positions carry over.
        let dynamic: Vec<&Channel> = relay
            .cfg
            .channels
            .iter()
            .map(|c| &**c)
            .filter(|c| !matches!(c.scope, Scope::Namespaces(_)))
            .filter(|c| moves.iter().any(|m| m.channel() == c.name))
            .collect();
        if !dynamic.is_empty() {
            let mut namespaces = tokio::select! {
                _ = stop.cancelled() => return None,
                n = shapes::scope_namespaces(&relay.client, &dynamic) => n,
            };
            // A namespace without a stream to gather (created during the switch) needs a list
            // of its own (an entry, or over every namespace a take-in), unless it holds none of
            // the channel's objects, or over every namespace none that a watch from the
            // gathered position would not show: a few are read to tell.
            // The gathers as the final plan makes them (a stream whose namespace is gone is
            // not gathered): the position a namespace is judged against is the one the stream
            // will resume from, never a lower one.
            let read = plan(&namespaces);
            for channel in &dynamic {
                let gathers = moves
                    .iter()
                    .any(|m| matches!(m, Move::Gather { .. }) && m.channel() == channel.name);
                let ids = ids.iter().copied();
                let missing = membership::regroup::unstreamed_in(
                    &relay.cfg,
                    channel,
                    shard,
                    ids,
                    &namespaces,
                );
                let Some(missing) =
                    missing.filter(|m| gathers && (1..=UNSEEN_PROBES).contains(&m.len()))
                else {
                    continue;
                };
                // A stream over a list or a selector takes a namespace with objects in with a
                // list instead (see `Move::Gather`'s `partly`).
                let above = (channel.scope == Scope::Cluster).then(|| {
                    membership::regroup::lowest_gathered(&read, &channel.name, &loaded.streams)
                });
                let unseen = tokio::select! {
                    _ = stop.cancelled() => return None,
                    u = shapes::unseen_namespaces(&relay.client, channel, &missing, above.flatten()) => u,
                };
                if let Some(now) = namespaces.get_mut(&channel.name) {
                    now.unseen = unseen;
                }
            }
            moves = plan(&namespaces);
        }
        let regroup = membership::Regroup {
            producer: &term.producer,
            store: &term.store,
            metrics: &relay.metrics,
            owner: &term.owner,
            topic,
        };
        while !moves.is_empty()
            && !regroup
                .run(&moves, members, &mut loaded.streams, stop)
                .await
        {
            self.pause().await?;
        }
        let tagger: Option<Box<membership::Tagger>> = relay.schemas.clone().map(|s| {
            Box::new(move |topic: &str, ns: Option<&str>| s.tag(topic, ns))
                as Box<membership::Tagger>
        });
        let retire = membership::Retire {
            cfg: &relay.cfg,
            shapes,
            producer: &term.producer,
            store: &term.store,
            metrics: &relay.metrics,
            owner: &term.owner,
            topic,
            shard: term.shard,
            era_floor: loaded.era_floor,
            tag: tagger.as_deref(),
        };
        // Retractions of what is no longer configured come before any announcement.
        while !retire.run(members, &mut loaded.streams, stop).await {
            self.pause().await?;
        }
        Some(())
    }

    /// Waits before trying again; `None` once the term is stopped.
    async fn pause(&self) -> Option<()> {
        tokio::select! {
            _ = self.stop.cancelled() => None,
            _ = tokio::time::sleep(AGAIN) => Some(()),
        }
    }

    /// Phase 4: the streams and the checkpoint writer, until the term is stopped or fenced;
    /// then the drain, the flush and the last write (see the module's doc).
    async fn relay(self, shapes: Shapes, held: Held) {
        let Run {
            relay,
            term,
            stop,
            fenced,
        } = self;
        let membership_topic = relay.checkpoints.then_some(term.membership_topic);
        if let Some(topic) = &membership_topic {
            writer::open_term(
                &term.store,
                term.producer.as_ref(),
                topic,
                &term.owner,
                &stop,
            )
            .await;
        }
        let Held { loaded, members } = held;
        let producer = term.producer;
        let supervisor = Supervisor::new(
            Arc::new(Wiring {
                cfg: relay.cfg.clone(),
                client: relay.client.clone(),
                producer: producer.clone(),
                metrics: relay.metrics.clone(),
                fenced: fenced.clone(),
                membership_topic: membership_topic.clone(),
                owner: term.owner.clone(),
                checkpoints: relay.checkpoints,
                syncs: relay.syncs.clone(),
                shard: term.shard,
                schemas: relay.schemas.clone(),
                fanouts: relay.fanouts.clone(),
                era_floor: loaded.era_floor,
            }),
            relay.registry.clone(),
            loaded.streams,
            members,
            shapes,
            term.part.clone(),
            relay.feeds.clone(),
        );
        let streams_cancel = CancellationToken::new();
        let started = supervisor.start(&relay.cfg.channels, &streams_cancel);
        // Its streams join their reads once their new eras are written (within the hub's quiet,
        // those writes taking no turn).
        drop(term.starting);
        let reporter = term
            .watching
            .map(|report| tokio::spawn(report_watching(relay.registry.clone(), started, report)));
        let writer_cancel = CancellationToken::new();
        let writer = relay.checkpoints.then(|| {
            let copy = membership_topic.clone().map(|topic| writer::Copy {
                producer: producer.clone(),
                topic,
                owner: term.owner.clone(),
            });
            tokio::spawn(writer::run(
                term.store,
                copy,
                relay.registry.clone(),
                term.part,
                relay.metrics.clone(),
                Duration::from_millis(relay.cfg.checkpoint.interval_ms),
                relay.pacer.clone(),
                writer_cancel.clone(),
                fenced.clone(),
            ))
        });
        let watchdog = tokio::spawn(watch_fatal(
            producer.clone(),
            relay.registry.clone(),
            stop.clone(),
            // A shard's own transactional producer fenced by a newer one: the shard moved on,
            // only its term ends.
            (term.shard.is_some() && producer.transactional()).then(|| fenced.clone()),
        ));

        // A term is fenced from outside (stopped too), or by its writer finding a newer owner.
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = fenced.cancelled() => {}
        }
        watchdog.abort();
        if let Some(reporter) = reporter {
            reporter.abort();
        }
        if fenced.is_cancelled() {
            tracing::warn!("fenced: purging the producer's queued and in-flight records");
            producer.purge();
        }
        // The shutdown budget: drain and flush by `drained`, the final write within its reserve.
        let drained = tokio::time::Instant::now() + relay.cfg.drain_time();
        tracing::info!(
            budget_seconds = relay.cfg.shutdown_timeout_seconds,
            "shutting down: draining streams"
        );
        streams_cancel.cancel();
        supervisor.wait().await;
        let flush_timeout = if fenced.is_cancelled() {
            Duration::ZERO
        } else {
            drained.saturating_duration_since(tokio::time::Instant::now())
        };
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || producer.flush(flush_timeout)).await
        {
            tracing::warn!(error = %e, "producer flush incomplete");
        }
        writer_cancel.cancel();
        if let Some(Err(e)) = match writer {
            Some(w) => Some(w.await),
            None => None,
        } {
            tracing::error!(error = %e, "checkpoint writer panicked");
        }
        tracing::info!("stopped");
    }
}

/// Calls `report` once every stream of `started` watches (or was retired after it registered).
async fn report_watching(
    registry: crate::registry::Registry,
    started: Vec<String>,
    report: Box<dyn FnOnce() + Send + Sync>,
) {
    let mut changes = registry.changes();
    let mut seen = BTreeSet::new();
    while !registry.watching(&started, &mut seen) {
        if changes.changed().await.is_err() {
            return;
        }
    }
    report();
}

/// Fails the relay's health once `producer` failed fatally (it delivers nothing more: the
/// process must restart), until `stop`; or, when the producer is the term's own (`fence`),
/// fences the term alone.
async fn watch_fatal(
    producer: Arc<dyn Producer>,
    registry: crate::registry::Registry,
    stop: CancellationToken,
    fence: Option<CancellationToken>,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(FATAL_POLL) => {}
        }
        if let Some(e) = producer.fatal() {
            match fence {
                Some(fence) => {
                    tracing::warn!(error = %e, "the term's transactional producer failed for good: the term ends; the shard is claimed again if still assigned");
                    fence.cancel();
                }
                None => registry.fail(format!("the Kafka producer failed fatally: {e}")),
            }
            return;
        }
    }
}
