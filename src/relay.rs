//! The facade and the supervisor.
//!
//! [`Relay`] starts the whole relay — for `main` and for tests alike: leader election when
//! configured, then per leadership term the supervisor, which spawns one stream per (channel,
//! namespace), follows namespace selectors, runs the checkpoint writer, and shuts everything
//! down in order.
//!
//! Shutdown order: streams stop reading and drain their outstanding deliveries, the producer is
//! flushed, and the checkpoint is written one last time, so a clean stop replays nothing.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use thiserror::Error;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::channel::{Channel, Scope};
use crate::checkpoint::{self, CheckpointError, Saved, Store};
use crate::config::{Config, RELEASE_RESERVE};
use crate::leader::Elector;
use crate::membership::{self, Restored};
use crate::metrics::Metrics;
use crate::producer::{self, Producer};
use crate::registry::{Registry, Role};
use crate::stream::{Lifetime, Stream, Wiring};

/// How often the producer is checked for a fatal error.
const FATAL_POLL: Duration = Duration::from_secs(1);

#[derive(Debug, Error)]
pub enum RelayError {
    #[error("cannot create the Kafka producer: {0}")]
    Producer(#[source] rdkafka::error::KafkaError),
    #[error("loading checkpoints: {0}")]
    Checkpoint(#[from] CheckpointError),
}

/// Where records go: a new Kafka producer per leadership term, or one given producer.
enum Sink {
    Kafka,
    Given(Arc<dyn Producer>),
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
}

impl Relay {
    pub fn new(cfg: Config, client: kube::Client) -> Self {
        let stall_bound = Duration::from_secs(u64::from(cfg.kubernetes.watch_idle_timeout_seconds));
        let metrics = Arc::new(Metrics::new());
        metrics
            .in_flight_limit
            .set(i64::try_from(cfg.kafka.max_in_flight_per_stream).unwrap_or(i64::MAX));
        Self {
            cfg: Arc::new(cfg),
            client,
            sink: Sink::Kafka,
            metrics,
            registry: Registry::with_stall_bound(stall_bound),
            shutdown: CancellationToken::new(),
            checkpoints: true,
        }
    }

    /// A trial run: envelopes go to standard output as JSON lines, every stream starts with a
    /// list (no checkpoint is read or written), no Lease is taken.
    pub fn dry_run(mut self) -> Self {
        self.sink = Sink::Given(Arc::new(producer::Stdout));
        self.checkpoints = false;
        self
    }

    /// Sends records to `producer` instead of Kafka.
    pub fn with_producer(mut self, producer: Arc<dyn Producer>) -> Self {
        self.sink = Sink::Given(producer);
        self
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

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
    pub async fn run(self) -> Result<(), RelayError> {
        if !self.cfg.leader_election.enabled || !self.checkpoints {
            self.metrics.leader.set(1);
            return self
                .term(self.shutdown.clone(), CancellationToken::new())
                .await;
        }
        let le = &self.cfg.leader_election;
        let namespace = le
            .namespace
            .as_ref()
            .unwrap_or(&self.cfg.checkpoint.namespace);
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

    /// One term of relaying, until `stop`; then drains and writes the final checkpoint.
    ///
    /// With `fenced` (the Lease was lost) the stop is a fence instead: streams stop reading and
    /// do not drain, the producer's unsent queue is purged so nothing queued can land after the
    /// new leader's records, and no checkpoint is written after the loss. What remains possible
    /// is a request already on the wire when the loss was noticed (at most
    /// `max.in.flight.requests.per.connection` batches per broker), landing within the
    /// producer's request timeout, and a checkpoint write already under way.
    async fn term(
        &self,
        stop: CancellationToken,
        fenced: CancellationToken,
    ) -> Result<(), RelayError> {
        let producer: Arc<dyn Producer> = match &self.sink {
            Sink::Kafka => {
                Arc::new(producer::Kafka::new(&self.cfg.kafka).map_err(RelayError::Producer)?)
            }
            Sink::Given(p) => p.clone(),
        };
        let store = Store::new(
            self.client.clone(),
            &self.cfg.checkpoint.namespace,
            &self.cfg.checkpoint.name,
        );
        let saved = if self.checkpoints {
            let saved = store.load().await?;
            tracing::info!(streams = saved.len(), "loaded checkpoints");
            saved
        } else {
            HashMap::new()
        };
        let membership_topic = self
            .checkpoints
            .then(|| self.cfg.checkpoint.membership.topic(&self.cfg.cluster_name));
        let members = match &membership_topic {
            Some(topic) => {
                let Some(restored) = self.restore(&producer, topic, &saved, &stop).await else {
                    return Ok(());
                };
                restored
            }
            None => Restored::default(),
        };
        let supervisor = Supervisor {
            wiring: Arc::new(Wiring {
                cfg: self.cfg.clone(),
                client: self.client.clone(),
                producer: producer.clone(),
                metrics: self.metrics.clone(),
                fenced: fenced.clone(),
                membership_topic,
                checkpoints: self.checkpoints,
            }),
            registry: self.registry.clone(),
            saved: Arc::new(Mutex::new(saved)),
            members: Arc::new(Mutex::new(members)),
            ends: Arc::default(),
            tasks: TaskTracker::new(),
        };
        let streams_cancel = CancellationToken::new();
        for channel in &self.cfg.channels {
            match &channel.scope {
                Scope::Cluster => {
                    supervisor.spawn(channel, None, &streams_cancel);
                    supervisor.retire_orphans(channel, &|_| false, &streams_cancel);
                }
                Scope::Namespaces(list) => {
                    for ns in list {
                        supervisor.spawn(channel, Some(ns.clone()), &streams_cancel);
                    }
                    supervisor.retire_orphans(channel, &|_| false, &streams_cancel);
                }
                Scope::Selector(sel) => {
                    let follower = supervisor.clone().follow_namespaces(
                        channel.clone(),
                        sel.clone(),
                        streams_cancel.child_token(),
                    );
                    supervisor.tasks.spawn(follower);
                }
            }
        }
        let writer_cancel = CancellationToken::new();
        let writer = self.checkpoints.then(|| {
            tokio::spawn(checkpoint::writer::run(
                store,
                self.registry.clone(),
                self.metrics.clone(),
                Duration::from_millis(self.cfg.checkpoint.interval_ms),
                writer_cancel.clone(),
                fenced.clone(),
            ))
        });

        // A producer that failed fatally delivers nothing more: the process must restart.
        let watchdog = {
            let (producer, registry, stop) =
                (producer.clone(), self.registry.clone(), stop.clone());
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(FATAL_POLL) => {}
                    }
                    if let Some(e) = producer.fatal() {
                        registry.fail(format!("the Kafka producer failed fatally: {e}"));
                        return;
                    }
                }
            })
        };

        stop.cancelled().await;
        watchdog.abort();
        if fenced.is_cancelled() {
            tracing::warn!("fenced: purging the producer's unsent queue");
            producer.purge();
        }
        // The shutdown budget: drain and flush by `drained`, the final write within its reserve.
        let drained = tokio::time::Instant::now() + self.cfg.drain_time();
        tracing::info!(
            budget_seconds = self.cfg.shutdown_timeout_seconds,
            "shutting down: draining streams"
        );
        streams_cancel.cancel();
        supervisor.tasks.close();
        supervisor.tasks.wait().await;
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
        Ok(())
    }
}

