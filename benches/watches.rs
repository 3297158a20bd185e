//! What the relay asks of the API server for many namespaces: `BENCH_NAMESPACES` namespaces
//! (default 2,000) matched by the selectors of three channels (pods, services, deployments),
//! one stream per namespace (`perNamespace`) against the default (`auto`: one cluster-wide
//! watch per channel), and one replica of a sharded release owning all of `BENCH_SHARDS` shards
//! (default 64), its selectors left to `auto` (a new release reads them cluster-wide above
//! `kubernetes.clusterWideAbove` namespaces, fanned out to the shards) and set to
//! `perNamespace` (what `auto` ran in sharded releases before), each in the same run against
//! the same simulator.
//!
//! For each: the list requests (pages) and watches opened to start, of them the namespace
//! lists and watches (the selectors' followers), watches open once every stream watches, and
//! the ConfigMap requests a second over `BENCH_IDLE_SECONDS` (default 20) of quiet after that
//! (checkpoint writes and resync polls); then the history is compacted and every watch dropped,
//! so every position expires (410), and the same after the relists, with the most lists in
//! flight at once (bounded by `kubernetes.maxConcurrentSyncs` for the process). Syncs use
//! paginated lists (`sendInitialEvents: false`; `BENCH_INITIAL_EVENTS=1` for watches that send
//! the current state instead). The records go to a producer in memory.
//!
//! Last, `releases`: `BENCH_RELEASES` releases (default 3) of `BENCH_REPLICAS` sharded
//! replicas (default 3) with one pods channel over the same selector, left to `auto`, all at
//! once: the pods lists and watches they open to start and after a 410.
//!
//! `BENCH_STRATEGIES` picks the sides (comma-separated; default all five): one stream per
//! namespace holds a connection per stream on both sides of this one process, so at 5,000
//! namespaces the `perNamespace` sides need more than 20,000 file descriptors.
//!
//! Run with `cargo bench --bench watches` (no broker needed).

use std::sync::Arc;
use std::time::{Duration, Instant};

use watchrelay::config::Config;
use watchrelay::registry::Phase;
use watchrelay::testing::Memory;
use watchrelay_sim::{objects, RequestCounts, Sim, SimConfig};

const CHECKPOINT_NS: &str = "watchrelay";

fn main() {
    let namespaces: usize = std::env::var("BENCH_NAMESPACES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let initial_events = std::env::var("BENCH_INITIAL_EVENTS").is_ok_and(|v| v == "1");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let sim = Sim::start(SimConfig::default()).await.unwrap();
        sim.create("namespaces", None, objects::namespace(CHECKPOINT_NS))
            .unwrap();
        for i in 0..namespaces {
            let ns = format!("ns{i}");
            let mut n = objects::namespace(&ns);
            n["metadata"]["labels"]["relay"] = "yes".into();
            sim.create("namespaces", None, n).unwrap();
            sim.create("pods", Some(&ns), objects::pod(&ns, "p")).unwrap();
            sim.create("pods", Some(&ns), objects::pod(&ns, "q")).unwrap();
            sim.create("services", Some(&ns), objects::service(&ns, "s"))
                .unwrap();
            sim.create("deployments.apps", Some(&ns), objects::deployment(&ns, "d"))
                .unwrap();
        }
        println!(
            "{namespaces} namespaces x 3 channels (pods, services, deployments), {} objects; syncs by {}",
            namespaces * 4,
            if initial_events { "sendInitialEvents watches" } else { "paginated lists" }
        );
        println!("| strategy | streams | start: lists / watches opened | of them namespaces | watches open | ConfigMap requests/s, quiet | after a 410: lists / watches opened | peak lists in flight | start time | 410 time |");
        println!("|---|---|---|---|---|---|---|---|---|---|");
        let strategies = std::env::var("BENCH_STRATEGIES")
            .unwrap_or_else(|_| "auto,perNamespace,sharded,sharded-perNamespace,releases".into());
        for strategy in strategies.split(',') {
            if strategy == "releases" {
                releases(&sim).await;
            } else {
                run(&sim, strategy, initial_events).await;
            }
        }
    });
}

