//! The test bed: a simulated API server, the broker, and the relay running in-process.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use watchrelay::checkpoint::{self, Saved};
use watchrelay::config::Config;
use watchrelay::membership::Log;
use watchrelay::metrics::Metrics;
use watchrelay::producer::Producer;
use watchrelay::registry::{Phase, Registry};
use watchrelay::testing::{Lane, Memory, MemoryGroup, Transactions};
use watchrelay::RelayError;
use watchrelay_sim::{JournalEntry, Sim, SimConfig};

use super::kafka::{self, Msg};

pub const CHECKPOINT_NS: &str = "watchrelay";
pub const CHECKPOINT_NAME: &str = "watchrelay-checkpoints";

pub struct Bed {
    pub sim: Sim,
    pub bootstrap: String,
    /// The membership topic of this bed's cluster: one per bed, as one per cluster.
    pub membership: String,
}

impl Bed {
    /// A simulator and the broker under test.
    pub async fn new(namespaces: &[&str]) -> Self {
        Self::with(SimConfig::default(), namespaces).await
    }

    pub async fn with(cfg: SimConfig, namespaces: &[&str]) -> Self {
        Self::start(cfg, namespaces, kafka::bootstrap()).await
    }

    /// A simulator alone, for a relay whose producer is in memory.
    pub async fn in_memory(cfg: SimConfig, namespaces: &[&str]) -> Self {
        Self::start(cfg, namespaces, "in-memory:9092".into()).await
    }

    /// [`Bed::in_memory`] whose simulator serves `sendInitialEvents` watches, or not.
    pub async fn in_memory_serving(watch_list: bool, namespaces: &[&str]) -> Self {
        let cfg = SimConfig {
            watch_list,
            ..SimConfig::default()
        };
        Self::in_memory(cfg, namespaces).await
    }

    async fn start(cfg: SimConfig, namespaces: &[&str], bootstrap: String) -> Self {
        super::logs();
        let sim = Sim::start(cfg).await.expect("simulator starts");
        for ns in namespaces.iter().chain(std::iter::once(&CHECKPOINT_NS)) {
            sim.create("namespaces", None, watchrelay_sim::objects::namespace(ns))
                .expect("namespace");
        }
        Self {
            sim,
            bootstrap,
            membership: kafka::unique("membership"),
        }
    }

    /// Sets (or removes) the label `relay=yes` the tests' namespace selectors match.
    pub fn label(&self, ns: &str, on: bool) {
        let value = if on {
            "yes".into()
        } else {
            serde_json::Value::Null
        };
        self.sim
            .merge_patch(
                "namespaces",
                None,
                ns,
                serde_json::json!({"metadata": {"labels": {"relay": value}}}),
            )
            .unwrap();
    }

    /// A client of the simulator for a relay configured with `k`, built as the binary builds
    /// its own.
    pub fn client(&self, k: &watchrelay::config::KubernetesConfig) -> kube::Client {
        watchrelay::kubeclient::at(self.sim.url().parse().expect("sim url"), k).expect("client")
    }

    /// A relay configuration for this bed; `channels` is the YAML list body and `kafka_extra`
    /// extra lines under `kafka:` (both indented by two spaces).
    pub fn config(&self, channels: &str, kafka_extra: &str) -> Config {
        self.config_with(channels, kafka_extra, "")
    }

    /// [`Bed::config`] with `top` (top-level sections, unindented) added.
    pub fn config_with(&self, channels: &str, kafka_extra: &str, top: &str) -> Config {
        let oversize = if kafka_extra.contains("oversize:") {
            ""
        } else {
            "  oversize: trim\n"
        };
        let yaml = format!(
            "clusterName: test\n\
             kafka:\n  bootstrapServers: {}\n{oversize}  properties:\n    linger.ms: \"2\"\n{kafka_extra}\
             shutdownTimeoutSeconds: 13\n\
             checkpoint:\n  namespace: {CHECKPOINT_NS}\n  intervalMs: 100\n  membership:\n    topic: {}\n\
             kubernetes:\n  backoffInitialMs: 20\n  backoffMaxMs: 300\n  listPageSize: 7\n  syncJitterMs: 20\n\
             http:\n  listen: \"\"\n\
             {top}channels:\n{channels}",
            self.bootstrap, self.membership
        );
        Config::parse(&yaml).unwrap_or_else(|e| panic!("test config invalid: {e}\n{yaml}"))
    }

