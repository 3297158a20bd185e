//! Scale-out: replicas share the shards through Kafka's consumer group. Replicas join, leave
//! cleanly, crash, are killed, frozen, cut from the API server, restarted in turn, scaled down to
//! one, moved from a single leader, and the broker restarts, all under churn; every shard keeps
//! one owner at a time, and the consumer's view of every key ends equal to the cluster.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::bed::{assert_covers, assert_once, eventually, Bed, Relay, CHECKPOINT_NS};
use common::broker::{Options, OwnBroker};
use common::cluster::RelayProcess;
use common::kafka::{self, Msg};
use common::proxy::{Proxy, Wire};
use common::view::{kafka_view, pods};
use watchrelay::config::{Config, Delivery, GroupProtocol, ShardingConfig};
use watchrelay::group::{Coordinator, GroupError};
use watchrelay::RelayError;
use watchrelay_sim::{objects, ChurnHandle, ChurnSpec, Fault, SimConfig};

const SHARDS: u32 = 8;

fn owned(replicas: &[&Relay]) -> Vec<i64> {
    replicas
        .iter()
        .map(|r| r.metrics.shards_owned.get())
        .collect()
}

/// Waits until `replicas` own every shard between them, each at least one.
async fn wait_spread(replicas: &[&Relay]) {
    eventually(
        || {
            let o = owned(replicas);
            o.iter().sum::<i64>() == i64::from(SHARDS) && o.iter().all(|&n| n > 0)
        },
        || format!("the shards were never spread: {:?}", owned(replicas)),
    )
    .await;
}

/// How long until `replicas` own every shard between them again.
async fn takeover(replicas: &[&Relay]) -> Duration {
    let start = Instant::now();
    wait_spread(replicas).await;
    start.elapsed()
}

fn sharded(cfg: &Config, protocol: GroupProtocol) -> Config {
    let mut cfg = cfg.clone();
    cfg.checkpoint.name = kafka::unique("relay");
    cfg.sharding = ShardingConfig {
        enabled: true,
        shards: SHARDS,
        topic: Some(kafka::unique("shards")),
        session_timeout_ms: 6000,
        ownership_deadline_ms: 3000,
        group_protocol: protocol,
        ..ShardingConfig::default()
    };
    cfg
}

/// Pods in namespaces `team-0`… relayed into a topic of the test's own, on `bed`'s broker.
struct Scene {
    bed: Bed,
    namespaces: Vec<String>,
    topic: String,
}

impl Scene {
    /// `n` namespaces, on the suite's broker or on `bootstrap`.
    async fn new(n: usize, prefix: &str, bootstrap: Option<&str>) -> Self {
        Self::served(n, prefix, bootstrap, SimConfig::default()).await
    }

    /// The same, the API server as `sim` says.
    async fn served(n: usize, prefix: &str, bootstrap: Option<&str>, sim: SimConfig) -> Self {
        let scene = Self::on(n, kafka::unique(prefix), bootstrap, sim).await;
        kafka::create_topics_at(&scene.bed.bootstrap, &[&scene.topic], 3).await;
        scene
    }

    /// `n` namespaces relayed into `topic`, made already, on `bootstrap`.
    async fn with_topic(n: usize, topic: String, bootstrap: &str) -> Self {
        Self::on(n, topic, Some(bootstrap), SimConfig::default()).await
    }

    async fn on(n: usize, topic: String, bootstrap: Option<&str>, sim: SimConfig) -> Self {
        let namespaces: Vec<String> = (0..n).map(|i| format!("team-{i}")).collect();
        let names: Vec<&str> = namespaces.iter().map(String::as_str).collect();
        let mut bed = Bed::with(sim, &names).await;
        if let Some(b) = bootstrap {
            bed.bootstrap = b.to_string();
        }
        Self {
            bed,
            namespaces,
            topic,
        }
    }

    fn names(&self) -> Vec<&str> {
        self.namespaces.iter().map(String::as_str).collect()
    }

    /// The channel of pods over `scope` (`None`: the namespaces, listed).
    fn channel(&self, scope: Option<&str>) -> String {
        let listed = format!("namespaces: [{}]", self.namespaces.join(", "));
        format!(
            "  - operationId: watchNamespacedPods\n    {}\n    topic: {}\n",
            scope.unwrap_or(&listed),
            self.topic
        )
    }

    /// A sharded release of every namespace, read once per replica and fanned out to the
    /// shards, with `kafka` (YAML lines) added to its Kafka settings.
    fn fanned(&self, kafka: &str, protocol: GroupProtocol) -> Config {
        let scope = "allNamespaces: true\n    watchStrategy: clusterWide";
        sharded(
            &self.bed.config(&self.channel(Some(scope)), kafka),
            protocol,
        )
    }

    /// A sharded release of the listed namespaces.
    fn sharded(&self, protocol: GroupProtocol) -> Config {
        sharded(&self.bed.config(&self.channel(None), ""), protocol)
    }

    /// Changes to the pods, `rate` a second.
    fn churn(&self, rate: f64) -> ChurnHandle {
        self.bed.sim.start_churn(ChurnSpec {
            rate_per_sec: rate,
            namespaces: self.namespaces.clone(),
            resources: vec!["pods".into()],
            max_objects_per_kind: 8,
            total_events: None,
        })
    }

    /// Reads the topic until `view` of it is the cluster's pods (hang guard: 90 s), asserts so,
    /// and returns what was read.
    async fn converged(&self, view: fn(&[Msg]) -> BTreeMap<String, String>) -> Vec<Msg> {
        let expected = pods(&self.bed.sim, &self.names(), |_| true);
        let (bootstrap, topic) = (self.bed.bootstrap.clone(), self.topic.clone());
        let msgs: Vec<Msg> = tokio::task::spawn_blocking(move || {
            kafka::read_until(&bootstrap, &topic, Duration::from_secs(90), |m| {
                view(m) == expected
            })
        })
        .await
        .unwrap();
        let expected = pods(&self.bed.sim, &self.names(), |_| true);
        assert_eq!(
            view(&msgs),
            expected,
            "the consumer's view differs from the cluster"
        );
        msgs
    }

