//! One stream: a (channel, namespace) pair followed from list to watch to resync.
//!
//! [`machine`] decides where a stream goes; [`Stream`] performs each step (await the resource,
//! sync, watch, back off), turns lines into announcements and hands them to its
//! [`Outbox`](crate::outbox::Outbox), and publishes its phase and acknowledged checkpoint
//! through its [`Reporter`]. While it reads a watch it also settles delivery reports, reports
//! first, so memory stays bounded: once `maxInFlightPerStream` entries await Kafka it stops
//! reading.

mod announced;
mod feed;
mod fences;
pub mod machine;
mod permits;
mod position;
mod read;
mod relist;
mod rescope;
mod resume;
mod scope;
mod scope_sum;
mod scope_table;
mod sync;
mod take_in;

pub use announced::Announced;
pub use scope::{NamespaceFilter, Namespaces};

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use prometheus::{IntCounter, IntGauge};
use tokio_util::sync::CancellationToken;

use crate::checkpoint::Saved;
use crate::config::Channel;
use crate::config::Config;
use crate::decode::Trim;
use crate::envelope::Route;
use crate::event::EventType;
use crate::event::Meta;
use crate::kubeapi::{self, ApiError, Query};
use crate::membership::Members;
use crate::membership::{Change, Known};
use crate::metrics::Metrics;
use crate::outbox::{Limits, Outbox, OutboxError, Stamp};
use crate::producer::Producer;
use crate::registry::{Phase, Reporter};
use feed::Feed;
use machine::{Backoff, Outcome, Profile, Reason, State, Stop, Via};
use permits::{Permit, Syncs};

type Step = Outcome<Feed>;

/// Pre-labelled metric handles for one stream.
struct StreamMetrics {
    /// events_received_total, per [`EventType::ALL`].
    received: [IntCounter; 5],
    filtered: IntCounter,
    malformed: IntCounter,
    synthetic_deletes: IntCounter,
    unchanged: IntCounter,
    full_fallbacks: IntCounter,
    resyncs: IntCounter,
    up: IntGauge,
    last_event: IntGauge,
}

/// What the lines of an open watch are: the initial state of a Sync, or live changes.
enum Reading {
    Initial {
        reason: Reason,
        announced: Announced,
        relisting: Box<relist::Relisting>,
    },
    Live {
        at: Option<String>,
    },
    /// Objects of an initial state at or below `floor`, of other namespaces than `covered`,
    /// announced before a watch from `floor` (see [`Stream::take_in`]).
    TakeIn {
        floor: u64,
        covered: Arc<BTreeSet<String>>,
        /// How many it announced.
        objects: usize,
    },
}

/// How a stream's run ends.
pub struct Lifetime {
    /// Stops reading: the relay stops, or the stream leaves its scope.
    pub stop: CancellationToken,
    /// The relay stops: waiting for deliveries is abandoned too.
    pub shutdown: CancellationToken,
    /// The stream leaves its scope for good (its namespace no longer matches, or is gone):
    /// every object it announced gets an inferred DELETED before it ends.
    pub leaving: CancellationToken,
}

/// Everything a stream is started with.
pub struct Wiring {
    pub cfg: Arc<Config>,
    pub client: kube::Client,
    pub producer: Arc<dyn Producer>,
    pub metrics: Arc<Metrics>,
    /// Cancelled when this replica lost its Lease: stop without draining or checkpointing.
    pub fenced: CancellationToken,
    /// Whether checkpoints are written (not in a dry run).
    pub checkpoints: bool,
    /// The membership topic; `None` keeps members in memory only (a dry run).
    pub membership_topic: Option<String>,
    /// Whose membership records the streams write.
    pub owner: crate::membership::Owner,
    /// Permits to sync (`kubernetes.maxConcurrentSyncs`), shared by every stream.
    pub syncs: Arc<tokio::sync::Semaphore>,
    /// With sharding on: the shard these streams belong to, and its owner epoch.
    pub shard: Option<crate::envelope::ShardOwner>,
    /// With a schema registry: the topics' schema tags.
    pub schemas: Option<Arc<crate::schemas::Schemas>>,
    /// The replica's shared reads of collections fanned out to its shards (with sharding on).
    pub fanouts: Option<Arc<crate::fanout::Fanouts>>,
    /// The highest era the term's checkpoint ConfigMap held when the term began: every new era
    /// of its streams is above it.
    pub era_floor: u64,
}