    /// The checkpoint ConfigMap's entries as the relay wrote them.
    pub fn checkpoints(&self) -> HashMap<String, Saved> {
        let Some(cm) = self
            .sim
            .get("configmaps", Some(CHECKPOINT_NS), CHECKPOINT_NAME)
        else {
            return HashMap::new();
        };
        checkpoint::read(&serde_json::from_value(cm).expect("a ConfigMap"))
    }

    /// The members each stream has in the membership topic, read back through the broker.
    pub async fn members(&self) -> watchrelay::membership::Restored {
        let cfg = self.config("  - operationId: watchNodes\n", "");
        let topic = self.membership.clone();
        tokio::task::spawn_blocking(move || {
            let kafka = watchrelay::membership::log::Kafka::new(&cfg.kafka);
            let owner = watchrelay::membership::Owner::new(CHECKPOINT_NS, CHECKPOINT_NAME);
            let mut restored = watchrelay::membership::Restored::new(owner, None);
            kafka
                .replay(&topic, &mut |k, v| restored.apply(k, v), &|| false)
                .expect("the membership topic reads back");
            restored.finish();
            restored
        })
        .await
        .unwrap()
    }

    /// The checkpoint ConfigMap as the simulator stores it.
    pub fn checkpoint_configmap(&self) -> serde_json::Value {
        self.sim
            .get("configmaps", Some(CHECKPOINT_NS), CHECKPOINT_NAME)
            .expect("the checkpoint ConfigMap exists")
    }

    /// A shard's checkpoint ConfigMap as the simulator stores it, if there is one.
    pub fn shard_configmap(&self, shard: u32) -> Option<serde_json::Value> {
        self.sim.get(
            "configmaps",
            Some(CHECKPOINT_NS),
            &format!("{CHECKPOINT_NAME}-s{shard}"),
        )
    }

    /// The position of `stream` in its shard's checkpoint ConfigMap.
    pub fn shard_checkpoint_rv(&self, shard: u32, stream: &str) -> Option<u64> {
        let cm = self.shard_configmap(shard)?;
        checkpoint::read(&serde_json::from_value(cm).expect("a ConfigMap"))
            .get(stream)
            .and_then(|s| s.rv.as_ref())
            .map(|rv| rv.parse().unwrap())
    }

    /// The owner epoch stamped on a shard's checkpoint ConfigMap.
    pub fn shard_epoch(&self, shard: u32) -> Option<u64> {
        self.shard_configmap(shard)?["metadata"]["annotations"]["watchrelay.io/owner-epoch"]
            .as_str()?
            .parse()
            .ok()
    }

    pub fn checkpoint_rv(&self, stream: &str) -> Option<u64> {
        self.checkpoints()
            .get(stream)
            .and_then(|s| s.rv.as_ref())
            .map(|rv| rv.parse().unwrap())
    }

    /// Journal entries of one resource (and namespace, when given).
    pub fn journal(&self, resource: &str, namespace: Option<&str>) -> Vec<JournalEntry> {
        self.sim
            .journal()
            .into_iter()
            .filter(|e| {
                e.resource == resource
                    && (namespace.is_none() || e.namespace.as_deref() == namespace)
            })
            .collect()
    }

    /// Journal entries of one resource (and namespace, when given) after resourceVersion `rv`.
    pub fn journal_after(
        &self,
        resource: &str,
        namespace: Option<&str>,
        rv: u64,
    ) -> Vec<JournalEntry> {
        let mut changes = self.journal(resource, namespace);
        changes.retain(|e| e.rv > rv);
        changes
    }

