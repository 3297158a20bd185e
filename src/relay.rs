//! The supervisor: spawns one stream per (channel, namespace), follows namespace selectors,
//! writes checkpoints, and shuts everything down in order.
//!
//! Shutdown order: streams stop reading and wait for their outstanding deliveries, the producer
//! is flushed, and the checkpoint is written one last time, so a clean stop replays nothing.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use thiserror::Error;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::checkpoint::{self, CheckpointError, Saved, Store, StreamShared, Streams};
use crate::config::{Channel, Config, Scope};
use crate::leader::Elector;
use crate::metrics::Metrics;
use crate::sink::{Sink, SinkError};
use crate::stream::{stream_id, Settings, Stream};

#[derive(Debug, Error)]
pub enum RelayError {
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error("loading checkpoints: {0}")]
    Checkpoint(#[from] CheckpointError),
    #[error("configuration: {0}")]
    Config(#[from] crate::config::ConfigError),
}

/// Everything a stream needs, shared by the supervisor and the namespace followers.
#[derive(Clone)]
struct Spawner {
    settings: Arc<Settings>,
    client: kube::Client,
    sink: Sink,
    metrics: Arc<Metrics>,
    streams: Arc<Mutex<Streams>>,
    saved: Arc<Mutex<HashMap<String, Saved>>>,
    tasks: TaskTracker,
}

/// A running stream, as its owner sees it.
struct Handle {
    cancel: CancellationToken,
    /// Set before cancelling a stream that goes away for good: its checkpoint is deleted.
    retire: Arc<AtomicBool>,
}

impl Handle {
    fn retire(self) {
        self.retire.store(true, Ordering::Release);
        self.cancel.cancel();
    }
}

impl Spawner {
    fn spawn(
        &self,
        channel: &Arc<Channel>,
        namespace: Option<String>,
        parent: &CancellationToken,
    ) -> Handle {
        let id = stream_id(channel, namespace.as_deref());
        let saved = self.saved.lock().expect("saved lock poisoned").remove(&id);
        let shared = StreamShared::new(id.clone(), saved);
        self.streams
            .lock()
            .expect("streams lock poisoned")
            .live
            .insert(id.clone(), shared.clone());
        let cancel = parent.child_token();
        let retire = Arc::new(AtomicBool::new(false));
        let stream = Stream::new(
            channel.clone(),
            namespace,
            self.settings.clone(),
            self.client.clone(),
            self.sink.clone(),
            self.metrics.clone(),
            shared,
            cancel.clone(),
        );
        let streams = self.streams.clone();
        let retired = retire.clone();
        tracing::info!(stream = %id, "starting stream");
        self.tasks.spawn(async move {
            stream.run().await;
            if retired.load(Ordering::Acquire) {
                let mut s = streams.lock().expect("streams lock poisoned");
                s.live.remove(&id);
                s.removed.push(id.clone());
                tracing::info!(stream = %id, "stream retired");
            }
        });
        Handle { cancel, retire }
    }

    /// Keeps one stream per namespace matching `selector`.
    async fn follow_namespaces(
        self,
        channel: Arc<Channel>,
        selector: String,
        cancel: CancellationToken,
    ) {
        let api: Api<Namespace> = Api::all(self.client.clone());
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

/// Runs the relay until `shutdown`; with leader election on, only while this replica holds the
/// Lease. A replica that loses the Lease drains (its checkpoints still cover only what Kafka
/// acknowledged) and stands by again; a clean stop releases the Lease so a standby takes over at
/// once.
pub async fn run_elected(
    cfg: Config,
    client: kube::Client,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    streams: Arc<Mutex<Streams>>,
) -> Result<(), RelayError> {
    if !cfg.leader_election.enabled {
        metrics.leader.set(1);
        return run(cfg, client, metrics, shutdown, streams).await;
    }
    let le = &cfg.leader_election;
    let namespace = le.namespace.as_ref().unwrap_or(&cfg.checkpoint.namespace);
    let mut elector = Elector::new(client.clone(), namespace, le);
    tracing::info!(lease = %elector.name(), identity = %elector.identity(), "leader election on");
    loop {
        {
            let mut s = streams.lock().expect("streams lock poisoned");
            s.standby = true;
            // Streams of an earlier term are gone; their checkpoints were written when it ended.
            s.live.clear();
            s.removed.clear();
        }
        // A stop while standing by (or while draining after a loss) ends here; the release
        // covers an attempt that won the Lease just as the stop came.
        if shutdown.is_cancelled() || !elector.acquire(&shutdown).await {
            elector.release().await;
            return Ok(());
        }
        streams.lock().expect("streams lock poisoned").standby = false;
        metrics.leader.set(1);
        let stop = shutdown.child_token();
        let done = CancellationToken::new();
        let relay = async {
            let result = run(
                cfg.clone(),
                client.clone(),
                metrics.clone(),
                stop.clone(),
                streams.clone(),
            )
            .await;
            done.cancel();
            result
        };
        let keeper = async {
            let lost = elector.keep(&done).await;
            if lost.is_some() {
                metrics.leader.set(0);
                stop.cancel();
            }
            lost
        };
        let (result, lost) = tokio::join!(relay, keeper);
        metrics.leader.set(0);
        match (result, lost) {
            (result, None) => {
                elector.release().await;
                return result;
            }
            (Err(e), Some(_)) => return Err(e),
            (Ok(()), Some(why)) => {
                tracing::error!(lease = %elector.name(), %why, "lost the lease; stopped relaying and standing by");
            }
        }
    }
}

/// Runs the relay until `shutdown` is cancelled, then drains and writes the final checkpoint.
pub async fn run(
    cfg: Config,
    client: kube::Client,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    streams: Arc<Mutex<Streams>>,
) -> Result<(), RelayError> {
    let channels = cfg.channels()?;
    let sink = Sink::new(&cfg.kafka)?;
    let store = Store::new(
        client.clone(),
        &cfg.checkpoint.namespace,
        &cfg.checkpoint.name,
    );
    let saved = store.load().await?;
    tracing::info!(streams = saved.len(), "loaded checkpoints");
    let spawner = Spawner {
        settings: Arc::new(Settings::from_config(&cfg)),
        client,
        sink: sink.clone(),
        metrics: metrics.clone(),
        streams: streams.clone(),
        saved: Arc::new(Mutex::new(saved)),
        tasks: TaskTracker::new(),
    };
    let streams_cancel = CancellationToken::new();
    let mut handles = Vec::new();
    for channel in channels.into_iter().map(Arc::new) {
        match &channel.scope {
            Scope::Cluster => handles.push(spawner.spawn(&channel, None, &streams_cancel)),
            Scope::Namespaces(list) => {
                for ns in list {
                    handles.push(spawner.spawn(&channel, Some(ns.clone()), &streams_cancel));
                }
            }
            Scope::Selector(sel) => {
                let follower = spawner.clone().follow_namespaces(
                    channel.clone(),
                    sel.clone(),
                    streams_cancel.child_token(),
                );
                spawner.tasks.spawn(follower);
            }
        }
    }
    let writer_cancel = CancellationToken::new();
    let writer = tokio::spawn(write_checkpoints(
        store,
        streams.clone(),
        metrics.clone(),
        Duration::from_millis(cfg.checkpoint.interval_ms),
        writer_cancel.clone(),
    ));

    shutdown.cancelled().await;
    tracing::info!("shutting down: draining streams");
    streams_cancel.cancel();
    spawner.tasks.close();
    spawner.tasks.wait().await;
    drop(handles);
    let flush_timeout = Duration::from_secs(cfg.kafka.flush_timeout_seconds);
    let producer = sink.clone();
    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || producer.flush(flush_timeout)).await {
        tracing::warn!(error = %e, "producer flush incomplete");
    }
    writer_cancel.cancel();
    if let Err(e) = writer.await {
        tracing::error!(error = %e, "checkpoint writer panicked");
    }
    tracing::info!("stopped");
    Ok(())
}

/// Writes dirty checkpoints every `interval`, and once more after `cancel`.
async fn write_checkpoints(
    store: Store,
    streams: Arc<Mutex<Streams>>,
    metrics: Arc<Metrics>,
    interval: Duration,
    cancel: CancellationToken,
) {
    loop {
        let last = tokio::select! {
            _ = cancel.cancelled() => true,
            _ = tokio::time::sleep(interval) => false,
        };
        let updates = checkpoint::collect(&streams, false);
        if !updates.is_empty() {
            match store.write(&updates).await {
                Ok(dropped) => {
                    metrics.checkpoint_writes.with_label_values(&["ok"]).inc();
                    for id in &dropped {
                        metrics
                            .checkpoint_known_dropped
                            .with_label_values(&[id])
                            .inc();
                        tracing::warn!(stream = %id, "known-object set too large for the checkpoint ConfigMap; deletions during a future outage cannot be inferred for this stream");
                    }
                }
                Err(e) => {
                    metrics
                        .checkpoint_writes
                        .with_label_values(&["error"])
                        .inc();
                    tracing::warn!(error = %e, "checkpoint write failed; will retry");
                    // Retry these streams and removals next time.
                    let mut s = streams.lock().expect("streams lock poisoned");
                    for (k, v) in &updates {
                        match v {
                            Some(_) => {
                                if let Some(st) = s.live.get(k) {
                                    st.dirty.store(true, Ordering::Release);
                                }
                            }
                            None => s.removed.push(k.clone()),
                        }
                    }
                }
            }
        }
        if last {
            break;
        }
    }
}