    /// How many records each change took, for the log.
    fn per_change(&self, msgs: &[Msg]) -> String {
        let changes = self.bed.journal("pods", None).len();
        format!(
            "records {} for {changes} changes ({:.2} per change)",
            msgs.len(),
            msgs.len() as f64 / changes.max(1) as f64
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_shards_over_the_classic_protocol() {
    replicas_share_the_shards_and_handovers_lose_nothing(GroupProtocol::Classic, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_shards_over_the_consumer_protocol() {
    replicas_share_the_shards_and_handovers_lose_nothing(GroupProtocol::Consumer, false).await;
}

/// The same, the pods read cluster-wide once per replica and fanned out to the shards: each
/// moved shard's part resumes through its new owner's shared watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_a_fanned_out_collection_and_handovers_lose_nothing() {
    replicas_share_the_shards_and_handovers_lose_nothing(GroupProtocol::Classic, true).await;
}

/// Scale 1 -> 3, a clean stop, a crash, a join, a rolling restart and a scale down to one,
/// under churn. Every key's last record is the cluster's, and its history is whole: every
/// change the API server made once the first replica's streams ran has its record (a shard
/// that moves resumes where its owner stopped; nothing here excuses a list).
async fn replicas_share_the_shards_and_handovers_lose_nothing(
    protocol: GroupProtocol,
    fanned: bool,
) {
    let scene = Scene::new(12, "sharded", None).await;
    let (bed, names) = (&scene.bed, scene.names());
    let mut cfg = scene.sharded(protocol);
    if fanned {
        cfg = scene.fanned("", protocol);
    }

    let a = Relay::start(bed, cfg.clone());
    wait_spread(&[&a]).await;
    a.wait_up(if fanned { SHARDS as usize } else { names.len() })
        .await;
    let from = bed.sim.current_rv();
    let churn = scene.churn(150.0);

    // Scale 1 -> 3: the shards spread, each moving one handed over.
    let b = Relay::start(bed, cfg.clone());
    let c = Relay::start(bed, cfg.clone());
    let scale_up = takeover(&[&a, &b, &c]).await;

    // A clean stop hands its shards over.
    b.stop().await;
    let clean = takeover(&[&a, &c]).await;

    // Every task of a replica dropped where it stands: nothing drained, no final position
    // written. Its group threads then leave at once, so the takeover does not wait out the
    // session as a killed process's would.
    c.kill().await;
    let crash = takeover(&[&a]).await;

    // And one joins again.
    let d = Relay::start(bed, cfg.clone());
    let rejoin = takeover(&[&a, &d]).await;

    // A rolling restart: each replica in turn replaced by a new one, which joins first.
    let e = Relay::start(bed, cfg.clone());
    wait_spread(&[&a, &d, &e]).await;
    a.stop().await;
    let f = Relay::start(bed, cfg.clone());
    wait_spread(&[&d, &e, &f]).await;
    d.stop().await;
    let rolled = takeover(&[&e, &f]).await;

    // Scale down to one.
    f.stop().await;
    let down = takeover(&[&e]).await;
    churn.stop().await;
    eprintln!("{protocol:?} takeovers: scale 1->3 {scale_up:?}, clean stop {clean:?}, crash {crash:?}, join {rejoin:?}, rolling restart {rolled:?}, scale to 1 {down:?}");

    // Every key's last record is the cluster's, and every change has its record.
    let msgs = scene.converged(kafka_view).await;
    assert_covers(&msgs, &bed.journal_after("pods", None, from));

    // Every record names its shard and owner epoch, and its shard is its namespace's.
    for m in &msgs {
        let ns = m.value["object"]["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default();
        let shard: u32 = m.headers["ce_shard"].parse().unwrap();
        assert_eq!(
            shard,
            cfg.sharding.shard_of(ns),
            "record of {ns} in the wrong shard"
        );
        let epoch: u64 = m.headers["ce_ownerepoch"].parse().unwrap();
        assert!(epoch >= 1);
        // The envelope says the same.
        assert_eq!(m.value["watchrelay"]["shard"], shard);
        assert_eq!(m.value["watchrelay"]["ownerEpoch"], epoch);
    }
    // Per key, owner epochs never go down in partition order.
    let mut epochs: BTreeMap<(i32, String), u64> = BTreeMap::new();
    let mut sorted: Vec<&Msg> = msgs.iter().collect();
    sorted.sort_by_key(|m| (m.partition, m.offset));
    let mut late = 0;
    for m in sorted {
        let Some(key) = &m.key else { continue };
        let epoch: u64 = m.headers["ce_ownerepoch"].parse().unwrap();
        let last = epochs.entry((m.partition, key.clone())).or_insert(0);
        if epoch < *last {
            late += 1;
        }
        *last = (*last).max(epoch);
    }
    eprintln!(
        "{}; records behind a newer epoch on their key: {late}",
        scene.per_change(&msgs)
    );
    assert_eq!(
        late, 0,
        "a deposed owner's record landed after its successor's"
    );

    // The group's coordinator refuses a claim from outside the group while a replica is in it
    // (what `watchrelay split-whole` stands on), whichever protocol the replicas speak, and
    // takes it once the group is empty.
    let claim = |cfg: &Config| {
        let cfg = cfg.clone();
        tokio::task::spawn_blocking(move || watchrelay::group::Kafka.claim_idle(&cfg))
    };
    let busy = claim(&cfg).await.unwrap();
    assert!(matches!(busy, Err(GroupError::Busy(_))), "{busy:?}");
    e.stop().await;
    let mut idle = claim(&cfg).await.unwrap();
    for _ in 0..20 {
        if idle.is_ok() {
            break;
        }
        // The group may take a moment to empty once its last member left.
        tokio::time::sleep(Duration::from_secs(1)).await;
        idle = claim(&cfg).await.unwrap();
    }
    let claimed = idle.expect("a claim of the empty group");
    assert_eq!(claimed.len(), SHARDS as usize);
}

/// Scale 3 -> 5 -> 2 under churn, over a fanned-out collection: two replicas join, then
/// three leave (one killed, two stopped). Every change after the first replicas' streams had
/// their positions has its record, each key's in order, and no deposed owner's record lands
/// after its successor's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_three_to_five_to_two_loses_no_change() {
    scale_three_to_five_to_two("").await;
}

/// The same with `delivery: exactlyOnce`: a `read_committed` consumer reads every change once.
/// Each shard's producer is fenced by its next owner's, what the killed replica left open is
/// aborted, and each moved shard resumes from the position committed with its records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_through_scale_three_to_five_to_two_publishes_every_change_once() {
    let msgs = scale_three_to_five_to_two("  delivery: exactlyOnce\n").await;
    assert_once(&msgs);
}

/// With `delivery: exactlyOnce`, a stream kept whole from before fan-out split on Kafka: two
/// replicas relay it whole under churn; the one relaying it is killed (its transaction left
/// open, its ConfigMap behind the positions committed in Kafka) and the other stopped; the
/// split is refused until the group is empty, then fences every shard's transactional id and
/// hands the parts the committed position; two replicas relay the parts. A `read_committed`
/// consumer reads every change once, in order, and nothing is retracted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_a_split_of_a_stream_kept_whole_publishes_every_change_once() {
    let scene = Scene::new(8, "split-eos", None).await;
    let bed = &scene.bed;
    let cfg = scene.fanned("  delivery: exactlyOnce\n", GroupProtocol::Classic);
    // As a release before fan-out left it: the stream recorded whole in its channel's shard.
    let whole = "watchNamespacedPods._all";
    let home = cfg.sharding.shard_of_stream(whole);
    let name = ShardingConfig::configmap(&cfg.checkpoint.name, home);
    let recorded = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": CHECKPOINT_NS},
        "data": {whole: "{\"rv\":null}"},
    });
    bed.sim
        .create("configmaps", Some(CHECKPOINT_NS), recorded)
        .unwrap();
    let a = Relay::start(bed, cfg.clone());
    let b = Relay::start(bed, cfg.clone());
    wait_spread(&[&a, &b]).await;
    let from = positioned_at(bed, &cfg.checkpoint.name, 1).await;
    let churn = scene.churn(300.0);
    // Not a wait: churn runs a while through the whole stream.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (relaying, other) = if a.registry.phases().contains_key(whole) {
        (a, b)
    } else {
        (b, a)
    };
    relaying.kill().await;
    other.stop().await;
    // The group empties once the killed replica's threads left it.
    let mut split = Relay::split_whole(bed, cfg.clone(), None, None).await;
    for _ in 0..20 {
        if !matches!(&split, Err(RelayError::Refused(why)) if why.contains("are running")) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        split = Relay::split_whole(bed, cfg.clone(), None, None).await;
    }
    let split = split.expect("the split");
    assert_eq!(split.len(), 1, "{split:?}");
    let c = Relay::start(bed, cfg.clone());
    let d = Relay::start(bed, cfg.clone());
    wait_spread(&[&c, &d]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    churn.stop().await;
    let msgs = scene.converged(kafka_view).await;
    assert_covers(&msgs, &bed.journal_after("pods", None, from));
    assert_once(&msgs);
    let retracted = msgs
        .iter()
        .filter(|m| m.value["watchrelay"]["synthetic"] == true)
        .count();
    assert_eq!(retracted, 0, "objects were retracted");
    assert!(
        c.metrics.fanout_watches.get() + d.metrics.fanout_watches.get() > 0,
        "the parts were not fanned out"
    );
    eprintln!("{}", scene.per_change(&msgs));
    c.stop().await;
    d.stop().await;
}