    /// Reads `topic` until every journal entry has its envelope there.
    pub async fn read_covering(&self, topic: &str, expected: &[JournalEntry]) -> Vec<Msg> {
        let want: HashSet<String> = expected.iter().map(event_id).collect();
        let bootstrap = self.bootstrap.clone();
        let topic = topic.to_string();
        tokio::task::spawn_blocking(move || {
            kafka::read_until(&bootstrap, &topic, Duration::from_secs(60), |msgs| {
                let got: HashSet<&str> = msgs
                    .iter()
                    .filter_map(|m| m.value["watchrelay"]["id"].as_str())
                    .collect();
                want.iter().all(|w| got.contains(w.as_str()))
            })
        })
        .await
        .unwrap()
    }

    pub async fn read_until(
        &self,
        topic: &str,
        done: impl Fn(&[Msg]) -> bool + Send + 'static,
    ) -> Vec<Msg> {
        self.read_within(topic, Duration::from_secs(60), done).await
    }

    /// [`Bed::read_until`] with a hang guard of `guard`, for large topics.
    pub async fn read_within(
        &self,
        topic: &str,
        guard: Duration,
        done: impl Fn(&[Msg]) -> bool + Send + 'static,
    ) -> Vec<Msg> {
        self.read_shaped_within(topic, guard, kafka::whole, done)
            .await
    }

    /// [`Bed::read_within`], keeping of each record's object the metadata that identify it
    /// ([`kafka::metadata_only`]): for topics of hundreds of thousands of records.
    pub async fn read_metadata_within(
        &self,
        topic: &str,
        guard: Duration,
        done: impl Fn(&[Msg]) -> bool + Send + 'static,
    ) -> Vec<Msg> {
        self.read_shaped_within(topic, guard, kafka::metadata_only, done)
            .await
    }

    async fn read_shaped_within(
        &self,
        topic: &str,
        guard: Duration,
        shape: impl Fn(&[u8]) -> serde_json::Value + Send + 'static,
        done: impl Fn(&[Msg]) -> bool + Send + 'static,
    ) -> Vec<Msg> {
        let bootstrap = self.bootstrap.clone();
        let topic = topic.to_string();
        tokio::task::spawn_blocking(move || {
            kafka::read_shaped_until(&bootstrap, &topic, guard, shape, done)
        })
        .await
        .unwrap()
    }

    /// Waits until `stream`'s checkpoint reaches the simulator's current resourceVersion, i.e.
    /// everything that happened so far is acknowledged (bookmarks carry it past idle time).
    pub async fn wait_checkpoint_current(&self, stream: &str) {
        let now = self.sim.current_rv();
        self.wait_checkpoint(|c| {
            c.get(stream)
                .and_then(|s| s.rv.as_ref())
                .is_some_and(|rv| rv.parse::<u64>().unwrap() >= now)
        })
        .await;
    }

    /// Waits until `stream`'s checkpoint covers every change made so far to the pods of
    /// `namespace`.
    pub async fn wait_pods_covered(&self, stream: &str, namespace: &str) {
        let rv = self
            .journal("pods", Some(namespace))
            .last()
            .map(|e| e.rv)
            .expect("a pod changed");
        self.wait_checkpoint(|c| {
            c.get(stream)
                .and_then(|s| s.rv.as_ref())
                .is_some_and(|r| r.parse::<u64>().unwrap() >= rv)
        })
        .await;
    }

    /// Waits until `stream`'s checkpoint is past `rv`: the relay acknowledged a change made
    /// after `rv` was read (hang guard: 60 s).
    pub async fn wait_checkpoint_past(&self, stream: &str, rv: u64) {
        self.wait_checkpoint(|c| {
            c.get(stream)
                .and_then(|s| s.rv.as_ref())
                .is_some_and(|r| r.parse::<u64>().unwrap() > rv)
        })
        .await;
    }

    /// Waits until `n` more changes were made to the pods of `namespace` than `before` (a count
    /// of their journal entries), then until `stream`'s checkpoint covers them: churn under way
    /// that the relay keeps up with.
    pub async fn wait_pods_relayed(&self, stream: &str, namespace: &str, before: usize, n: usize) {
        let changes = || self.journal("pods", Some(namespace)).len();
        wait_for(
            &format!("{n} changes to the pods of {namespace}"),
            Duration::from_secs(60),
            || changes() >= before + n,
        )
        .await;
        self.wait_pods_covered(stream, namespace).await;
    }