pub struct Stream {
    id: String,
    channel: Arc<Channel>,
    cfg: Arc<Config>,
    client: kube::Client,
    metrics: Arc<Metrics>,
    m: StreamMetrics,
    /// What it reads and how it decodes it.
    source: Source,
    outbox: Outbox,
    reporter: Reporter,
    /// When it stops, and how.
    life: Life,
    backoff: Backoff,
    timers: Timers,
    /// What it stamps on its checkpoints, and how its next resync goes.
    position: Position,
    checkpoints: bool,
    /// Its share of the relay's syncs.
    syncs: Syncs,
    /// A cluster-wide stream filtered to some namespaces (see [`scope`]).
    scope: Option<scope::Scoped>,
    /// The namespaces whose events up to a version were published already (see [`fences`]).
    fences: fences::Fences,
    /// What its last list announced, if it failed midway (see [`relist`]).
    relist: Option<relist::Relist>,
}

/// What a stream reads and how it decodes it.
struct Source {
    /// The collection URL.
    path: String,
    api_version: String,
    trim: Trim,
    /// Kind of the channel's objects, learned from lists and events (for inferred events).
    kind: String,
    /// The object buffer reused for every event.
    object_buf: Vec<u8>,
    /// A shard's part of a fanned-out collection: read through the replica's hub, not a watch
    /// of its own.
    fanned: Option<Fanned>,
}

/// Where a shard's part of a fanned-out collection reads it.
struct Fanned {
    fanouts: Arc<crate::fanout::Fanouts>,
    collection: crate::fanout::Collection,
    shard: u32,
}

/// The tokens that stop a stream: [`Lifetime`]'s, and the lost Lease's.
struct Life {
    /// Stops reading: the relay stops, or the stream leaves its scope.
    stop: CancellationToken,
    /// The stream leaves its scope for good.
    leaving: CancellationToken,
    /// The Lease was lost: nothing more is checkpointed.
    fenced: CancellationToken,
    /// The relay stops: waiting for a checkpoint write, or for deliveries, is abandoned.
    shutdown: CancellationToken,
}

/// A stream's two clocks.
struct Timers {
    /// Fires when the next checkpoint may be published.
    publish: Pin<Box<tokio::time::Sleep>>,
    publish_every: Duration,
    /// Fires when an open watch has delivered nothing for `watchIdleTimeoutSeconds`.
    idle: Pin<Box<tokio::time::Sleep>>,
    idle_after: Duration,
}

/// What a stream stamps on its checkpoints (see [`resume`]), and how its next resync goes.
struct Position {
    /// The fingerprint of this stream's query, stamped on every checkpoint it publishes.
    query: String,
    /// A filtered stream's set-sum of the namespaces in `query`, stamped beside it.
    sum: Option<String>,
    /// A filtered stream's invertible table of the namespaces in `query`, stamped beside it.
    table: Option<String>,
    /// The saved position belongs to another query: it is forgotten in the ConfigMap before the
    /// stream publishes anything (see [`Stream::forget_position`]).
    query_changed: bool,
    /// Where the stream publishes (see [`Route::id`]), stamped on every checkpoint.
    route_id: String,
    /// It published elsewhere before (`route_id` is then that old route): members announced
    /// elsewhere are retracted there first, and only then is this, the new route, stamped.
    new_route: Option<String>,
    /// A full resync was requested: the next resync re-announces every object, not only those
    /// changed since the position (see [`sync`]).
    full_resync: bool,
    /// Objects at or below the position, of other namespaces than these, are still to be taken
    /// in before the stream watches (see [`crate::checkpoint::Saved::covered`] and
    /// [`Stream::take_in`]).
    covered: Option<Arc<BTreeSet<String>>>,
    /// This run of the stream took a new era for its take-in: one tried again announces in it.
    take_in_era: bool,
    /// The stream's era is new and written, and nothing has reached a position in it yet: a
    /// sync without a position announces in it without taking (and writing) another.
    era_fresh: bool,
}