/// With `delivery: exactlyOnce`, two sharded replicas reading a fanned-out collection, one of
/// them killed at arbitrary instants and started again, three times, under churn: a
/// `read_committed` consumer reads every change once, in order. At least once, the same run
/// repeats the changes each killed replica had not yet checkpointed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_sharded_kills_during_churn_publish_every_change_once() {
    let scene = Scene::new(8, "sharded-eos", None).await;
    let bed = &scene.bed;
    let cfg = scene.fanned("  delivery: exactlyOnce\n", GroupProtocol::Classic);
    let steady = Relay::start(bed, cfg.clone());
    let mut killed = Relay::start(bed, cfg.clone());
    wait_spread(&[&steady, &killed]).await;
    for r in [&steady, &killed] {
        r.wait_up(r.metrics.shards_owned.get() as usize).await;
    }
    let from = bed.sim.current_rv();
    let churn = scene.churn(400.0);
    for round in 0..3u64 {
        // The kill instants are the test's, a different one each round.
        tokio::time::sleep(Duration::from_millis(900 + 370 * round)).await;
        killed.kill().await;
        killed = Relay::start(bed, cfg.clone());
    }
    wait_spread(&[&steady, &killed]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    churn.stop().await;
    let msgs = scene.converged(kafka_view).await;
    assert_covers(&msgs, &bed.journal_after("pods", None, from));
    assert_once(&msgs);
    let commits = |r: &Relay| {
        r.metrics
            .transactions
            .with_label_values(&["committed"])
            .get()
    };
    assert!(
        commits(&steady) > 0 && commits(&killed) > 0,
        "each replica's shards committed transactions"
    );
    eprintln!("{}", scene.per_change(&msgs));
    steady.stop().await;
    killed.stop().await;
}

/// Three replicas, then five, then two (one killed, two stopped) under churn, with `kafka`
/// added to the Kafka settings: every change after the start is published, in order, and no
/// deposed owner's record lands after its successor's. Returns what was read.
async fn scale_three_to_five_to_two(kafka: &str) -> Vec<Msg> {
    let scene = Scene::new(12, "sharded-352", None).await;
    let bed = &scene.bed;
    let cfg = scene.fanned(kafka, GroupProtocol::Classic);
    let mut live: Vec<Relay> = (0..3).map(|_| Relay::start(bed, cfg.clone())).collect();
    wait_spread(&live.iter().collect::<Vec<_>>()).await;
    for r in &live {
        r.wait_up(r.metrics.shards_owned.get() as usize).await;
    }
    let from = bed.sim.current_rv();
    let churn = scene.churn(150.0);
    live.extend((0..2).map(|_| Relay::start(bed, cfg.clone())));
    let up = takeover(&live.iter().collect::<Vec<_>>()).await;
    live.remove(0).kill().await;
    live.remove(0).stop().await;
    live.remove(0).stop().await;
    let down = takeover(&live.iter().collect::<Vec<_>>()).await;
    churn.stop().await;
    let msgs = scene.converged(|m| epoch_view(m).0).await;
    assert_covers(&msgs, &bed.journal_after("pods", None, from));
    let late = epoch_view(&msgs).1;
    eprintln!(
        "3 -> 5 in {up:?}, 5 -> 2 in {down:?}; {}; late records of a deposed owner: {late}",
        scene.per_change(&msgs)
    );
    assert_eq!(
        late, 0,
        "a deposed owner's record landed after its successor's"
    );
    for r in live {
        r.stop().await;
    }
    msgs
}