    /// Waits until `cond` holds on the checkpoints (hang guard: 60 s).
    pub async fn wait_checkpoint(&self, cond: impl Fn(&HashMap<String, Saved>) -> bool) {
        eventually(
            || cond(&self.checkpoints()),
            || {
                format!(
                    "checkpoint condition never held: {:?}",
                    self.checkpoints().keys().collect::<Vec<_>>()
                )
            },
        )
        .await;
    }
}

/// Polls `cond` every 100 ms until it holds; after 60 s (a hang guard, not a timing assertion)
/// panics with `failure()`.
pub async fn eventually(mut cond: impl FnMut() -> bool, failure: impl FnOnce() -> String) {
    for _ in 0..600 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{}", failure());
}

/// Polls `cond` every 100 ms until it holds; after `timeout` (a hang guard, not a timing
/// assertion) panics saying what never happened.
pub async fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond() {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("waited {timeout:?} for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The envelope id the relay gives a journal entry's change.
pub fn event_id(e: &JournalEntry) -> String {
    format!("{}/{}", e.uid, e.rv)
}

/// Asserts no record was published twice (by its `watchrelay.id`): what a `read_committed`
/// reader of a relay with exactly-once delivery may rely on.
pub fn assert_once(msgs: &[Msg]) {
    let mut count: HashMap<&str, usize> = HashMap::new();
    for m in msgs {
        let id = m.value["watchrelay"]["id"].as_str().unwrap_or_default();
        *count.entry(id).or_default() += 1;
    }
    let repeated: Vec<_> = count.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "{} of {} records published more than once, e.g. {:?}",
        repeated.len(),
        msgs.len(),
        &repeated[..repeated.len().min(5)]
    );
}

/// Asserts every journal entry is in `msgs` with the right type, key and envelope, each
/// object's changes first in the order the server made them.
pub fn assert_covers(msgs: &[Msg], expected: &[JournalEntry]) {
    let by_id: HashMap<&str, &Msg> = msgs
        .iter()
        .filter_map(|m| Some((m.value["watchrelay"]["id"].as_str()?, m)))
        .collect();
    let mut missing = Vec::new();
    for e in expected {
        match by_id.get(event_id(e).as_str()) {
            None => missing.push(format!(
                "{} {} {:?}/{} rv={}",
                e.event_type, e.kind, e.namespace, e.name, e.rv
            )),
            Some(m) => {
                assert_eq!(
                    m.value["type"],
                    e.event_type.as_str(),
                    "type of {}",
                    event_id(e)
                );
                let key = match &e.namespace {
                    Some(ns) => format!("{ns}/{}", e.name),
                    None => e.name.clone(),
                };
                assert_eq!(
                    m.key.as_deref(),
                    Some(key.as_str()),
                    "key of {}",
                    event_id(e)
                );
                assert_eq!(m.value["object"]["metadata"]["uid"], e.uid.as_str());
                assert_eq!(m.value["object"]["kind"], e.kind.as_str());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} changes missing from Kafka, e.g. {:?}",
        missing.len(),
        expected.len(),
        &missing[..missing.len().min(5)]
    );
    let ids = msgs.iter().filter_map(|m| {
        let id = m.value["watchrelay"]["id"].as_str()?;
        Some((id.to_string(), (m.partition, m.offset)))
    });
    let late = super::view::out_of_order(ids, expected);
    assert!(
        late.is_empty(),
        "{} changes first published after a later change of their object, e.g. {:?}",
        late.len(),
        &late[..late.len().min(5)]
    );
}

/// The relay, running in this process on a runtime of its own so that a crash can be simulated
/// by dropping every one of its tasks at once.
pub struct Relay {
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), RelayError>>,
    runtime: Option<tokio::runtime::Runtime>,
    pub metrics: Arc<Metrics>,
    pub registry: Registry,
}

/// `cfg` with sharding on over `shards` shards, the shards' membership topic beside the bed's
/// membership topic (which consumers do not read).
pub fn sharded(mut cfg: Config, shards: u32) -> Config {
    cfg.sharding = watchrelay::config::ShardingConfig {
        enabled: true,
        shards,
        topic: Some(format!(
            "{}.shards",
            cfg.checkpoint.membership.topic("test")
        )),
        ..watchrelay::config::ShardingConfig::default()
    };
    cfg
}

/// The shard of `key` among `shards`.
pub fn shard_of(shards: u32, key: &str) -> u32 {
    watchrelay::config::ShardingConfig {
        enabled: true,
        shards,
        ..watchrelay::config::ShardingConfig::default()
    }
    .shard_of(key)
}

/// `memory` as a relay's producer and membership log.
fn sink(memory: Arc<Memory>) -> (Arc<dyn Producer>, Arc<dyn Log>) {
    (memory.clone(), memory)
}

impl Relay {
    pub fn start(bed: &Bed, cfg: Config) -> Self {
        Self::start_with(bed, cfg, None)
    }

    /// Starts the relay reaching the API server at `url` (a proxy the test controls).
    pub fn start_at(bed: &Bed, cfg: Config, url: &str) -> Self {
        Self::start_on(bed, cfg, None, Some(url), None, None)
    }

    /// Starts the relay; with `producer`, its records go there instead of Kafka.
    pub fn start_with(bed: &Bed, cfg: Config, producer: Option<Arc<Memory>>) -> Self {
        Self::start_on(bed, cfg, producer.map(sink), None, None, None)
    }

    /// [`Relay::start_with`] over `producer`, with `txns` for the transactions of
    /// `delivery: exactlyOnce`.
    pub fn start_with_txns(
        bed: &Bed,
        cfg: Config,
        producer: Arc<Memory>,
        txns: Option<&Arc<Transactions>>,
    ) -> Self {
        Self::start_on(bed, cfg, Some(sink(producer)), None, None, txns)
    }

    /// `watchrelay split-whole` of `cfg`'s release, over `lane`, `group` and `txns` (with
    /// `delivery: exactlyOnce`) as its replicas run on them; `None`: on Kafka and its group
    /// coordinator.
    pub async fn split_whole(
        bed: &Bed,
        cfg: Config,
        on: Option<(Arc<Lane>, &MemoryGroup)>,
        txns: Option<&Arc<Transactions>>,
    ) -> Result<Vec<watchrelay::relay::Split>, RelayError> {
        let url: http::Uri = bed.sim.url().parse().expect("a url");
        let client = watchrelay::kubeclient::at(url, &cfg.kubernetes).expect("client");
        let mut relay = watchrelay::Relay::new(cfg, client);
        if let Some((lane, group)) = on {
            relay = relay
                .with_producer(lane.clone(), lane)
                .with_coordinator(Arc::new(group.clone()));
        }
        if let Some(txns) = txns {
            relay = relay.with_transactions(txns.source());
        }
        relay.split_whole().await
    }

    /// Starts a replica of a sharded release whose records go to `producer` and which meets
    /// the other replicas in `group`.
    pub fn start_in(bed: &Bed, cfg: Config, producer: Arc<Memory>, group: &MemoryGroup) -> Self {
        Self::start_on(bed, cfg, Some(sink(producer)), None, Some(group), None)
    }

    /// [`Relay::start_in`] with a producer of its own, `lane`, over the shared memory.
    pub fn start_on_lane(bed: &Bed, cfg: Config, lane: Arc<Lane>, group: &MemoryGroup) -> Self {
        Self::start_on(
            bed,
            cfg,
            Some((lane.clone(), lane)),
            None,
            Some(group),
            None,
        )
    }

    /// [`Relay::start_on_lane`], with `txns` for the transactions of `delivery: exactlyOnce`.
    pub fn start_on_lane_with(
        bed: &Bed,
        cfg: Config,
        lane: Arc<Lane>,
        group: &MemoryGroup,
        txns: Option<&Arc<Transactions>>,
    ) -> Self {
        let sink = Some((lane.clone() as Arc<dyn Producer>, lane as Arc<dyn Log>));
        Self::start_on(bed, cfg, sink, None, Some(group), txns)
    }

    fn start_on(
        bed: &Bed,
        cfg: Config,
        producer: Option<(Arc<dyn Producer>, Arc<dyn Log>)>,
        url: Option<&str>,
        group: Option<&MemoryGroup>,
        txns: Option<&Arc<Transactions>>,
    ) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        // Entered so the client's background tasks belong to the relay's runtime.
        let guard = runtime.enter();
        let url: http::Uri = url
            .map_or_else(|| bed.sim.url(), str::to_string)
            .parse()
            .expect("a url");
        let client = watchrelay::kubeclient::at(url.clone(), &cfg.kubernetes).expect("client");
        let probe = watchrelay::kubeclient::Target::At(url, cfg.kubernetes.clone());
        let mut relay = watchrelay::Relay::new(cfg, client).with_probe(probe);
        if let Some((p, log)) = producer {
            relay = relay.with_producer(p, log);
        }
        if let Some(txns) = txns {
            relay = relay.with_transactions(txns.source());
        }
        if let Some(g) = group {
            relay = relay.with_coordinator(Arc::new(g.clone()));
        }
        let (shutdown, metrics, registry) = (relay.shutdown(), relay.metrics(), relay.registry());
        let task = runtime.spawn(relay.run());
        drop(guard);
        Self {
            shutdown,
            task,
            runtime: Some(runtime),
            metrics,
            registry,
        }
    }

    /// Whether the relay has ended by itself.
    pub fn ended(&self) -> bool {
        self.task.is_finished()
    }

    /// How a relay that ended by itself ended: its error, if any.
    pub async fn outcome(mut self) -> Result<(), String> {
        let task = &mut self.task;
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("relay ended")
            .unwrap()
            .map_err(|e| e.to_string())
    }

    /// Graceful stop: drain, flush, final checkpoint.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        let task = &mut self.task;
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("relay stops")
            .unwrap()
            .expect("relay ran cleanly");
    }

    /// A crash: every task of the relay is dropped where it stands; nothing is drained or written.
    pub async fn kill(mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }

    pub fn counter(&self, name: &str, stream: &str) -> u64 {
        let text = String::from_utf8(self.metrics.render()).unwrap();
        text.lines()
            .filter(|l| {
                l.starts_with(&format!("watchrelay_{name}"))
                    && l.contains(&format!("stream=\"{stream}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// Waits until a counter of `stream` (summed over its other labels) reaches `min` (hang
    /// guard: 60 s). Tests use it to let one injected fault play out before arming the next.
    pub async fn wait_counter(&self, name: &str, stream: &str, min: u64) {
        eventually(
            || self.counter(name, stream) >= min,
            || {
                format!(
                    "{name} of {stream} stayed at {}, below {min}",
                    self.counter(name, stream)
                )
            },
        )
        .await;
    }

    /// Waits until `n` streams exist and every one is watching (hang guard: 60 s); panics at
    /// once if the relay ended instead.
    pub async fn wait_up(&self, n: usize) {
        eventually(
            || {
                assert!(
                    !self.task.is_finished(),
                    "the relay ended before its streams were up"
                );
                let phases = self.registry.phases();
                phases.len() >= n && phases.values().all(|p| *p == Phase::Watching)
            },
            || {
                let phases = self.registry.phases();
                let down: Vec<_> = phases
                    .iter()
                    .filter(|(_, p)| **p != Phase::Watching)
                    .collect();
                format!(
                    "streams never all up: {} live, down: {down:?}, blocked: {:?}",
                    phases.len(),
                    self.registry.readiness().blocked
                )
            },
        )
        .await;
    }

    pub fn stream_up(&self, stream: &str) -> bool {
        self.registry.phases().get(stream) == Some(&Phase::Watching)
    }

    /// Waits until `/readyz` reports a problem of `stream` that says `text`.
    pub async fn wait_problem(&self, stream: &str, text: &str) {
        eventually(
            || {
                self.registry
                    .readiness()
                    .problems
                    .get(stream)
                    .is_some_and(|p| p.contains(text))
            },
            || {
                format!(
                    "no problem of {stream} says {text:?}: {:?}",
                    self.registry.readiness()
                )
            },
        )
        .await;
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}