/// How a stream ended, with its reporter.
pub enum Ended {
    /// Stopped with its entry in place: the next stream of its id goes on from it.
    Stopped,
    /// Left its scope: every object it announced has its acknowledged DELETED, and its entry
    /// may be retired.
    Left(Reporter),
}

/// What a stream resumes from: its saved position and the members it announced.
pub struct Resumed {
    pub saved: Option<Saved>,
    pub members: Members,
}

/// The namespaces `channel`'s selector matched at exactly resourceVersion `at`, for
/// [`scope::Scoped::resume_under`] to name a namespace in scope then that no name at the start
/// tells (unlabelled or deleted since, without an object); a 410 means the position is gone
/// too. `None` where a failure or a permission leaves it unknown, and where it is not asked:
/// the selectors changed since (nothing would tell), or a `namespaces` list, whose namespaces
/// are the configuration's (one dropped from it is left to the table: the relay may not list
/// namespaces then).
async fn scope_then(
    client: &kube::Client,
    channel: &Channel,
    scoped: &scope::Scoped,
    at: &str,
    id: &str,
) -> Option<BTreeSet<String>> {
    let crate::config::Scope::Selector(selector) = &channel.scope else {
        return None;
    };
    if !scoped.saved_under_this_query() {
        return None;
    }
    kubeapi::namespaces(client, selector, Some(at))
        .await
        .inspect_err(|e| tracing::info!(stream = %id, error = %e, "listing the namespaces at the stream's position failed"))
        .ok()
}