/// History through a gap: two replicas read a fanned-out collection under churn; their shared
/// watches cannot reopen while pods change and the server drops its history (a 410), and the
/// first list after it is cut midway (a later page fails). Only the changes the server no
/// longer held when the replicas came back are collapsed into lists: every change before the
/// gap and after it has its record, in order, and no object deleted during the gap, or while a
/// list was cut, lives on downstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_and_a_cut_list_on_the_shared_watch_lose_only_what_the_gap_excuses() {
    // Catch-ups are paginated lists (no initial-events watches), so that one can be cut.
    let paged = SimConfig {
        watch_list: false,
        ..SimConfig::default()
    };
    let scene = Scene::served(12, "sharded-gap", None, paged).await;
    let (bed, names) = (&scene.bed, scene.names());
    let mut cfg = scene.fanned("", GroupProtocol::Classic);
    // Lists of many pages, so that one can be cut midway.
    cfg.kubernetes.list_page_size = 4;
    let replicas = [
        Relay::start(bed, cfg.clone()),
        Relay::start(bed, cfg.clone()),
    ];
    let [a, b] = &replicas;
    wait_spread(&[a, b]).await;
    for r in &replicas {
        r.wait_up(r.metrics.shards_owned.get() as usize).await;
    }
    let from = bed.sim.current_rv();
    let lists = || -> u64 { replicas.iter().map(|r| r.metrics.fanout_lists.get()).sum() };

    // Before the gap: churn, every change relayed.
    let churn = scene.churn(150.0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    churn.stop().await;
    scene.converged(kafka_view).await;

    // The gap: no read reaches the server while pods change, then it drops its history.
    let before = lists();
    bed.sim.fail_next(usize::MAX, Fault::ServerError);
    // Every watch closed before the pods change (a watch still streaming when cut, or opened
    // just after, would carry the gap's changes): reopens fail while the server refuses.
    eventually(
        || {
            bed.sim.drop_watches();
            bed.sim.requests().watches_open == 0
        },
        || "the shared watches never closed".into(),
    )
    .await;
    let gap_from = bed.sim.current_rv();
    for ns in &names {
        let live: Vec<String> = pods(&bed.sim, &[ns], |_| true).into_keys().collect();
        for (i, key) in live.iter().enumerate() {
            let name = key.rsplit('/').next().unwrap();
            if i % 2 == 0 {
                bed.sim.delete("pods", Some(ns), name).unwrap();
            } else {
                bed.sim
                    .merge_patch(
                        "pods",
                        Some(ns),
                        name,
                        serde_json::json!({"metadata": {"labels": {"gap": "yes"}}}),
                    )
                    .unwrap();
            }
        }
        bed.sim
            .create("pods", Some(ns), objects::pod(ns, "made-in-the-gap"))
            .unwrap();
    }
    let gap_to = bed.sim.current_rv();
    bed.sim.compact();
    // The first list after it fails at its second page.
    bed.sim.fail_next_pages(1);
    bed.sim.stop_failing();
    // Each replica lists once, and the cut one lists again; every shard has then published
    // what the gap changed (every namespace changed in it).
    eventually(
        || lists() >= before + 3,
        || format!("the replicas never relisted: {} lists", lists() - before),
    )
    .await;
    scene.converged(kafka_view).await;

    // After the gap: churn again, every change relayed.
    let churn = scene.churn(150.0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    churn.stop().await;
    let msgs = scene.converged(kafka_view).await;
    let outside_the_gap: Vec<_> = bed
        .journal_after("pods", None, from)
        .into_iter()
        .filter(|e| !(gap_from < e.rv && e.rv <= gap_to))
        .collect();
    assert_covers(&msgs, &outside_the_gap);
    eprintln!(
        "{}; {} lists for the gap",
        scene.per_change(&msgs),
        lists() - before
    );
    for r in replicas {
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_leader_release_moves_to_sharding_under_churn() {
    moves_to_sharding(false, "", false).await;
}

/// The single leader's one stream over every namespace is split by namespace, each part to its
/// namespace's shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_leader_over_every_namespace_moves_to_sharding() {
    moves_to_sharding(true, "", false).await;
}

/// With `delivery: exactlyOnce`, a single leader killed under churn (its ConfigMap behind its
/// last commits, a transaction left open) hands over to sharded replicas: its id is fenced
/// before its state is copied, the shards resume from the positions it committed, and a
/// `read_committed` consumer reads every change once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_a_killed_single_leader_moves_to_sharding_without_repeating() {
    let msgs = moves_to_sharding(false, "  delivery: exactlyOnce\n", true).await;
    assert_once(&msgs);
}

/// A single-leader release of pods in eight namespaces (listed, or `allNamespaces`) moves to
/// sharding under churn, the single leader stopped (or `kill`ed), with `kafka` added to the
/// Kafka settings. Returns what was read.
async fn moves_to_sharding(all: bool, kafka: &str, kill: bool) -> Vec<Msg> {
    let scene = Scene::new(8, "migrated", None).await;
    let (bed, names) = (&scene.bed, scene.names());
    let channels = scene.channel(all.then_some("allNamespaces: true"));
    let mut old = bed.config(&channels, kafka);
    old.checkpoint.name = kafka::unique("relay");
    let le = &mut old.leader_election;
    le.enabled = true;
    le.name = kafka::unique("lease");
    le.lease_duration_seconds = 4;
    le.renew_deadline_seconds = 3;
    le.retry_period_seconds = 1;
    let single = Relay::start(bed, old.clone());
    eventually(
        || single.metrics.leader.get() == 1,
        || "the single leader never led".into(),
    )
    .await;
    single.wait_up(if all { 1 } else { names.len() }).await;
    let from = bed.sim.current_rv();
    let churn = scene.churn(150.0);

    // The new version: the same release, sharded.
    // The same file with sharding on (an `allNamespaces` channel is then relayed per namespace).
    let mut new = bed.config_with(&channels, kafka, "sharding:\n  enabled: true\n");
    new.sharding = sharded(&old, GroupProtocol::Classic).sharding;
    new.checkpoint = old.checkpoint.clone();
    new.leader_election = old.leader_election.clone();
    new.leader_election.enabled = false;
    let a = Relay::start(bed, new.clone());
    let b = Relay::start(bed, new.clone());
    // Not a wait: that no shard runs while the single leader does is seen only after a while.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        owned(&[&a, &b]),
        [0, 0],
        "shards ran beside the single leader"
    );
    if kill {
        single.kill().await;
    } else {
        single.stop().await;
    }
    let moved = takeover(&[&a, &b]).await;

    // A replica configured as before, sharding off, never leads again: it refuses to start,
    // since it would resume from the state before sharding. (An older version, without that
    // check, stands by behind the Lease the shards parked.)
    let again = Relay::start(bed, old.clone());
    let refused = again.outcome().await.expect_err("refused");
    assert!(refused.contains("ran sharded"), "{refused}");
    churn.stop().await;
    eprintln!("shards running {moved:?} after the single leader stopped");

    let msgs = scene.converged(kafka_view).await;
    eprintln!("{}", scene.per_change(&msgs));
    // The shards resumed from the single leader's positions: every change has its record. (A
    // stream split out of one over every namespace relists once: see below.)
    if !all {
        assert_covers(&msgs, &bed.journal_after("pods", None, from));
    }
    // Each shard copied the single leader's positions: no stream started over with a list. A
    // stream split out of one over every namespace watches another collection than its
    // position's: it relists once, against the members it was given.
    let resynced: u64 = names
        .iter()
        .map(|ns| {
            let id = format!("watchNamespacedPods.{ns}");
            a.counter("resyncs_total", &id) + b.counter("resyncs_total", &id)
        })
        .sum();
    if !all {
        assert_eq!(
            resynced, 0,
            "streams relisted instead of resuming the migrated positions"
        );
    }
    eprintln!("resyncs after the move: {resynced}");
    a.stop().await;
    b.stop().await;
    msgs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_from_the_api_server_gives_its_shards_up() {
    let scene = Scene::new(8, "sharded-cut", None).await;
    let bed = &scene.bed;
    let mut cfg = scene.sharded(GroupProtocol::Classic);
    cfg.sharding.api_unreachable_seconds = 3;
    let (mut proxy, listener) = Proxy::bind().await;
    let sim_port: u16 = bed
        .sim
        .url()
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse()
        .unwrap();
    proxy.forward_to(listener, sim_port, Wire::Bytes);
    let url = bed
        .sim
        .url()
        .replace(&format!(":{sim_port}"), &format!(":{}", proxy.port));
    let cut = Relay::start_at(bed, cfg.clone(), &url);
    let direct = Relay::start(bed, cfg.clone());
    wait_spread(&[&cut, &direct]).await;
    let from = positioned_at(bed, &cfg.checkpoint.name, scene.names().len()).await;
    let churn = scene.churn(150.0);
    proxy.cut();
    let gave_up = takeover(&[&direct]).await;
    assert_eq!(cut.metrics.shards_owned.get(), 0);
    proxy.restore();
    let back = takeover(&[&cut, &direct]).await;
    churn.stop().await;
    eprintln!(
        "shards relayed elsewhere {gave_up:?} after the cut; shared again {back:?} after it healed"
    );

    // The next owners replay from the last positions written: nothing is lost on the way.
    let msgs = scene.converged(kafka_view).await;
    assert_covers(&msgs, &bed.journal_after("pods", None, from));
    cut.stop().await;
    direct.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_loses_nothing() {
    broker_restart(Delivery::AtLeastOnce).await;
}

/// The same with `delivery: exactlyOnce`: a `read_committed` consumer reads every change once.
/// Out of the suite for now: the single broker's controlled shutdown takes the leadership of
/// every partition while its transaction coordinator completes the commits in progress, and
/// the coordinator skips the markers of partitions without a leader, so those transactions
/// hang (see `docs/failure-modes.md`). Beside the at-least-once test, 6 runs of 19 stalled on
/// one (a shard's restore waits for an operator to end it) and 1 of 19 published a change
/// twice. Replicated topics keep a leader through a broker's restart: the rolling restart
/// above is the tier's exactly-once broker restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the single broker's shutdown leaves transactions hanging; see the comment"]
async fn exactly_once_through_a_broker_restart_publishes_every_change_once() {
    let msgs = broker_restart(Delivery::ExactlyOnce).await;
    assert_once(&msgs);
}

/// The same on a cluster of two brokers whose partitions, group offsets and transaction state
/// keep a replica on each, as in production: the second broker restarts, as in a rolling
/// restart, while two exactly-once replicas relay under churn. The partitions and coordinators
/// it led move to the first and back; a `read_committed` consumer reads every change once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_through_a_rolling_broker_restart_publishes_every_change_once() {
    let replicated = [
        "default.replication.factor=2",
        "offsets.topic.replication.factor=2",
        "transaction.state.log.replication.factor=2",
    ];
    let primary = OwnBroker::start(Options {
        extra: replicated.iter().map(|l| l.to_string()).collect(),
        ..Options::default()
    });
    let mut second = primary.join();
    let topic = kafka::unique("sharded-rolling");
    primary.tool(
        "org.apache.kafka.tools.TopicCommand",
        &[
            "--create",
            "--topic",
            &topic,
            "--partitions",
            "3",
            "--replication-factor",
            "2",
        ],
    );
    let scene = Scene::with_topic(8, topic, &primary.bootstrap).await;
    let msgs = restarted_under_churn(&scene, Delivery::ExactlyOnce, || {
        second.stop();
        second.start_again();
    })
    .await;
    assert_once(&msgs);
}

/// Two sharded replicas under churn while their only broker restarts. The records read.
async fn broker_restart(delivery: Delivery) -> Vec<Msg> {
    let mut broker = OwnBroker::start(Options::default());
    let scene = Scene::new(8, "sharded-restart", Some(&broker.bootstrap)).await;
    restarted_under_churn(&scene, delivery, || broker.restart()).await
}

/// Two sharded replicas of `scene` under churn while `restart` restarts a broker; every change
/// after the streams' positions is published. The records read.
async fn restarted_under_churn(
    scene: &Scene,
    delivery: Delivery,
    restart: impl FnOnce(),
) -> Vec<Msg> {
    let bed = &scene.bed;
    let mut cfg = scene.sharded(GroupProtocol::Classic);
    cfg.kafka.delivery = delivery;
    let a = Relay::start(bed, cfg.clone());
    let b = Relay::start(bed, cfg.clone());
    wait_spread(&[&a, &b]).await;
    let from = positioned_at(bed, &cfg.checkpoint.name, scene.names().len()).await;
    let churn = scene.churn(100.0);
    let down = Instant::now();
    tokio::task::block_in_place(restart);
    let restart = down.elapsed();
    // Not a wait: whatever the restart sets off (fences, lost sessions, claims again) plays out
    // within the session timeout after the broker is back.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let back = takeover(&[&a, &b]).await;
    churn.stop().await;
    // Fenced while the broker was away (if it was away past the ownership deadline), then
    // claimed again.
    let fences = a.metrics.shard_fences.get() + b.metrics.shard_fences.get();
    eprintln!("the broker restarted in {restart:?}; shared again {back:?} after 7 s more; fences: {fences}");
    // Records the restart failed are replayed from the checkpoints: every change is there.
    let msgs = scene.converged(kafka_view).await;
    assert_covers(&msgs, &bed.journal_after("pods", None, from));
    a.stop().await;
    b.stop().await;
    msgs
}

/// A revoke while the broker leading the channel topic's partitions is away and the group
/// coordinator, on the other broker, is fine: the first replica's records of a moving shard
/// cannot be delivered by the end of its handover, and the next owner queues newer changes
/// meanwhile. Once the broker is back, every key's last record is the cluster's: nothing the
/// first replica queued lands after the next owner's records (its records expired within the
/// session's margin, or were purged at the handover).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_while_the_topics_broker_is_away_lands_nothing_old_last() {
    let primary = OwnBroker::start(Options::default());
    // The group coordinator on the first broker: its offsets topic is made before the second
    // broker joins, which then leads every partition of the channel topic.
    kafka::make_offsets_topic(&primary.bootstrap).await;
    let mut second = primary.join();
    let topic = kafka::unique("sharded-away");
    primary.tool(
        "org.apache.kafka.tools.TopicCommand",
        &[
            "--create",
            "--topic",
            &topic,
            "--replica-assignment",
            "2,2,2",
        ],
    );
    let scene = Scene::with_topic(8, topic, &primary.bootstrap).await;
    let bed = &scene.bed;
    let mut cfg = scene.sharded(GroupProtocol::Classic);
    // A drain budget of a few seconds.
    cfg.shutdown_timeout_seconds = 12;
    // The first replica reconnects to a broker that comes back only after the next owner did:
    // what it still holds for the moving shards would be delivered after the next owner's.
    let mut slow = cfg.clone();
    for key in ["reconnect.backoff.ms", "reconnect.backoff.max.ms"] {
        slow.kafka.properties.insert(key.into(), "8000".into());
    }
    let a = Relay::start(bed, slow);
    eventually(
        || owned(&[&a]) == [i64::from(SHARDS)],
        || "the first replica never owned every shard".into(),
    )
    .await;
    let churn = scene.churn(100.0);
    // Not a wait: changes flow through the first replica for a while.
    tokio::time::sleep(Duration::from_secs(2)).await;
    tokio::task::block_in_place(|| second.stop());
    // Not a wait: the first replica queues changes it cannot deliver.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let b = Relay::start(bed, cfg.clone());
    wait_spread(&[&a, &b]).await;
    // Not a wait: the next owner queues newer changes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    churn.stop().await;
    tokio::task::block_in_place(|| second.start_again());
    scene.converged(kafka_view).await;
    // Not a wait: the first replica's reconnect backoff runs out; anything it still held for
    // the moved shards would be delivered now, after the next owner's records.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let (bootstrap, topic) = (bed.bootstrap.clone(), scene.topic.clone());
    let msgs = tokio::task::spawn_blocking(move || kafka::read_all(&bootstrap, &topic))
        .await
        .unwrap();
    assert_eq!(
        kafka_view(&msgs),
        pods(&bed.sim, &scene.names(), |_| true),
        "a record of the first replica landed after the next owner's"
    );
    let purges = a.metrics.shard_handover_purges.get() + b.metrics.shard_handover_purges.get();
    eprintln!(
        "{}; late records of a deposed owner: {}; handovers that purged: {purges}",
        scene.per_change(&msgs),
        epoch_view(&msgs).1
    );
    a.stop().await;
    b.stop().await;
}