fn config(sim: &Sim, strategy: &str, initial_events: bool) -> Config {
    let shards = std::env::var("BENCH_SHARDS").unwrap_or_else(|_| "64".into());
    let (strategy, sharding) = match strategy {
        "sharded" | "sharded-perNamespace" => (
            strategy.strip_prefix("sharded-").unwrap_or("auto"),
            format!("sharding:\n  enabled: true\n  shards: {shards}\n  topic: shards-bench\n"),
        ),
        other => (other, String::new()),
    };
    let mut channels = String::new();
    for op in [
        "watchNamespacedPods",
        "watchNamespacedServices",
        "watchNamespacedDeployments",
    ] {
        channels.push_str(&format!(
            "  - operationId: {op}\n    namespaceSelector: relay=yes\n    watchStrategy: {strategy}\n    topic: bench\n"
        ));
    }
    let _ = sim;
    Config::parse(&format!(
        "clusterName: bench\nkafka:\n  bootstrapServers: in-memory:9092\n  oversize: trim\n\
         checkpoint:\n  namespace: {CHECKPOINT_NS}\n  name: bench-{}\n  membership:\n    topic: membership-{strategy}\n\
         kubernetes:\n  sendInitialEvents: {initial_events}\n\
         http:\n  listen: \"\"\n{sharding}channels:\n{channels}",
        strategy.to_lowercase() + if sharding.is_empty() { "" } else { "-sharded" }
    ))
    .unwrap()
}