impl Stream {
    pub fn new(
        channel: Arc<Channel>,
        namespace: Option<String>,
        wiring: &Wiring,
        reporter: Reporter,
        resumed: Resumed,
        lifetime: Lifetime,
        filter: Option<NamespaceFilter>,
    ) -> Self {
        let Resumed { mut saved, members } = resumed;
        let Lifetime {
            stop: cancel,
            shutdown,
            leaving,
        } = lifetime;
        let cfg = wiring.cfg.clone();
        let metrics = wiring.metrics.clone();
        let id = reporter.id().to_string();
        let query = channel.query_fingerprint(namespace.as_deref(), filter.is_some());
        let saved_query = saved
            .as_ref()
            .and_then(|s| resume::standing(s.query.as_deref(), s.covered.is_some(), &query));
        let saved_fences = saved.as_ref().map(|s| s.fences.clone()).unwrap_or_default();
        let saved_sum = saved.as_ref().and_then(|s| s.sum.clone());
        let saved_table = saved.as_ref().and_then(|s| s.table.clone());
        let base = query.clone();
        let path = channel.path.collection_url(namespace.as_deref());
        let route =
            Route::for_stream(&channel, &cfg.cluster_name, namespace).owned_by(wiring.shard);
        let tag = wiring
            .schemas
            .as_ref()
            .map(|s| s.tag(&route.topic, route.namespace.as_deref()));
        let route = route.tagged(tag);
        let plan = resume::plan(
            saved_query.as_deref(),
            saved.as_ref().and_then(|s| s.route.as_deref()),
            &query,
            &route.id(),
            filter.is_some(),
        );
        if plan.query_moved {
            tracing::warn!(stream = %id, "the stream's query changed since its checkpoint; reconciling with the new one");
        }
        if plan.new_route.is_some() {
            tracing::warn!(stream = %id, "the stream's topic or key changed since its checkpoint; retracting what it announced there and reconciling");
        }
        if let Some(s) = saved.as_mut().filter(|_| plan.drop_position) {
            if s.rv.take().is_some() {
                let reason = if plan.new_route.is_some() {
                    "route"
                } else {
                    "query"
                };
                metrics
                    .positions_dropped
                    .with_label_values(&[&id, reason])
                    .inc();
            }
        }
        let covered = saved
            .as_ref()
            .filter(|s| s.rv.is_some())
            .and_then(|s| s.covered.clone())
            .map(Arc::new);
        let limits = Limits {
            max_in_flight: cfg.kafka.max_in_flight_per_stream,
            max_message_bytes: cfg.kafka.max_message_bytes,
            oversize: cfg.kafka.oversize,
            dead_letter_topic: cfg.kafka.dead_letter_topic.clone(),
            tombstones: channel.tombstones,
            membership_topic: wiring.membership_topic.clone(),
            owner: wiring.owner.clone(),
        };
        let mut outbox = Outbox::new(
            &id,
            Arc::new(route),
            wiring.producer.clone(),
            limits,
            saved,
            members,
            &metrics,
            shutdown.clone(),
        );
        outbox.raise_era_floor(wiring.era_floor);
        reporter.track_liveness(metrics.last_event.with_label_values(&[&id]));
        let m = StreamMetrics {
            received: EventType::ALL.map(|t| {
                metrics
                    .events_received
                    .with_label_values(&[&id, t.as_str()])
            }),
            filtered: metrics.events_filtered.with_label_values(&[&id]),
            malformed: metrics.malformed_lines.with_label_values(&[&id]),
            synthetic_deletes: metrics.synthetic_deletes.with_label_values(&[&id]),
            unchanged: metrics.resync_unchanged.with_label_values(&[&id]),
            full_fallbacks: metrics.resync_full_fallbacks.with_label_values(&[&id]),
            resyncs: metrics.resyncs.with_label_values(&[&id]),
            up: metrics.stream_up.with_label_values(&[&id]),
            last_event: metrics.last_event.with_label_values(&[&id]),
        };
        let seed = id.bytes().fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100000001b3)
        }) ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        let k = &cfg.kubernetes;
        Self {
            backoff: Backoff::new(
                Duration::from_millis(k.backoff_initial_ms),
                Duration::from_millis(k.backoff_max_ms),
                seed,
            ),
            timers: Timers {
                publish: Box::pin(tokio::time::sleep(Duration::ZERO)),
                publish_every: Duration::from_millis(cfg.checkpoint.interval_ms),
                idle: Box::pin(tokio::time::sleep(Duration::ZERO)),
                idle_after: Duration::from_secs(u64::from(k.watch_idle_timeout_seconds)),
            },
            position: Position {
                query,
                sum: None,
                table: None,
                query_changed: plan.query_changed,
                route_id: plan.route_id,
                new_route: plan.new_route,
                full_resync: false,
                covered,
                take_in_era: false,
                era_fresh: false,
            },
            syncs: Syncs {
                permits: wiring.syncs.clone(),
                held: Permit::None,
            },
            scope: filter.map(|f| scope::Scoped::new(f, base, saved_query, saved_sum, saved_table)),
            fences: fences::Fences::saved(saved_fences),
            relist: None,
            checkpoints: wiring.checkpoints,
            source: Source {
                path,
                api_version: channel.path.api_version(),
                trim: Trim {
                    drop_managed_fields: channel.drop_managed_fields,
                    allow_secret_data: channel.allow_secret_data,
                },
                kind: crate::catalogue::kind_of(&channel.path.resource_name())
                    .unwrap_or_default()
                    .to_string(),
                object_buf: Vec::new(),
                fanned: crate::config::StreamId::shard_in(&id)
                    .zip(wiring.fanouts.clone())
                    .map(|(shard, fanouts)| Fanned {
                        fanouts,
                        collection: crate::fanout::Collection {
                            path: channel.path.collection_url(None),
                            label_selector: channel.label_selector.clone(),
                            field_selector: channel.field_selector.clone(),
                            api_version: channel.path.api_version(),
                        },
                        shard,
                    }),
            },
            life: Life {
                stop: cancel,
                leaving,
                fenced: wiring.fenced.clone(),
                shutdown: shutdown.clone(),
            },
            id,
            channel,
            cfg,
            client: wiring.client.clone(),
            metrics,
            m,
            outbox,
            reporter,
        }
    }

    /// Runs until cancelled, then waits (up to the flush timeout) for outstanding deliveries so
    /// the final checkpoint covers them. Gives the reporter back, for the owner to retire once
    /// the stream left its scope.
    pub async fn run(mut self) -> Ended {
        // With a schema registry, nothing is published before the topic's schema is there.
        if let Some(tag) = self.outbox.route().schema.clone() {
            tokio::select! {
                _ = self.life.stop.cancelled() => return self.stop().await,
                _ = tag.registered() => {}
            }
        }
        // A fanned-out part reads its state as initial events from its hub, whatever the hub
        // reads it with.
        let via = if self.cfg.kubernetes.send_initial_events || self.source.fanned.is_some() {
            Via::InitialEvents
        } else {
            Via::Pages
        };
        if let Some(scoped) = self.scope.as_mut() {
            tokio::select! {
                _ = self.life.stop.cancelled() => return self.stop().await,
                _ = scoped.take_all() => {}
            }
            let saved = scoped.saved_query().filter(|q| **q != scoped.fingerprint());
            if let Some(saved) = saved.cloned() {
                // The position covers other namespaces: resumed if it can be told which (its
                // first live read then takes the difference in), else the scope is reconciled.
                let position = self.outbox.checkpoint().map(str::to_string);
                let held = self.outbox.members().namespaces();
                let none = BTreeSet::new();
                let mut resumed = position
                    .as_ref()
                    .is_some_and(|at| scoped.resume_under(&saved, held.clone(), at, &none));
                if let (false, Some(at)) = (resumed, &position) {
                    // Untold: ask the server which namespaces were in scope then.
                    let then = tokio::select! {
                        _ = self.life.stop.cancelled() => return self.stop().await,
                        then = scope_then(&self.client, &self.channel, scoped, at, &self.id) => then,
                    };
                    if let Some(then) = then {
                        resumed = scoped.resume_under(&saved, held, at, &then);
                    }
                }
                if resumed {
                    tracing::info!(stream = %self.id, "the stream's namespaces changed since its checkpoint; resuming from it, then taking the change in");
                } else {
                    tracing::info!(stream = %self.id, "the stream's namespaces changed since its checkpoint; reconciling with them");
                    self.position.query_changed = true;
                    if position.is_some() {
                        self.metrics
                            .positions_dropped
                            .with_label_values(&[&self.id, "scope"])
                            .inc();
                    }
                }
            }
            self.position.query = scoped.fingerprint();
            self.position.sum = Some(scoped.sum());
            self.position.table = Some(scoped.table());
        }
        if let Some(at) = self.outbox.checkpoint() {
            self.fences.resume_from(at);
        }
        self.stamp();
        if self.position.query_changed && !self.forget_position().await {
            return self.stop().await;
        }
        if let Some(route) = self.position.new_route.take() {
            if !self.retract_elsewhere().await {
                return self.stop().await;
            }
            self.position.route_id = route;
            self.stamp();
        }
        let checkpoint = self.resume_from();
        let mut state = machine::start(self.channel.builtin, checkpoint, via);
        loop {
            state = match state {
                State::Done => break,
                State::Backoff { then, delay } => {
                    let outcome = self.wait(delay).await;
                    self.transition(State::Backoff { then, delay }, outcome)
                }
                State::AwaitResource { via } => {
                    let outcome = self.await_resource().await;
                    self.transition(State::AwaitResource { via }, outcome)
                }
                State::Sync { reason, via } => {
                    let Some((reason, outcome)) = self.sync(reason, via).await else {
                        break;
                    };
                    self.transition(State::Sync { reason, via }, outcome)
                }
                State::Watch { at, open } => {
                    let outcome = self.watch(&at, open).await;
                    self.transition(State::Watch { at, open: None }, outcome)
                }
            };
        }
        self.stop().await
    }

    /// The Sync step, with the reason it ran under; `None` when cancelled.
    async fn sync(&mut self, reason: Reason, via: Via) -> Option<(Reason, Step)> {
        // Without a position but with known objects (a changed query, a failure before the
        // first position), a sync reconciles like a resync: known objects the new state lacks
        // get their inferred DELETED. Pending joins settle first, so what an interrupted attempt
        // announced counts as known; a join that failed is a failed delivery like any other.
        match self.outbox.settle_joins().await {
            Ok(()) => {}
            Err(OutboxError::Cancelled) => return None,
            Err(e) => return Some((reason, Self::stopped(e.into()))),
        }
        let reason = machine::sync_reason(reason, !self.outbox.members().is_empty());
        // A fanned-out part takes no permit: its hub's one list serves every part waiting, and
        // a part waiting for a permit while subscribed would hold the hub, and so the parts
        // holding the permits, up.
        if self.source.fanned.is_some() {
            self.set_phase(Phase::Syncing);
        } else {
            self.syncs.held = Permit::Held(self.sync_permit().await?);
        }
        if let Some(scoped) = self.scope.as_mut() {
            tokio::select! {
                _ = self.life.stop.cancelled() => return None,
                _ = scoped.take_all() => {}
            }
        }
        // A full resync (asked for, or the history went back) forgets the position first: a
        // crash midway must not leave a later start to resume from it, or to take a delta
        // from it, when that is exactly what this resync is for. It does so even without a
        // position: after a rewind the checkpoint writer drops this stream's positions until
        // it sees that its resync began. So does a sync under namespaces other than the
        // position's (the scope moved while the stream was not watching): its DELETEDs and
        // ADDEDs of the namespaces that moved are no replay from that position, and a start
        // resuming from it under the old namespaces would never undo them.
        let scope_moved = self
            .scope
            .as_ref()
            .is_some_and(|s| s.fingerprint() != self.position.query)
            && self.outbox.checkpoint().is_some();
        if (reason == Reason::Resync && self.position.full_resync) || scope_moved {
            if let Err(why) = self.drained().await {
                // Not held through the backoff that follows.
                self.syncs.held = Permit::None;
                return Some((reason, Self::stopped(why)));
            }
            if !self.forget_position().await {
                return None;
            }
        }
        // A sync without a position announces from scratch, in a new era: it may not continue
        // the history the stream's last records came from (see `envelope::version`). The era
        // is written before anything is published in it, so that a crash midway leaves the
        // next owner (whose clock may be behind) a floor above it.
        if self.outbox.checkpoint().is_none()
            && !self.position.era_fresh
            && !self.forget_position().await
        {
            return None;
        }
        let outcome = match via {
            Via::InitialEvents => self.sync_initial(reason).await,
            Via::Pages => self.sync_pages(reason).await,
        };
        self.syncs.held = Permit::None;
        let outcome = match outcome {
            Outcome::Synced { .. } => match self.settle_scope().await {
                Ok(()) => {
                    self.position.era_fresh = false;
                    // Its position is the list's, above every fence: positions committed from
                    // now on carry none. Until here they kept them, so that a sync cut short
                    // (a failed delivery resumes from the checkpoint, a crash restarts from
                    // it) publishes nothing twice. Its list took every object in.
                    self.fences.clear();
                    self.position.covered = None;
                    self.stamp();
                    outcome
                }
                Err(why) => Self::stopped(why),
            },
            outcome => outcome,
        };
        Some((reason, outcome))
    }

    /// Settles reports until the outbox has room, its sync permit lent meanwhile.
    async fn room(&mut self) -> Result<(), Stop> {
        if self.outbox.has_room() {
            return Ok(());
        }
        self.syncs.lend();
        self.outbox.wait_for_room().await?;
        self.syncs.reclaim(&self.life.stop).await
    }

    /// Settles reports until nothing is in flight, its sync permit lent meanwhile.
    async fn drained(&mut self) -> Result<(), Stop> {
        if self.outbox.in_flight() == 0 {
            return Ok(());
        }
        self.syncs.lend();
        self.outbox.wait_until(0).await?;
        self.syncs.reclaim(&self.life.stop).await
    }

    /// Waits a random delay below `syncJitterMs`, then for one of the relay's sync permits;
    /// `None` when cancelled first.
    async fn sync_permit(&mut self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let jitter = self.cfg.kubernetes.sync_jitter_ms;
        let delay = Duration::from_millis(if jitter == 0 {
            0
        } else {
            self.backoff.random() % jitter
        });
        self.set_phase(Phase::Waiting);
        let permit = self.syncs.take(delay, &self.life.stop).await?;
        self.set_phase(Phase::Syncing);
        Some(permit)
    }

    /// Logs and counts what a step reported, then moves the machine.
    fn transition(&mut self, state: State<Feed>, outcome: Step) -> State<Feed> {
        if let Outcome::Stopped { why, .. } = &outcome {
            match why {
                Stop::Gone => {
                    self.m.resyncs.inc();
                    tracing::info!(stream = %self.id, "resourceVersion expired; relisting");
                }
                Stop::Behind => {
                    self.m.resyncs.inc();
                    tracing::info!(stream = %self.id, "the API server has not reached the stream's position (a lagging watch cache, or an etcd restore); relisting after a backoff, as a delta unless the list is older than the position");
                }
                Stop::Rewound => {
                    self.m.resyncs.inc();
                    tracing::warn!(stream = %self.id, "the API server's history went back behind the stream's position (an etcd restore?); relisting and re-announcing every object");
                }
                Stop::Delivery { failure, .. } => {
                    tracing::warn!(stream = %self.id, %failure, "delivery failed; replaying from the checkpoint");
                    self.reporter
                        .problem(format!("Kafka did not take its records: {failure}"));
                }
                Stop::NotServed => {
                    tracing::info!(stream = %self.id, resource = %self.channel.path.resource_name(), "resource not served; waiting for it")
                }
                Stop::Api(e) => {
                    self.metrics
                        .api_errors
                        .with_label_values(&[&self.id, e.kind()])
                        .inc();
                    if let (Some(_), ApiError::Status { code: 403, .. }) = (&self.scope, e) {
                        tracing::error!(stream = %self.id, resource = %self.channel.path.resource_name(), channel = %self.channel.name, "listing and watching the resource across the cluster is forbidden: grant list and watch on it cluster-wide (`watchrelay rbac` prints what the configuration needs) or set watchStrategy: perNamespace on the channel");
                    }
                    if let ApiError::Status {
                        code: code @ (401 | 403),
                        ..
                    } = e
                    {
                        self.reporter
                            .problem(format!("the API server refuses it ({code}): {e}"));
                    }
                    if let ApiError::Body(_) = e {
                        tracing::info!(stream = %self.id, error = %e, "watch connection ended; resuming");
                    } else {
                        tracing::warn!(stream = %self.id, error = %e, "API request failed; backing off");
                    }
                }
                Stop::Requested => {
                    self.m.resyncs.inc();
                    tracing::info!(stream = %self.id, "resync requested; relisting");
                }
                Stop::Stalled => {
                    tracing::warn!(stream = %self.id, idle = ?self.timers.idle_after, "watch delivered nothing, not even a bookmark; reopening it")
                }
                Stop::Cancelled | Stop::Closed | Stop::Refused => {}
            }
        }
        // Its checkpoints carry the fingerprint of the namespaces applied once everything
        // announced under them is acknowledged (see `scope`): until then, a scope change is not
        // on its watch.
        let profile = Profile {
            unsettled: self
                .scope
                .as_ref()
                .is_some_and(|s| s.fingerprint() != self.position.query),
        };
        let t = machine::next(state, outcome, &mut self.backoff, profile);
        self.position.full_resync |= t.full;
        if let Some(reason) = t.restart {
            self.metrics
                .watch_restarts
                .with_label_values(&[&self.id, reason])
                .inc();
        }
        match &t.next {
            State::Backoff { .. } | State::AwaitResource { .. } => self.set_phase(Phase::Waiting),
            State::Sync { .. } => self.set_phase(Phase::Syncing),
            State::Watch { .. } | State::Done => {}
        }
        t.next
    }

    /// Where the stream resumes its watch from: its checkpoint (a fanned-out part resumes
    /// through its hub, which reopens its shared watch from there when it must).
    fn resume_from(&self) -> Option<String> {
        self.outbox.checkpoint().map(str::to_string)
    }

    fn set_phase(&self, phase: Phase) {
        self.reporter.phase(phase);
        self.m.up.set((phase == Phase::Watching) as i64);
    }

    /// Publishes the checkpoint if it moved since it was last published.
    fn publish_checkpoint(&mut self) -> Option<Arc<Saved>> {
        self.stamp();
        let published = self.outbox.take_saved().map(|mut saved| {
            saved.query = Some(self.stamped_query());
            saved.sum = self.position.sum.clone();
            saved.table = self.position.table.clone();
            saved.fences = Stamp::fences_above(&self.fences.all(), saved.rv.as_deref());
            saved.covered = (self.position.covered.as_deref())
                .filter(|_| saved.rv.is_some())
                .cloned();
            saved.route = Some(self.position.route_id.clone());
            saved.kind = self.learned_kind();
            self.reporter.checkpoint(saved)
        });
        let next = tokio::time::Instant::now() + self.timers.publish_every;
        self.timers.publish.as_mut().reset(next);
        published
    }

    /// What an API error means for the machine (see [`machine::api_stop`]).
    fn api_stopped(&self, e: ApiError) -> Stop {
        machine::api_stop(e, self.channel.builtin)
    }

    fn stopped(why: Stop) -> Step {
        Outcome::Stopped { why, at: None }
    }

    fn query(&self) -> Query<'_> {
        Query {
            label_selector: self.channel.label_selector.as_deref(),
            field_selector: self.channel.field_selector.as_deref(),
            shard_selector: None,
        }
    }

    /// Leaving scope is a deletion: every object the stream announced gets an inferred DELETED
    /// (flagged `synthetic`, so consumers can tell it from a real one). Should the relay stop
    /// meanwhile, the rest is abandoned: the stream's entry stays and it resumes next time.
    /// `rv` is the position the inferred DELETEDs name, as it was before it was forgotten, if
    /// the stream had one.
    async fn leave_scope(&mut self, rv: &str) {
        self.ensure_kind().await;
        let known: Vec<_> = self.outbox.members().keys().collect();
        tracing::info!(stream = %self.id, objects = known.len(), "left its scope: deleting what it announced");
        // Without a position (a leave cut short in an earlier run forgot it), every DELETED
        // names the highest version a member joined at, in the stream's new era: above all the
        // stream announced before.
        let rv = if rv.is_empty() {
            known
                .iter()
                .filter_map(|k| self.outbox.members().get_key(k))
                .filter_map(|(_, k)| k.rv.parse::<u64>().ok())
                .max()
                .map(|v| v.to_string())
                .unwrap_or_default()
        } else {
            rv.to_string()
        };
        for k in known {
            let Some((uid, k)) = self.outbox.members().get_key(&k) else {
                continue;
            };
            if let Err(why) = self.infer_delete(uid, k, &rv).await {
                tracing::warn!(stream = %self.id, ?why, "leaving scope cut short");
                return;
            }
        }
    }

    /// Makes sure the stream knows its objects' kind before it writes an object without a watch
    /// line (an inferred DELETED): a built-in resource's comes from the catalogue; another's,
    /// unless a list of this run named it, from one short list.
    async fn ensure_kind(&mut self) {
        if self.source.kind.is_empty() {
            let query = self.query();
            let page = kubeapi::list_page(&self.client, &self.source.path, &query, Some(1), None);
            if let Ok(Ok(page)) = tokio::time::timeout(Duration::from_secs(10), page).await {
                self.learn_kind(&page);
            }
        }
    }

    /// Tells the outbox what the stream's positions go with now (see [`Outbox::stamp`]).
    fn stamp(&mut self) {
        let stamp = Stamp {
            query: self.stamped_query(),
            sum: self.position.sum.clone(),
            table: self.position.table.clone(),
            fences: self.fences.all(),
            covered: self.position.covered.clone(),
            route: self.position.route_id.clone(),
            kind: self.learned_kind(),
        };
        self.outbox.stamp(stamp);
    }

    /// The query its positions are stamped with: its own, marked while it is still to take in
    /// what its position does not cover (see [`crate::checkpoint::taking_in`]).
    fn stamped_query(&self) -> String {
        match self.position.covered {
            Some(_) => crate::checkpoint::taking_in(&self.position.query),
            None => self.position.query.clone(),
        }
    }

    /// The kind to keep in the stream's checkpoint entry: one learned from the API server, for
    /// a resource outside the catalogue.
    fn learned_kind(&self) -> Option<String> {
        let builtin = crate::catalogue::kind_of(&self.channel.path.resource_name()).is_some();
        (!builtin && !self.source.kind.is_empty()).then(|| self.source.kind.clone())
    }
}

/// An object that is alive joins the membership, with the identity `meta` gives and the key
/// `route` announces it under.
fn join(meta: &Meta, route: &Route) -> Option<Change> {
    Some(Change::Join {
        uid: meta.uid().to_string(),
        known: Known {
            name: meta.name().to_string(),
            namespace: meta.namespace().map(str::to_string),
            rv: meta.resource_version().to_string(),
            topic: None,
            key: Some(route.key.render(meta)),
        },
    })
}