/// Which replica (its pod name) last claimed each shard, from the shards' ConfigMaps.
fn owners(bed: &Bed, checkpoint: &str) -> Vec<Option<String>> {
    (0..SHARDS)
        .map(|k| {
            let name = ShardingConfig::configmap(checkpoint, k);
            let cm = bed.sim.get("configmaps", Some(CHECKPOINT_NS), &name)?;
            let owner = cm["metadata"]["annotations"]["watchrelay.io/owner"].as_str()?;
            Some(owner.split('_').next().unwrap_or(owner).to_string())
        })
        .collect()
}

/// Waits until every shard was last claimed by one of `pods`, and returns how long it took.
async fn wait_owned_by(bed: &Bed, checkpoint: &str, pods: &[&str]) -> Duration {
    let start = Instant::now();
    eventually(
        || {
            owners(bed, checkpoint)
                .iter()
                .all(|o| o.as_deref().is_some_and(|o| pods.contains(&o)))
        },
        || {
            format!(
                "shards never all owned by {pods:?}: {:?}",
                owners(bed, checkpoint)
            )
        },
    )
    .await;
    start.elapsed()
}

/// What a consumer holds that applies, per key, only records whose owner epoch is at least the
/// highest it saw on the key from the same shard (the rule against a deposed owner's late
/// record in `docs/delivery.md`): key -> uid. Also how many records the rule dropped.
fn epoch_view(msgs: &[Msg]) -> (BTreeMap<String, String>, usize) {
    let mut sorted: Vec<&Msg> = msgs.iter().collect();
    sorted.sort_by_key(|m| (m.partition, m.offset));
    let mut highest: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut kept = Vec::new();
    let mut dropped = 0;
    for m in sorted {
        let Some(key) = &m.key else { continue };
        let epoch: u64 = m.headers["ce_ownerepoch"].parse().unwrap();
        let shard = m.headers["ce_shard"].clone();
        let top = highest.entry((key.clone(), shard)).or_insert(0);
        if epoch < *top {
            dropped += 1;
            continue;
        }
        *top = epoch;
        kept.push(m.clone());
    }
    (kafka_view(&kept), dropped)
}