/// How long to wait before reading the membership topic again after a failure.
const RESTORE_RETRY: Duration = Duration::from_secs(5);

impl Relay {
    /// Creates the membership topic if it is missing and reads every stream's members from it;
    /// known-object sets an older version left in the checkpoint ConfigMap are adopted. Retries
    /// until it succeeds; `None` when stopped first.
    async fn restore(
        &self,
        producer: &Arc<dyn Producer>,
        topic: &str,
        saved: &HashMap<String, Saved>,
        stop: &CancellationToken,
    ) -> Option<Restored> {
        let membership = &self.cfg.checkpoint.membership;
        let (partitions, replication) = (
            membership.partitions.unwrap_or(1),
            membership.replication_factor,
        );
        'read: loop {
            let started = std::time::Instant::now();
            let (p, t) = (producer.clone(), topic.to_string());
            let read = tokio::task::spawn_blocking(move || {
                p.ensure_compacted(&t, partitions, replication)?;
                let mut restored = Restored::default();
                p.replay(&t, &mut |k, v| restored.apply(k, v))?;
                restored.finish();
                Ok::<_, String>(restored)
            });
            let result = tokio::select! {
                _ = stop.cancelled() => return None,
                r = read => r.map_err(|e| e.to_string()).and_then(|r| r),
            };
            let mut restored = match result {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(%topic, error = %e, "reading the membership topic failed; retrying");
                    tokio::select! {
                        _ = stop.cancelled() => return None,
                        _ = tokio::time::sleep(RESTORE_RETRY) => continue 'read,
                    }
                }
            };
            let seconds = started.elapsed().as_secs_f64();
            self.metrics.membership_restore_seconds.set(seconds);
            self.metrics
                .membership_restored
                .set(i64::try_from(restored.records).unwrap_or(i64::MAX));
            tracing::info!(%topic, records = restored.records, members = restored.members(), malformed = restored.malformed, seconds, "restored membership");
            let legacy: Vec<_> = saved
                .iter()
                .filter(|(id, s)| {
                    s.known.is_some() && !restored.streams().any(|r| r == id.as_str())
                })
                .collect();
            for (id, s) in legacy {
                let known = s.known.as_ref().expect("filtered on a set");
                match membership::adopt(producer.as_ref(), topic, id, known).await {
                    Ok(members) => {
                        tracing::info!(stream = %id, members = members.len(), "moved the known objects kept in the checkpoint ConfigMap to the membership topic");
                        restored.insert(id, members);
                    }
                    Err(e) => {
                        tracing::warn!(stream = %id, error = %e, "could not move known objects to the membership topic; retrying");
                        tokio::select! {
                            _ = stop.cancelled() => return None,
                            _ = tokio::time::sleep(RESTORE_RETRY) => continue 'read,
                        }
                    }
                }
            }
            return Some(restored);
        }
    }
}

