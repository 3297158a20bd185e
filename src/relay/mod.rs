//! The facade and leadership.
//!
//! [`Relay`] starts the whole relay — for `main` and for tests alike: leader election when
//! configured (or sharding, `shards/`), then a term per leadership term (or per owned
//! shard), each run by `term/` through its phases: the membership topic verified and read
//! back ([`membership::Restore`]), the streams the configuration no longer runs retired
//! ([`membership::Retire`]), then the supervisor, which spawns one stream per (channel,
//! namespace) and follows namespace selectors, and the checkpoint writer; at the end
//! everything shuts down in order.
//!
//! Shutdown order: streams stop reading and drain their outstanding deliveries, the producer is
//! flushed, and the checkpoint is written one last time, so a clean stop replays nothing.
//!
//! The relay's shared parts are a `Context` (`context.rs`) that terms and shards borrow: no
//! part of this folder imports the facade.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::checkpoint::Store;
use crate::config::{Config, RELEASE_RESERVE};
use crate::group::{self, Coordinator};
use crate::leader::Elector;
use crate::membership::{self, Log, Owner};
use crate::metrics::Metrics;
use crate::producer::{self, Producer};
use crate::registry::{self, Registry, Role};
use crate::schemas::Schemas;
pub use context::RelayError;
use context::{Context, Sink};
use others::Others;
pub use preflight::preflight;
pub use split::Split;
use term::{Run, Term};

mod context;
mod feeds;
mod lifecycle;
mod migrate;
mod moves;
mod others;
mod pacer;
mod preflight;
mod reach;
mod shapes;
mod shards;
mod split;
mod term;
mod topics;

/// The whole relay. Take the handles you need ([`Relay::metrics`], [`Relay::registry`],
/// [`Relay::shutdown`]) before [`Relay::run`].
pub struct Relay {
    ctx: Context,
}

/// Restores a replica runs at once ([`Relay`]'s `restores`).
const RESTORES_AT_ONCE: usize = 8;

impl Relay {
    /// A relay of `cfg` through `client`, to Kafka; nothing runs until [`Relay::run`].
    pub fn new(cfg: Config, client: kube::Client) -> Self {
        let stall_bound = Duration::from_secs(u64::from(cfg.kubernetes.watch_idle_timeout_seconds));
        let metrics = Arc::new(Metrics::new());
        metrics
            .in_flight_limit
            .set(i64::try_from(cfg.kafka.max_in_flight_per_stream).unwrap_or(i64::MAX));
        let syncs = Arc::new(tokio::sync::Semaphore::new(
            cfg.kubernetes.max_concurrent_syncs as usize,
        ));
        let fanouts = cfg.sharding.enabled.then(|| {
            let k = &cfg.kubernetes;
            let settings = crate::fanout::Settings {
                sharding: cfg.sharding.clone(),
                list_page_size: k.list_page_size,
                watch_timeout_seconds: k.watch_timeout_seconds,
                idle: stall_bound,
            };
            Arc::new(crate::fanout::Fanouts::new(
                client.clone(),
                settings,
                metrics.clone(),
            ))
        });
        Self {
            ctx: Context {
                fanouts,
                probe: crate::kubeclient::Target::Configured(cfg.kubernetes.clone()),
                feeds: Arc::new(feeds::Feeds::new(client.clone())),
                pacer: Arc::default(),
                restores: Arc::new(tokio::sync::Semaphore::new(RESTORES_AT_ONCE)),
                cfg: Arc::new(cfg),
                client,
                syncs,
                sink: Sink::Kafka,
                metrics,
                registry: Registry::with_stall_bound(stall_bound),
                shutdown: CancellationToken::new(),
                checkpoints: true,
                coordinator: Arc::new(group::Kafka),
                schemas: None,
            },
        }
    }

    /// A trial run: envelopes go to standard output as JSON lines, every stream starts with a
    /// list (no checkpoint is read or written), no Lease is taken.
    pub fn dry_run(mut self) -> Self {
        self.ctx.sink = Sink::Given(
            Arc::new(producer::Stdout),
            Arc::new(membership::log::Empty),
            None,
        );
        self.ctx.checkpoints = false;
        self
    }

    /// Sends records to `producer` instead of Kafka, and reads the membership topic from
    /// `log`.
    pub fn with_producer(mut self, producer: Arc<dyn Producer>, log: Arc<dyn Log>) -> Self {
        self.ctx.sink = Sink::Given(producer, log, None);
        self
    }

    /// With a given producer ([`Relay::with_producer`]) and `delivery: exactlyOnce`: the terms'
    /// transactional producers connect through `source` (a test double's transactions).
    pub fn with_transactions(mut self, source: producer::TxnSource) -> Self {
        if let Sink::Given(_, _, txns) = &mut self.ctx.sink {
            *txns = Some(source);
        }
        self
    }