/// Whether every shard's checkpoint ConfigMap holds a position for each of its streams
/// (`streams` of them in all).
/// Waits until `streams` streams of the release have their positions written in the shards'
/// ConfigMaps, and returns the cluster's resourceVersion then: a next owner resumes from those
/// positions, so every change after it must be published.
async fn positioned_at(bed: &Bed, checkpoint: &str, streams: usize) -> u64 {
    eventually(
        || positioned(bed, checkpoint, streams),
        || "the streams' positions were never written".into(),
    )
    .await;
    bed.sim.current_rv()
}

fn positioned(bed: &Bed, checkpoint: &str, streams: usize) -> bool {
    let mut positions = 0;
    for k in 0..SHARDS {
        let name = ShardingConfig::configmap(checkpoint, k);
        let Some(cm) = bed.sim.get("configmaps", Some(CHECKPOINT_NS), &name) else {
            return false;
        };
        let saved = watchrelay::checkpoint::read(&serde_json::from_value(cm).unwrap());
        positions += saved.values().filter(|s| s.rv.is_some()).count();
    }
    positions >= streams
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_and_a_frozen_one_lose_nothing() {
    killed_and_frozen(false, "").await;
}

/// The same over a fanned-out collection with `delivery: exactlyOnce`: a `read_committed`
/// consumer reads every change once, and nothing of a fenced owner after its successor's
/// first record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_through_a_kill_and_a_freeze_publishes_every_change_once() {
    let msgs = killed_and_frozen(true, "  delivery: exactlyOnce\n").await;
    assert_once(&msgs);
    assert_eq!(
        epoch_view(&msgs).1,
        0,
        "a deposed owner's record after its successor's"
    );
}