/// Spawns streams and follows namespace selectors, within one term.
#[derive(Clone)]
struct Supervisor {
    wiring: Arc<Wiring>,
    registry: Registry,
    /// Checkpoints loaded at the start of the term, taken by the first stream of each id.
    saved: Arc<Mutex<HashMap<String, Saved>>>,
    /// Members read at the start of the term, taken by the first stream of each id; a stream
    /// that returns later keeps its members in its outbox until it leaves.
    members: Arc<Mutex<Restored>>,
    /// Cancelled when the latest stream of each id has ended.
    ends: Arc<Mutex<HashMap<String, CancellationToken>>>,
    tasks: TaskTracker,
}

/// A running stream, as its owner sees it.
struct Handle {
    stop: CancellationToken,
    /// Cancelled when the stream goes away for good: it deletes what it announced, and its
    /// checkpoint is deleted.
    leaving: CancellationToken,
}

impl Handle {
    fn retire(self) {
        self.leaving.cancel();
        self.stop.cancel();
    }
}

impl Supervisor {
    fn spawn(
        &self,
        channel: &Arc<Channel>,
        namespace: Option<String>,
        parent: &CancellationToken,
    ) -> Handle {
        let id = channel.stream_id(namespace.as_deref());
        let saved = self.saved.lock().expect("saved lock poisoned").remove(&id);
        let members = self
            .members
            .lock()
            .expect("members lock poisoned")
            .take(&id);
        let reporter = self.registry.register(&id);
        let stop = parent.child_token();
        let leaving = CancellationToken::new();
        let stream = Stream::new(
            channel.clone(),
            namespace,
            &self.wiring,
            reporter,
            saved,
            members,
            Lifetime {
                stop: stop.clone(),
                shutdown: parent.clone(),
                leaving: leaving.clone(),
            },
        );
        let left = leaving.clone();
        let registry = self.registry.clone();
        // A stream of the same id still leaving (its namespace left and came back) finishes
        // first: its inferred DELETEDs come before this one's ADDEDs on every key.
        let ended = CancellationToken::new();
        let previous = self
            .ends
            .lock()
            .expect("ends lock poisoned")
            .insert(id.clone(), ended.clone());
        tracing::info!(stream = %id, "starting stream");
        self.tasks.spawn(async move {
            if let Some(previous) = previous {
                previous.cancelled().await;
            }
            // A stream that panicked relays nothing more: the process must restart.
            match std::panic::AssertUnwindSafe(stream.run())
                .catch_unwind()
                .await
            {
                Ok(reporter) if left.is_cancelled() => {
                    reporter.retire();
                    tracing::info!(stream = %id, "stream retired");
                }
                Ok(_) => {}
                Err(_) => registry.fail(format!("stream {id} died")),
            }
            ended.cancel();
        });
        Handle { stop, leaving }
    }

