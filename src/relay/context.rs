//! What every part of the relay shares: its configuration and clients, its metrics and
//! registry, where its records go, and the limits every term takes turns under ([`Context`]);
//! and the relay's error. The facade (`mod.rs`) owns one; terms and shards borrow it, so none of
//! them depends on the facade.

use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio_util::sync::CancellationToken;

use super::feeds;
use super::pacer::Pacer;
use crate::config::Config;
use crate::group::{self, Coordinator};
use crate::membership::{self, Log};
use crate::metrics::Metrics;
use crate::producer::{self, Producer, TxnError};
use crate::registry::Registry;
use crate::schemas::Schemas;

/// The kind of readiness problem of a transactional id Kafka refuses ([`Context::refused`]).
const REFUSED_ID: &str = "transactional_id";

/// A producer and the membership log it writes to.
pub(super) type Outlet = (Arc<dyn Producer>, Arc<dyn Log>);

/// How long to wait before trying again what must be read or set up in Kafka before a term.
pub(super) const RETRY: Duration = Duration::from_secs(5);

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
    /// Splitting the streams kept whole failed midway (`watchrelay split-whole`): run it again.
    #[error("splitting the streams kept whole: {0}; run the split again to finish it")]
    Split(String),
    /// The schema registry refused a topic's schema: nothing more may be published under it.
    #[error("stopped: {0}")]
    Schema(String),
}

/// Where records go: a new Kafka producer per leadership term, or one given producer with the
/// membership log it writes to.
pub(super) enum Sink {
    Kafka,
    /// A given producer and membership log; with `delivery: exactlyOnce`, the terms'
    /// transactional producers connect through the source given too.
    Given(Arc<dyn Producer>, Arc<dyn Log>, Option<producer::TxnSource>),
}

/// What [`Context::transactional`] gave.
pub(super) enum Transactions {
    /// At-least-once delivery (or a given sink): the shared producer serves.
    Off,
    /// Stopped before Kafka answered.
    Stopped,
    /// The term's own transactional producer.
    On(Arc<dyn Producer>),
}

/// The relay's shared parts (see the module).
pub(super) struct Context {
    pub(super) cfg: Arc<Config>,
    pub(super) client: kube::Client,
    pub(super) sink: Sink,
    pub(super) metrics: Arc<Metrics>,
    pub(super) registry: Registry,
    pub(super) shutdown: CancellationToken,
    /// Load and write checkpoints (off for a dry run).
    pub(super) checkpoints: bool,
    /// Where replicas meet, with sharding on.
    pub(super) coordinator: Arc<dyn Coordinator>,
    /// The permits of `kubernetes.maxConcurrentSyncs`, one set for the process: shared by every
    /// term, so a replica owning many shards still runs that many syncs at most.
    pub(super) syncs: Arc<tokio::sync::Semaphore>,
    /// Where the API server's reachability probe builds its own client, with sharding on.
    pub(super) probe: crate::kubeclient::Target,
    /// The namespaces each selector matches, followed once for every term of the replica.
    pub(super) feeds: Arc<feeds::Feeds>,
    /// Turns of the checkpoint writers of every term, so a replica's ConfigMap requests stay
    /// bounded whatever it owns.
    pub(super) pacer: Arc<Pacer>,
    /// Restores at once, over every term: each reads with Kafka clients of its own (a
    /// consumer and a producer of end markers), and a replica claiming 64 shards at its start
    /// would otherwise open 128 at once.
    pub(super) restores: Arc<tokio::sync::Semaphore>,
    /// With a schema registry: the topics' schema tags, kept registered while the relay runs.
    pub(super) schemas: Option<Arc<Schemas>>,
    /// With sharding on: the collections read once for every shard of the replica.
    pub(super) fanouts: Option<Arc<crate::fanout::Fanouts>>,
}

impl Context {
    /// Where this relay's records go, and its membership log. With sharding on, records wait
    /// for their delivery at most [`crate::config::ShardingConfig::delivery_timeout`] (unless
    /// `kafka.properties` says otherwise).
    /// What creates and describes topics: the membership log's admin.
    pub(super) fn admin(&self) -> Arc<dyn Log> {
        match &self.sink {
            Sink::Kafka => Arc::new(membership::log::Kafka::new(&self.cfg.kafka)),
            Sink::Given(_, log, _) => log.clone(),
        }
    }

    /// A term's producer and membership log: with `kafka.delivery: exactlyOnce` a
    /// transactional producer of its own ([`Context::transactional`]); `None` once `stop` fires
    /// first.
    pub(super) async fn term_sink(
        &self,
        owner: &membership::Owner,
        stop: &CancellationToken,
        fenced: &CancellationToken,
    ) -> Result<Option<Outlet>, RelayError> {
        // A single leader's term owns the id until fenced: its lease's loss fences it.
        let proven: producer::Proof = Arc::new(|| true);
        match self.transactional(owner, stop, fenced, &proven).await {
            Transactions::Off => self.sink().map(Some),
            Transactions::Stopped => Ok(None),
            Transactions::On(p) => Ok(Some((p, self.admin()))),
        }
    }