/// The same over a fanned-out collection (`watchAllPods`'s shape: every namespace, one read per
/// replica): each moved shard's part resumes where its owner stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_and_a_frozen_one_lose_nothing_fanned_out() {
    killed_and_frozen(true, "").await;
}

/// A folder for relay processes of a sharded release on `bed` relaying `channels` (YAML list
/// items), their configuration and the release's checkpoint name. Only keys 0.1.0 knows too:
/// it refuses any other.
fn processes(bed: &Bed, channels: &str) -> (tempfile::TempDir, String, String) {
    processes_with(bed, channels, "")
}

/// [`processes`], with `kafka` (YAML lines) added to the Kafka settings.
fn processes_with(bed: &Bed, channels: &str, kafka: &str) -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    bed.sim.write_kubeconfig(&kubeconfig).unwrap();
    let checkpoint = kafka::unique("relay");
    let config = format!(
        "clusterName: test\nkubernetes:\n  kubeconfig: {}\n  backoffInitialMs: 20\n  backoffMaxMs: 300\n\
         kafka:\n  bootstrapServers: {}\n  oversize: trim\n{kafka}  properties:\n    linger.ms: \"5\"\n\
         checkpoint:\n  namespace: {CHECKPOINT_NS}\n  name: {checkpoint}\n  intervalMs: 200\n\
         sharding:\n  enabled: true\n  shards: {SHARDS}\n  topic: {}\n  sessionTimeoutMs: 6000\n  ownershipDeadlineMs: 3000\n\
         http:\n  listen: \"\"\n\
         channels:\n{channels}",
        kubeconfig.display(),
        bed.bootstrap,
        kafka::unique("shards"),
    );
    (dir, config, checkpoint)
}

/// Three processes under churn, with `kafka` (YAML lines) added to their Kafka settings; one
/// killed with SIGKILL, one frozen past its session with SIGSTOP, then both back. Every key ends
/// as the cluster's, and every change made once every shard's streams had their positions has
/// its record. The records read.
async fn killed_and_frozen(fanned: bool, kafka: &str) -> Vec<Msg> {
    let scene = Scene::new(12, "sharded-proc", None).await;
    let (bed, names, topic) = (&scene.bed, scene.names(), &scene.topic);
    let scope = if fanned {
        "allNamespaces: true\n    watchStrategy: clusterWide".to_string()
    } else {
        format!("namespaces: [{}]", names.join(", "))
    };
    let channel =
        format!("  - operationId: watchNamespacedPods\n    {scope}\n    topic: {topic}\n");
    let (dir, config, checkpoint) = processes_with(bed, &channel, kafka);
    let mut r0 = RelayProcess::replica(dir.path(), &config, "r0");
    let mut r1 = RelayProcess::replica(dir.path(), &config, "r1");
    let mut r2 = RelayProcess::replica(dir.path(), &config, "r2");
    eventually(
        || {
            let o = owners(bed, &checkpoint);
            ["r0", "r1", "r2"]
                .iter()
                .all(|p| o.iter().any(|x| x.as_deref() == Some(*p)))
                && o.iter().all(Option::is_some)
        },
        || format!("the shards never spread: {:?}", owners(bed, &checkpoint)),
    )
    .await;
    let streams = if fanned { SHARDS as usize } else { names.len() };
    let from = positioned_at(bed, &checkpoint, streams).await;
    let churn = scene.churn(200.0);
    // Not a wait: churn runs a while through all three.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // kill -9: its shards move once its session expires.
    r1.kill();
    let killed = wait_owned_by(bed, &checkpoint, &["r0", "r2"]).await;

    // Frozen past the session: its shards move while it sleeps; resumed, it fences itself.
    r2.signal("-STOP");
    let frozen = wait_owned_by(bed, &checkpoint, &["r0"]).await;
    r2.signal("-CONT");
    eventually(
        || r2.log().contains("fenced: purging"),
        || format!("the resumed replica never fenced itself:\n{}", r2.log()),
    )
    .await;
    // Both back: they share the shards again.
    r1.restart();
    eventually(
        || {
            let o = owners(bed, &checkpoint);
            o.iter().any(|x| x.as_deref() == Some("r1"))
                && o.iter().any(|x| x.as_deref() == Some("r2"))
        },
        || {
            format!(
                "the returning replicas never got shards: {:?}",
                owners(bed, &checkpoint)
            )
        },
    )
    .await;
    churn.stop().await;
    eprintln!("takeover after kill -9: {killed:?}; after a freeze: {frozen:?}");

    let msgs = scene.converged(|m| epoch_view(m).0).await;
    assert_covers(&msgs, &bed.journal_after("pods", None, from));
    let expected = pods(&bed.sim, &names, |_| true);
    let late = epoch_view(&msgs).1;
    let plain = kafka_view(&msgs);
    let differ = expected
        .iter()
        .filter(|(k, v)| plain.get(*k) != Some(*v))
        .count();
    eprintln!(
        "{}; late records of a deposed owner: {late}; keys whose plain last record is wrong: {differ}",
        scene.per_change(&msgs)
    );
    for r in [&mut r0, &mut r1, &mut r2] {
        r.stop();
    }
    msgs
}