async fn run(sim: &Sim, strategy: &str, initial_events: bool) {
    let relay = relay_on(
        sim,
        config(sim, strategy, initial_events),
        Arc::new(Memory::new()),
        Arc::new(watchrelay::testing::MemoryGroup::default()),
    );
    let (shutdown, registry, metrics) = (relay.shutdown(), relay.registry(), relay.metrics());
    // What an earlier run left open is closed first.
    sim.drop_watches();
    tokio::time::sleep(Duration::from_secs(1)).await;
    sim.reset_requests();
    let t = Instant::now();
    let task = tokio::spawn(relay.run());
    let all_watching = || {
        let phases = registry.phases();
        !phases.is_empty() && phases.values().all(|p| *p == Phase::Watching)
    };
    wait(&registry, all_watching).await;
    let streams = registry.phases().len();
    let start_secs = t.elapsed().as_secs_f64();
    let start = sim.requests();
    let namespaces = sim.requests_for("namespaces");
    let namespaces = format!(
        "{} / {}",
        namespaces.get("list").unwrap_or(&0),
        namespaces.get("watch").unwrap_or(&0)
    );

    sim.reset_requests();
    let idle = std::env::var("BENCH_IDLE_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20u64);
    tokio::time::sleep(Duration::from_secs(idle)).await;
    let configmaps: u64 = sim.requests_for("configmaps").values().sum();
    let configmaps = configmaps as f64 / idle as f64;

    sim.reset_requests();
    let t = Instant::now();
    expire(sim, strategy, || resyncs(&metrics) >= streams).await;
    wait(&registry, all_watching).await;
    let gone_secs = t.elapsed().as_secs_f64();
    let gone = sim.requests();
    shutdown.cancel();
    let _ = task.await;
    let row = |c: RequestCounts| format!("{} / {}", c.lists, c.watches_opened);
    println!(
        "| {strategy} | {streams} | {} | {namespaces} | {} | {configmaps:.1} | {} | {} | {start_secs:.1} s | {gone_secs:.1} s |",
        row(start),
        start.watches_open,
        row(gone),
        gone.peak_lists_in_flight
    );
}

/// `BENCH_RELEASES` releases (default 3) of `BENCH_REPLICAS` sharded replicas each (default
/// 3), one pods channel over the selector left to `auto`, each release on a topic and group of
/// its own, all in this process against `sim`: the pods watches and lists they open to start,
/// and after a 410.
async fn releases(sim: &Sim) {
    let releases: usize = env_usize("BENCH_RELEASES", 3);
    let replicas: usize = env_usize("BENCH_REPLICAS", 3);
    sim.drop_watches();
    tokio::time::sleep(Duration::from_secs(1)).await;
    sim.reset_requests();
    let t = Instant::now();
    let mut running = Vec::new();
    for r in 0..releases {
        let cfg = Config::parse(&format!(
            "clusterName: bench\nkafka:\n  bootstrapServers: in-memory:9092\n  oversize: trim\n\
             checkpoint:\n  namespace: {CHECKPOINT_NS}\n  name: release-{r}\n  membership:\n    topic: membership-release-{r}\n\
             http:\n  listen: \"\"\nsharding:\n  enabled: true\n  topic: shards-release-{r}\nchannels:\n\
             - operationId: watchNamespacedPods\n  namespaceSelector: relay=yes\n  topic: pods-release-{r}\n"
        ))
        .unwrap();
        let producer = Arc::new(Memory::new());
        let group = Arc::new(watchrelay::testing::MemoryGroup::default());
        for _ in 0..replicas {
            let relay = relay_on(sim, cfg.clone(), producer.clone(), group.clone());
            let handles = (relay.shutdown(), relay.registry(), relay.metrics());
            running.push((handles, tokio::spawn(relay.run())));
        }
    }
    // Every shard of every release owned, and every stream watching.
    let settled = || {
        let owned: i64 = running
            .iter()
            .map(|((_, _, m), _)| m.shards_owned.get())
            .sum();
        owned == 64 * i64::try_from(releases).expect("a few releases")
            && running.iter().all(|((_, reg, _), _)| {
                let phases = reg.phases();
                !phases.is_empty() && phases.values().all(|p| *p == Phase::Watching)
            })
    };
    let deadline = Instant::now() + Duration::from_secs(600);
    while !settled() {
        assert!(Instant::now() < deadline, "the releases never settled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let start_secs = t.elapsed().as_secs_f64();
    let pods = |c: &std::collections::BTreeMap<&str, u64>| {
        format!(
            "{} / {}",
            c.get("list").unwrap_or(&0),
            c.get("watch").unwrap_or(&0)
        )
    };
    let start = pods(&sim.requests_for("pods"));
    let open = sim.requests().watches_open;
    let streams: usize = running
        .iter()
        .map(|((_, reg, _), _)| reg.phases().len())
        .sum();

    sim.reset_requests();
    let t = Instant::now();
    let resynced = || {
        let all: usize = running.iter().map(|((_, _, m), _)| resyncs(m)).sum();
        all >= streams
    };
    expire(sim, "releases", resynced).await;
    while !settled() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let gone_secs = t.elapsed().as_secs_f64();
    let gone = pods(&sim.requests_for("pods"));
    for ((shutdown, _, _), _) in &running {
        shutdown.cancel();
    }
    for (_, task) in running {
        let _ = task.await;
    }
    println!(
        "\n{releases} releases x {replicas} sharded replicas, one pods channel over the selector (auto): {streams} streams; pods lists / watches opened to start {start} ({open} watches open, namespaces included) in {start_secs:.1} s; after a 410 {gone} in {gone_secs:.1} s"
    );
}

/// A relay of `cfg` against `sim`, its records in `producer`, meeting its replicas in `group`.
fn relay_on(
    sim: &Sim,
    cfg: Config,
    producer: Arc<Memory>,
    group: Arc<watchrelay::testing::MemoryGroup>,
) -> watchrelay::Relay {
    let mut kube = kube::Config::new(sim.url().parse().unwrap());
    kube.default_retry = false;
    let client = kube::Client::try_from(kube).unwrap();
    watchrelay::Relay::new(cfg, client)
        .with_producer(producer.clone(), producer)
        .with_coordinator(group)
        .with_probe(watchrelay::kubeclient::Target::At(
            sim.url().parse().unwrap(),
            Default::default(),
        ))
}

/// The resyncs `metrics` counted, over every stream.
fn resyncs(metrics: &watchrelay::metrics::Metrics) -> usize {
    let text = String::from_utf8(metrics.render()).unwrap();
    text.lines()
        .filter(|l| l.starts_with("watchrelay_resyncs_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as usize
}

/// Changes past every position, compacted, and every watch dropped: each stream reopens at a
/// position the server no longer has (410). A stream whose position a bookmark moved past the
/// changes first is caught by the next round, until `resynced`.
async fn expire(sim: &Sim, label: &str, resynced: impl Fn() -> bool) {
    let mut round = 0;
    while !resynced() {
        round += 1;
        sim.create(
            "configmaps",
            Some(CHECKPOINT_NS),
            serde_json::json!({"metadata": {"name": format!("bump-{label}-{round}")}}),
        )
        .unwrap();
        sim.compact();
        sim.drop_watches();
        let until = Instant::now() + Duration::from_secs(30);
        while !resynced() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn wait(registry: &watchrelay::registry::Registry, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(1200);
    let mut told = Instant::now();
    while !cond() {
        assert!(Instant::now() < deadline, "the relay never got there");
        if told.elapsed() > Duration::from_secs(10) {
            told = Instant::now();
            let phases = registry.phases();
            let watching = phases.values().filter(|p| **p == Phase::Watching).count();
            eprintln!("  ... {watching} of {} streams watching", phases.len());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
