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

use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
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
use others::Others;
pub use preflight::preflight;
use term::{Run, Term};

mod feeds;
mod lifecycle;
mod migrate;
mod moves;
mod others;
mod preflight;
mod reach;
mod shapes;
mod shards;
mod term;
mod topics;

/// A producer and the membership log it writes to.
type Outlet = (Arc<dyn Producer>, Arc<dyn Log>);

/// How long to wait before trying again what must be read or set up in Kafka before a term.
const RETRY: Duration = Duration::from_secs(5);

/// Why the relay stopped before its shutdown was asked for.
#[derive(Debug, Error)]
pub enum RelayError {
    /// The Kafka producer could not be created: librdkafka refused its configuration.
    #[error("cannot create the Kafka producer: {0}")]
    Producer(String),
    /// The replica could not join the shard group.
    #[error(transparent)]
    Group(#[from] group::GroupError),
    /// The configuration cannot be applied to the release as it stands; says the safe way.
    #[error("refusing to start: {0}")]
    Refused(String),
    /// The schema registry refused a topic's schema: nothing more may be published under it.
    #[error("stopped: {0}")]
    Schema(String),
}

/// Where records go: a new Kafka producer per leadership term, or one given producer with the
/// membership log it writes to.
enum Sink {
    Kafka,
    Given(Arc<dyn Producer>, Arc<dyn Log>),
}

/// The whole relay. Take the handles you need ([`Relay::metrics`], [`Relay::registry`],
/// [`Relay::shutdown`]) before [`Relay::run`].
pub struct Relay {
    cfg: Arc<Config>,
    client: kube::Client,
    sink: Sink,
    metrics: Arc<Metrics>,
    registry: Registry,
    shutdown: CancellationToken,
    /// Load and write checkpoints (off for a dry run).
    checkpoints: bool,
    /// Where replicas meet, with sharding on.
    coordinator: Arc<dyn Coordinator>,
    /// The permits of `kubernetes.maxConcurrentSyncs`, one set for the process: shared by every
    /// term, so a replica owning many shards still runs that many syncs at most.
    syncs: Arc<tokio::sync::Semaphore>,
    /// Where the API server's reachability probe builds its own client, with sharding on.
    probe: crate::kubeclient::Target,
    /// The namespaces each selector matches, followed once for every term of the replica.
    feeds: Arc<feeds::Feeds>,
    /// Turns of the checkpoint writers of every term, so a replica's ConfigMap requests stay
    /// bounded whatever it owns.
    pacer: Arc<term::writer::Pacer>,
    /// Restores at once, over every term: each reads with Kafka clients of its own (a
    /// consumer and a producer of end markers), and a replica claiming 64 shards at its start
    /// would otherwise open 128 at once.
    restores: Arc<tokio::sync::Semaphore>,
    /// With a schema registry: the topics' schema tags, kept registered while the relay runs.
    schemas: Option<Arc<Schemas>>,
    /// With sharding on: the collections read once for every shard of the replica.
    fanouts: Option<Arc<crate::fanout::Fanouts>>,
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
        }
    }

    /// A trial run: envelopes go to standard output as JSON lines, every stream starts with a
    /// list (no checkpoint is read or written), no Lease is taken.
    pub fn dry_run(mut self) -> Self {
        self.sink = Sink::Given(Arc::new(producer::Stdout), Arc::new(membership::log::Empty));
        self.checkpoints = false;
        self
    }

    /// Sends records to `producer` instead of Kafka, and reads the membership topic from
    /// `log`.
    pub fn with_producer(mut self, producer: Arc<dyn Producer>, log: Arc<dyn Log>) -> Self {
        self.sink = Sink::Given(producer, log);
        self
    }

    /// Probes the API server's reachability with a client of `target` (by default, the
    /// cluster `kubernetes` names), built on the probe's own runtime.
    pub fn with_probe(mut self, target: crate::kubeclient::Target) -> Self {
        self.probe = target;
        self
    }

    /// Meets the other replicas through `coordinator` instead of Kafka's group coordinator
    /// (with sharding on).
    pub fn with_coordinator(mut self, coordinator: Arc<dyn Coordinator>) -> Self {
        self.coordinator = coordinator;
        self
    }

    /// The relay's metrics, as `/metrics` serves them.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// The live streams and their phases, behind `/readyz` and the tests' waits.
    pub fn registry(&self) -> Registry {
        self.registry.clone()
    }

    /// Cancel it to stop: the relay drains, writes its last checkpoint and returns.
    pub fn shutdown(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Runs until shut down; with leader election on, relays only while this replica holds the
    /// Lease. A replica that loses the Lease drains (its checkpoints still cover only what
    /// Kafka acknowledged) and stands by again; a clean stop releases the Lease so a standby
    /// takes over at once.
    ///
    /// With a schema registry, each topic's schema is registered before its first record and
    /// kept registered; a schema the registry refuses stops the relay with that error.
    pub async fn run(mut self) -> Result<(), RelayError> {
        if self.cfg.sharding.enabled && self.checkpoints {
            // What the release runs is settled once for the replica's life, before anything
            // reads the channels.
            let settled = moves::check(&self.cfg, &self.client, &self.shutdown)
                .await
                .map_err(RelayError::Refused)?;
            self.cfg = Arc::new(settled);
        }
        let refused = Arc::new(std::sync::Mutex::new(None));
        if self.checkpoints {
            self.schemas = Schemas::new(
                self.cfg.clone(),
                self.client.clone(),
                self.metrics.schema_registry_pending.clone(),
            )
            .map_err(|e| RelayError::Refused(format!("schema registry client: {e}")))?;
        }
        let keeper = self.schemas.clone().map(|schemas| {
            let (stop, shutdown, refused) = (
                self.shutdown.child_token(),
                self.shutdown.clone(),
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
        let unready = &self.metrics.topics_unready;
        if self.checkpoints
            && !topics::ready(
                &self.cfg,
                self.admin(),
                &self.registry,
                unready,
                &self.shutdown,
            )
            .await
        {
            return Ok(());
        }
        if self.cfg.sharding.enabled && self.checkpoints {
            return self.run_sharded().await;
        }
        if self.checkpoints {
            crate::leader::refuse_unsharding(&self.client, &self.cfg, &self.shutdown)
                .await
                .map_err(RelayError::Refused)?;
        }
        if !self.checkpoints {
            self.metrics.leader.set(1);
            return self
                .term(self.shutdown.clone(), CancellationToken::new())
                .await;
        }
        if !self.cfg.leader_election.enabled {
            return self.unelected().await;
        }
        let le = &self.cfg.leader_election;
        let namespace = self.cfg.lease_namespace();
        let mut elector = Elector::new(self.client.clone(), namespace, le);
        tracing::info!(lease = %elector.name(), identity = %elector.identity(), "leader election on");
        loop {
            self.registry.begin_term(Role::Standby);
            // A stop while standing by (or while draining after a loss) ends here; the release
            // covers an attempt that won the Lease just as the stop came.
            if self.shutdown.is_cancelled() || !elector.acquire(&self.shutdown).await {
                elector.release(RELEASE_RESERVE).await;
                return Ok(());
            }
            self.registry.begin_term(Role::Leader);
            self.metrics.leader.set(1);
            let stop = self.shutdown.child_token();
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
                    self.metrics.leader.set(0);
                    fenced.cancel();
                    stop.cancel();
                }
                lost
            };
            let (result, lost) = tokio::join!(relay, keeper);
            self.metrics.leader.set(0);
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
        self.metrics.leader.set(1);
        let stop = self.shutdown.child_token();
        let sharded = {
            let (client, cfg, stop) = (self.client.clone(), self.cfg.clone(), stop.clone());
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
        self.metrics.leader.set(0);
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
        let (producer, log) = self.sink()?;
        let plan = Term {
            producer,
            log,
            store: Store::new(
                self.client.clone(),
                &self.cfg.checkpoint.namespace,
                &self.cfg.checkpoint.name,
            ),
            owner: Owner::new(&self.cfg.checkpoint.namespace, &self.cfg.checkpoint.name),
            membership_topic: self.cfg.checkpoint.membership.topic(&self.cfg.cluster_name),
            partitions: self.cfg.checkpoint.membership.partitions.unwrap_or(1),
            part: registry::whole(),
            shard: None,
            // Sharded releases of the cluster keep their members in the shards' topic.
            others: Others::In(
                Some(self.cfg.sharding.topic(&self.cfg.cluster_name))
                    .filter(|t| *t != self.cfg.checkpoint.membership.topic(&self.cfg.cluster_name))
                    .into_iter()
                    .collect(),
            ),
            watching: None,
        };
        Run::new(self, plan, stop, fenced).run().await
    }

    /// Where this relay's records go, and its membership log. With sharding on, records wait
    /// for their delivery at most [`crate::config::ShardingConfig::delivery_timeout`] (unless
    /// `kafka.properties` says otherwise).
    /// What creates and describes topics: the membership log's admin.
    fn admin(&self) -> Arc<dyn Log> {
        match &self.sink {
            Sink::Kafka => Arc::new(membership::log::Kafka::new(&self.cfg.kafka)),
            Sink::Given(_, log) => log.clone(),
        }
    }

    fn sink(&self) -> Result<Outlet, RelayError> {
        Ok(match &self.sink {
            Sink::Kafka => (
                producer::Kafka::start(&self.cfg.producer_kafka()).map_err(RelayError::Producer)?,
                Arc::new(membership::log::Kafka::new(&self.cfg.kafka)),
            ),
            Sink::Given(p, log) => (p.clone(), log.clone()),
        })
    }
}