    /// Probes the API server's reachability with a client of `target` (by default, the
    /// cluster `kubernetes` names), built on the probe's own runtime.
    pub fn with_probe(mut self, target: crate::kubeclient::Target) -> Self {
        self.ctx.probe = target;
        self
    }

    /// Meets the other replicas through `coordinator` instead of Kafka's group coordinator
    /// (with sharding on).
    pub fn with_coordinator(mut self, coordinator: Arc<dyn Coordinator>) -> Self {
        self.ctx.coordinator = coordinator;
        self
    }

    /// The relay's metrics, as `/metrics` serves them.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.ctx.metrics.clone()
    }

    /// The live streams and their phases, behind `/readyz` and the tests' waits.
    pub fn registry(&self) -> Registry {
        self.ctx.registry.clone()
    }

    /// Cancel it to stop: the relay drains, writes its last checkpoint and returns.
    pub fn shutdown(&self) -> CancellationToken {
        self.ctx.shutdown.clone()
    }

    /// Splits the streams this sharded release keeps whole from before fan-out into the
    /// shards' parts, each resuming from the stream's position, while no replica of the release
    /// runs (`watchrelay split-whole`; see `split.rs`). Refused while one does. What it split;
    /// nothing when no stream is kept whole.
    pub async fn split_whole(self) -> Result<Vec<Split>, RelayError> {
        split::run(&self.ctx).await
    }

    /// Runs until shut down; with leader election on, relays only while this replica holds the
    /// Lease. A replica that loses the Lease drains (its checkpoints still cover only what
    /// Kafka acknowledged) and stands by again; a clean stop releases the Lease so a standby
    /// takes over at once.
    ///
    /// With a schema registry, each topic's schema is registered before its first record and
    /// kept registered; a schema the registry refuses stops the relay with that error.
    pub async fn run(mut self) -> Result<(), RelayError> {
        if self.ctx.cfg.sharding.enabled && self.ctx.checkpoints {
            // What the release runs is settled once for the replica's life, before anything
            // reads the channels.
            let settled = moves::check(&self.ctx.cfg, &self.ctx.client, &self.ctx.shutdown)
                .await
                .map_err(RelayError::Refused)?;
            self.ctx.cfg = Arc::new(settled);
        }
        let refused = Arc::new(std::sync::Mutex::new(None));
        if self.ctx.checkpoints {
            self.ctx.schemas = Schemas::new(
                self.ctx.cfg.clone(),
                self.ctx.client.clone(),
                self.ctx.metrics.schema_registry_pending.clone(),
            )
            .map_err(|e| RelayError::Refused(format!("schema registry client: {e}")))?;
        }
        let keeper = self.ctx.schemas.clone().map(|schemas| {
            let (stop, shutdown, refused) = (
                self.ctx.shutdown.child_token(),
                self.ctx.shutdown.clone(),
                refused.clone(),
            );
            tokio::spawn(async move {
                if let Err(e) = schemas.run(stop).await {
                    tracing::error!(error = %e, "stopping: the schema registry refused a topic's schema");
                    *refused.lock().expect("not poisoned") = Some(e.to_string());
                    shutdown.cancel();
                }
            })
        });
        let result = self.relay().await;
        if let Some(keeper) = keeper {
            keeper.abort();
        }
        let refused = refused.lock().expect("not poisoned").take();
        match refused {
            Some(why) => Err(RelayError::Schema(why)),
            None => result,
        }
    }

    /// [`Relay::run`], once the schemas are kept.
    async fn relay(&self) -> Result<(), RelayError> {
        let unready = &self.ctx.metrics.topics_unready;
        if self.ctx.checkpoints
            && !topics::ready(
                &self.ctx.cfg,
                self.ctx.admin(),
                &self.ctx.registry,
                unready,
                &self.ctx.shutdown,
            )
            .await
        {
            return Ok(());
        }
        if self.ctx.cfg.sharding.enabled && self.ctx.checkpoints {
            return shards::run(&self.ctx).await;
        }
        if self.ctx.checkpoints {
            crate::leader::refuse_unsharding(&self.ctx.client, &self.ctx.cfg, &self.ctx.shutdown)
                .await
                .map_err(RelayError::Refused)?;
        }
        if !self.ctx.checkpoints {
            self.ctx.metrics.leader.set(1);
            return self
                .term(self.ctx.shutdown.clone(), CancellationToken::new())
                .await;
        }
        if !self.ctx.cfg.leader_election.enabled {
            return self.unelected().await;
        }
        let le = &self.ctx.cfg.leader_election;
        let namespace = self.ctx.cfg.lease_namespace();
        let mut elector = Elector::new(self.ctx.client.clone(), namespace, le);
        tracing::info!(lease = %elector.name(), identity = %elector.identity(), "leader election on");
        loop {
            self.ctx.registry.begin_term(Role::Standby);
            // A stop while standing by (or while draining after a loss) ends here; the release
            // covers an attempt that won the Lease just as the stop came.
            if self.ctx.shutdown.is_cancelled() || !elector.acquire(&self.ctx.shutdown).await {
                elector.release(RELEASE_RESERVE).await;
                return Ok(());
            }
            self.ctx.registry.begin_term(Role::Leader);
            self.ctx.metrics.leader.set(1);
            let stop = self.ctx.shutdown.child_token();
            let fenced = CancellationToken::new();
            let done = CancellationToken::new();
            let relay = async {
                let result = self.term(stop.clone(), fenced.clone()).await;
                done.cancel();
                result
            };
            let keeper = async {
                let lost = elector.keep(&done).await;
                if lost.is_some() {
                    self.ctx.metrics.leader.set(0);
                    fenced.cancel();
                    stop.cancel();
                }
                lost
            };
            let (result, lost) = tokio::join!(relay, keeper);
            self.ctx.metrics.leader.set(0);
            match (result, lost) {
                (result, None) => {
                    elector.release(RELEASE_RESERVE).await;
                    return result;
                }
                (Err(e), Some(_)) => return Err(e),
                (Ok(()), Some(why)) => {
                    tracing::error!(lease = %elector.name(), %why, "lost the lease; stopped relaying and standing by");
                }
            }
        }
    }

    /// Relays without leader election until shut down, or until replicas of this release start
    /// sharded: then it stops as at a shutdown (drains, writes its last checkpoint) within
    /// [`crate::config::Config::handoff`] of the Lease being parked, so the shards copy the
    /// state it left and never relay alongside it, and refuses to go on.
    async fn unelected(&self) -> Result<(), RelayError> {
        self.ctx.metrics.leader.set(1);
        let stop = self.ctx.shutdown.child_token();
        let sharded = {
            let (client, cfg, stop) = (self.ctx.client.clone(), self.ctx.cfg.clone(), stop.clone());
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return None,
                        _ = tokio::time::sleep(crate::config::SHARDING_WATCH) => {}
                    }
                    if let Ok(Some(marker)) = crate::leader::sharded_marker(&client, &cfg).await {
                        tracing::warn!(%marker, "replicas of this release started sharded: stopping so they take the state over");
                        stop.cancel();
                        return Some(marker);
                    }
                }
            })
        };
        let relayed = self.term(stop.clone(), CancellationToken::new()).await;
        stop.cancel();
        self.ctx.metrics.leader.set(0);
        match sharded.await.ok().flatten() {
            Some(marker) => Err(RelayError::Refused(format!(
                "replicas of this release started sharded ({marker}): this single leader, without leader election, stopped and left them its state; remove it (the rollout that turned sharding on does)"
            ))),
            None => relayed,
        }
    }

    /// One term of relaying, until `stop`; then drains and writes the final checkpoint.
    ///
    /// With `fenced` (the Lease or the shard was lost) the stop is a fence instead: streams stop
    /// reading and do not drain, the producer's queued and in-flight records are purged so
    /// nothing queued (or retried) can land after the new owner's records, and no checkpoint is
    /// written after the loss. What remains possible
    /// is a request already on the wire when the loss was noticed (at most
    /// `max.in.flight.requests.per.connection` batches per broker), landing within the
    /// producer's request timeout, and a checkpoint write already under way.
    async fn term(
        &self,
        stop: CancellationToken,
        fenced: CancellationToken,
    ) -> Result<(), RelayError> {
        let owner = Owner::new(
            &self.ctx.cfg.checkpoint.namespace,
            &self.ctx.cfg.checkpoint.name,
        );
        // The transactional producer owns its id until the term is fenced or over: a commit
        // failing after that never builds it again (that would fence the next leader's).
        let owns = fenced.child_token();
        let _owns = owns.clone().drop_guard();
        let Some((producer, log)) = self.ctx.term_sink(&owner, &stop, &owns).await? else {
            return Ok(());
        };
        let plan = Term {
            producer,
            log,
            store: Store::new(
                self.ctx.client.clone(),
                &self.ctx.cfg.checkpoint.namespace,
                &self.ctx.cfg.checkpoint.name,
            ),
            owner,
            membership_topic: self
                .ctx
                .cfg
                .checkpoint
                .membership
                .topic(&self.ctx.cfg.cluster_name),
            partitions: self.ctx.cfg.checkpoint.membership.partitions.unwrap_or(1),
            part: registry::whole(),
            shard: None,
            // Sharded releases of the cluster keep their members in the shards' topic.
            others: Others::In(
                Some(self.ctx.cfg.sharding.topic(&self.ctx.cfg.cluster_name))
                    .filter(|t| {
                        *t != self
                            .ctx
                            .cfg
                            .checkpoint
                            .membership
                            .topic(&self.ctx.cfg.cluster_name)
                    })
                    .into_iter()
                    .collect(),
            ),
            watching: None,
            starting: None,
        };
        Run::new(&self.ctx, plan, stop, fenced).run().await
    }
}