    /// With `kafka.delivery: exactlyOnce` and Kafka as the sink, a transactional producer whose
    /// id is the term's `owner`'s, so that the next owner's fences it (see
    /// [`producer::Transactional`]): built again every [`RETRY`] until Kafka answers, or until
    /// `stop` fires. Once `fenced` fires, it is never built again under the id; while `proven`
    /// says no, it commits nothing.
    pub(super) async fn transactional(
        &self,
        owner: &membership::Owner,
        stop: &CancellationToken,
        fenced: &CancellationToken,
        proven: &producer::Proof,
    ) -> Transactions {
        let Some((id, connect)) = self.txn_connect(owner) else {
            return Transactions::Off;
        };
        let metrics = producer::TxnMetrics {
            commits: self.metrics.transactions.with_label_values(&["committed"]),
            aborts: self.metrics.transactions.with_label_values(&["aborted"]),
            commit_seconds: self.metrics.transaction_commit_seconds.clone(),
        };
        let interval = Duration::from_millis(self.cfg.kafka.commit_interval_ms);
        loop {
            let started = producer::Transactional::start_with(
                connect.clone(),
                interval,
                fenced.clone(),
                proven.clone(),
                metrics.clone(),
            );
            let started = tokio::select! {
                _ = stop.cancelled() => return Transactions::Stopped,
                s = started => s,
            };
            self.refused(owner, started.as_ref().err());
            match started {
                Ok(p) => return Transactions::On(p),
                Err(e) => {
                    tracing::warn!(error = %e.message, transactional_id = %id, "starting the transactional producer; trying again");
                    tokio::select! {
                        _ = stop.cancelled() => return Transactions::Stopped,
                        _ = tokio::time::sleep(RETRY) => {}
                    }
                }
            }
        }
    }

    /// Holds `/readyz`, naming the ACL to grant, while Kafka refuses the relay's principal the
    /// transactional id of `owner`'s terms (`failed` with [`TxnError::denied`]); lifts it once
    /// a call under the id went through (`failed` `None`). Another failure leaves it as it is.
    pub(super) fn refused(&self, owner: &membership::Owner, failed: Option<&TxnError>) {
        let problem = match failed {
            Some(e) if e.denied => {
                let cluster = &self.cfg.cluster_name;
                let reason = format!(
                    "Kafka refused the transactional id watchrelay/{cluster}/{owner}: {}; grant the relay's principal Write and Describe on the transactional ids prefixed watchrelay/{cluster}/",
                    e.message
                );
                Some((REFUSED_ID.to_string(), reason))
            }
            Some(_) => return,
            None => None,
        };
        self.registry
            .block_for(&format!("{owner} transactions"), problem);
        let refused = self.registry.blocked_count(REFUSED_ID);
        (self.metrics.transactional_ids_refused).set(i64::try_from(refused).unwrap_or(i64::MAX));
    }

    /// With `kafka.delivery: exactlyOnce` and Kafka (or a given source) as the sink, the
    /// transactional id of `owner`'s terms and what connects it; `None` otherwise.
    pub(super) fn txn_connect(
        &self,
        owner: &membership::Owner,
    ) -> Option<(String, Arc<dyn producer::Connect>)> {
        if self.cfg.kafka.delivery != crate::config::Delivery::ExactlyOnce {
            return None;
        }
        let id = format!("watchrelay/{}/{owner}", self.cfg.cluster_name);
        let connect: Arc<dyn producer::Connect> = match &self.sink {
            Sink::Kafka => {
                // One producer a shard: each holds a shard's share of the replica's queue.
                let shares = if self.cfg.sharding.enabled {
                    self.cfg.sharding.shards
                } else {
                    1
                };
                Arc::new(producer::KafkaConnect::new(
                    &self.cfg.producer_kafka(),
                    &id,
                    shares,
                ))
            }
            Sink::Given(_, _, Some(source)) => (source.0)(&id),
            Sink::Given(_, _, None) => return None,
        };
        Some((id, connect))
    }

    pub(super) fn sink(&self) -> Result<Outlet, RelayError> {
        Ok(match &self.sink {
            Sink::Kafka => (
                producer::Kafka::start(&self.cfg.producer_kafka()).map_err(RelayError::Producer)?,
                Arc::new(membership::log::Kafka::new(&self.cfg.kafka)),
            ),
            Sink::Given(p, log, _) => (p.clone(), log.clone()),
        })
    }
}