/// The relay as released in 0.1.0, built from this repository's history by
/// `scripts/previous.sh` (which the suite runs before this tier; here it only prints the path
/// once built).
fn previous_release() -> std::path::PathBuf {
    let out = std::process::Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/previous.sh"))
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("scripts/previous.sh runs");
    assert!(out.status.success(), "building the 0.1.0 relay failed");
    std::path::PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// A rolling upgrade from 0.1.0, replicas of both versions side by side, then the stream
/// fanned out. Three 0.1.0 replicas relay `watchAllPods` whole, in its channel's shard (as
/// releases before fan-out did); under churn they are replaced one by one by this version's,
/// and then one new replica is killed. The stream stays whole and moves between versions like
/// any shard, and no shard runs a part of it. Then `watchrelay split-whole` is refused while
/// replicas run; with the release stopped (the churn goes on) it hands every shard its part,
/// and three replicas relay the parts from there. Through all of it every change the API
/// server made once the stream had its position is published, nothing is retracted, and every
/// key ends as the cluster's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_from_0_1_0_and_a_split_keep_a_whole_streams_history() {
    let previous = tokio::task::spawn_blocking(previous_release).await.unwrap();
    let scene = Scene::new(12, "upgrade", None).await;
    let (bed, topic) = (&scene.bed, &scene.topic);
    let channel = format!("  - operationId: watchAllPods\n    topic: {topic}\n");
    let (dir, config, checkpoint) = processes(bed, &channel);
    let whole = "watchAllPods._all";
    let home = common::bed::shard_of(SHARDS, "watchAllPods");
    let mut old: Vec<RelayProcess> = ["o0", "o1", "o2"]
        .iter()
        .map(|pod| RelayProcess::replica_of(&previous, dir.path(), &config, pod))
        .collect();
    wait_owned_by(bed, &checkpoint, &["o0", "o1", "o2"]).await;
    let from = positioned_at(bed, &checkpoint, 1).await;
    let churn = scene.churn(200.0);
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Replaced one by one, as a Deployment's rolling update does: each new replica joins once
    // an old one has handed its shards over.
    let mut new = Vec::new();
    for (i, mut o) in old.drain(..).enumerate() {
        o.stop();
        let pod = format!("n{i}");
        new.push(RelayProcess::replica(dir.path(), &config, &pod));
        eventually(
            || {
                owners(bed, &checkpoint)
                    .iter()
                    .any(|o| o.as_deref() == Some(&pod))
            },
            || format!("{pod} never took a shard: {:?}", owners(bed, &checkpoint)),
        )
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    wait_owned_by(bed, &checkpoint, &["n0", "n1", "n2"]).await;
    // A crash of the new replica that relays the stream: it moves once more.
    let owner = owners(bed, &checkpoint)[home as usize].clone().unwrap();
    let crashed: usize = owner[1..].parse().unwrap();
    new[crashed].kill();
    let rest: Vec<String> = (0..3)
        .filter(|i| *i != crashed)
        .map(|i| format!("n{i}"))
        .collect();
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    wait_owned_by(bed, &checkpoint, &rest).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let over_the_collection = |k: u32| -> Vec<String> {
        let name = ShardingConfig::configmap(&checkpoint, k);
        let cm = bed.sim.get("configmaps", Some(CHECKPOINT_NS), &name);
        cm.and_then(|cm| cm["data"].as_object().cloned())
            .map(|d| {
                d.keys()
                    .filter(|id| id.contains("._all"))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    };
    for k in 0..SHARDS {
        let expected: Vec<String> = if k == home {
            vec![whole.into()]
        } else {
            vec![]
        };
        assert_eq!(over_the_collection(k), expected, "shard {k}, kept whole");
    }
    assert!(
        new.iter()
            .any(|r| r.log().contains("relayed whole in its channel's shard")),
        "no new replica said it kept the stream whole"
    );

    // Fanned out: refused while replicas run, split once every one stopped.
    let refused = new[0].split_whole();
    let said = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(
        !refused.status.success() && said.contains("scale the release to zero"),
        "a split while replicas run: {refused:?}"
    );
    for (i, r) in new.iter_mut().enumerate() {
        if i != crashed {
            r.stop();
        }
    }
    // The group may take a moment to empty once the last replica left.
    let mut split = new[0].split_whole();
    for _ in 0..20 {
        if split.status.success() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        split = new[0].split_whole();
    }
    let said = String::from_utf8_lossy(&split.stdout).to_string();
    assert!(split.status.success(), "the split failed: {split:?}");
    assert!(said.contains(&format!("{whole} (shard {home})")), "{said}");
    let mut fanned: Vec<RelayProcess> = ["f0", "f1", "f2"]
        .iter()
        .map(|pod| RelayProcess::replica(dir.path(), &config, pod))
        .collect();
    wait_owned_by(bed, &checkpoint, &["f0", "f1", "f2"]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    churn.stop().await;

    let msgs = scene.converged(|m| epoch_view(m).0).await;
    assert_covers(&msgs, &bed.journal_after("pods", None, from));
    let retracted = msgs
        .iter()
        .filter(|m| m.value["watchrelay"]["synthetic"] == true)
        .count();
    assert_eq!(retracted, 0, "objects were retracted");
    for k in 0..SHARDS {
        let part = format!("watchAllPods._all-s{k}");
        assert_eq!(over_the_collection(k), [part], "shard {k}, split");
    }
    assert!(
        !fanned
            .iter()
            .any(|r| r.log().contains("relayed whole in its channel's shard")),
        "a replica kept the stream whole after the split"
    );
    eprintln!("{}", scene.per_change(&msgs));
    for r in &mut fanned {
        r.stop();
    }
}