    /// Retires the streams of `channel` that were left with members or a position but are not
    /// running (`running` says which are) once its scope is known: their namespace left the
    /// scope while the relay was down, or the configuration narrowed it. Each is started
    /// leaving, so it deletes what it announced and its entry goes.
    fn retire_orphans(
        &self,
        channel: &Arc<Channel>,
        running: &dyn Fn(&str) -> bool,
        parent: &CancellationToken,
    ) {
        let prefix = format!("{}.", channel.name);
        let mut orphans: Vec<String> = self
            .members
            .lock()
            .expect("members lock poisoned")
            .streams()
            .map(str::to_string)
            .collect();
        orphans.extend(
            self.saved
                .lock()
                .expect("saved lock poisoned")
                .keys()
                .cloned(),
        );
        orphans.sort();
        orphans.dedup();
        let started = self.registry.phases();
        for id in orphans {
            // A namespace is a DNS label: an id with a dot after the prefix is another
            // channel's whose name extends this one's.
            let Some(ns) = id.strip_prefix(&prefix).filter(|ns| !ns.contains('.')) else {
                continue;
            };
            if running(ns) || started.contains_key(&id) {
                continue;
            }
            let namespace = (ns != "_all").then(|| ns.to_string());
            tracing::info!(stream = %id, "stream no longer in scope since the last run; deleting what it announced");
            self.spawn(channel, namespace, parent).retire();
        }
    }

    /// Keeps one stream per namespace matching `selector`.
    async fn follow_namespaces(
        self,
        channel: Arc<Channel>,
        selector: String,
        cancel: CancellationToken,
    ) {
        let api: Api<Namespace> = Api::all(self.wiring.client.clone());
        let mut events = watcher::watcher(api, watcher::Config::default().labels(&selector))
            .default_backoff()
            .boxed();
        let mut running: HashMap<String, Handle> = HashMap::new();
        let mut listed: HashSet<String> = HashSet::new();
        loop {
            let ev = tokio::select! {
                _ = cancel.cancelled() => break,
                ev = events.next() => match ev {
                    Some(ev) => ev,
                    None => break,
                },
            };
            match ev {
                Ok(Event::Init) => listed.clear(),
                Ok(Event::InitApply(ns)) | Ok(Event::Apply(ns)) => {
                    let name = ns.metadata.name.unwrap_or_default();
                    listed.insert(name.clone());
                    if let std::collections::hash_map::Entry::Vacant(slot) = running.entry(name) {
                        let h = self.spawn(&channel, Some(slot.key().clone()), &cancel);
                        slot.insert(h);
                    }
                }
                Ok(Event::InitDone) => {
                    let gone: Vec<String> = running
                        .keys()
                        .filter(|n| !listed.contains(*n))
                        .cloned()
                        .collect();
                    for name in gone {
                        running.remove(&name).expect("present").retire();
                    }
                    self.retire_orphans(&channel, &|ns| running.contains_key(ns), &cancel);
                }
                Ok(Event::Delete(ns)) => {
                    let name = ns.metadata.name.unwrap_or_default();
                    listed.remove(&name);
                    if let Some(h) = running.remove(&name) {
                        h.retire();
                    }
                }
                Err(e) => {
                    tracing::warn!(channel = %channel.name, error = %e, "namespace watch failed; retrying")
                }
            }
        }
    }
}
