//! A whole-process resync at a million objects: the relay's time and peak RSS when it restarts
//! with its position expired over `BENCH_MEMBERS` members (default 1,000,000), next to its full
//! sync of the same objects in the same run.
//!
//! 1. The simulator (in this process) holds N small pods (~700 bytes of JSON each) in one
//!    namespace. The real binary (a child, so its memory is its own) starts with no position and
//!    syncs them: N records and N membership joins. Its time to the checkpoint and peak RSS are
//!    the baseline: a sync that publishes every object.
//! 2. The relay stops (drains, writes its checkpoint). While it is down `BENCH_CHANGED` per mille
//!    of the pods change (default 20: 2%), 1% are created, 1% deleted, and the history is
//!    compacted: its position is expired.
//! 3. The relay starts again: it restores N members from the membership topic, its watch gets
//!    410, and it relists the million objects, publishing only the delta (the changed and new
//!    objects, the inferred DELETEDs, the end marker). Its time from start to the checkpoint at
//!    the relist's resourceVersion, its peak RSS and the records it published are reported.
//!
//! Run with `scripts/bench.sh relist` (it starts a broker) or set KAFKA_BOOTSTRAP_SERVERS.

mod common;

use common::{
    create_small_pods, env_or, free_port, metric, peak_rss_kib, run_stamp, small_pod, start_sim,
    stop, KillOnDrop,
};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use watchrelay_sim::{objects, Sim, SimConfig};

const NS: &str = "bench";
const STREAM: &str = "watchNamespacedPods.bench";

fn main() {
    let n = env_or("BENCH_MEMBERS", 1_000_000);
    let changed = env_or("BENCH_CHANGED", 20);
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP_SERVERS")
        .expect("KAFKA_BOOTSTRAP_SERVERS is not set: run scripts/bench.sh relist");
    let (rt, sim) = start_sim(SimConfig {
        history_limit: 100_000,
        journal_limit: Some(1_000),
        ..Default::default()
    });
    let _runtime = rt.enter();
    let dir = tempfile::tempdir().unwrap();
    for ns in [NS, "watchrelay"] {
        sim.create("namespaces", None, objects::namespace(ns))
            .unwrap();
    }
    create_small_pods(&sim, n, |_| NS.to_string());
    let stamp = run_stamp();
    let topic = format!("bench.relist.{stamp}");
    let membership = format!("bench.relist.membership.{stamp}");
    create_topic(&bootstrap, &topic, 3);
    let (config, port) = write_config(&sim, dir.path(), &bootstrap, &topic, &membership);

    // 1. The full sync: every object published.
    let (relay, full) = run_until_checkpointed(&config, port, &sim, sim.current_rv());
    stop(relay);

    // 2. Down: changes, creations, deletions, then the history is compacted.
    let step = 1000 / changed.max(1);
    for i in (0..n).step_by(step) {
        sim.update("pods", Some(NS), small_pod(NS, &format!("web-{i:07}"), 1))
            .unwrap();
    }
    for i in (1..n).step_by(100) {
        sim.delete("pods", Some(NS), &format!("web-{i:07}"))
            .unwrap();
    }
    for i in 0..n / 100 {
        sim.create("pods", Some(NS), small_pod(NS, &format!("new-{i:07}"), 0))
            .unwrap();
    }
    sim.compact();

    // 3. The restart: restore, 410, relist, delta.
    let (relay, resync) = run_until_checkpointed(&config, port, &sim, sim.current_rv());
    let series = |name: &str| {
        metric(
            resync.port,
            &format!("watchrelay_{name}{{stream=\"{STREAM}\"}}"),
        )
        .unwrap_or(0.0)
    };
    let (published, unchanged, inferred) = (
        series("events_published_total"),
        series("resync_unchanged_total"),
        series("synthetic_deletes_total"),
    );
    stop(relay);

    println!(
        "{:<46} {:>12} {:>14}",
        format!("{n} pods"),
        "time s",
        "peak RSS MiB"
    );
    println!(
        "{:<46} {:>12.1} {:>14.0}",
        "full sync (baseline: every object published)",
        full.secs,
        full.rss_kib as f64 / 1024.0
    );
    println!(
        "{:<46} {:>12.1} {:>14.0}",
        "restart: restore + relist after 410, delta",
        resync.secs,
        resync.rss_kib as f64 / 1024.0
    );
    println!(
        "resync records published: {published:.0} ({inferred:.0} inferred DELETEDs); {unchanged:.0} unchanged objects not republished"
    );
}

/// One run of the relay.
struct Run {
    secs: f64,
    rss_kib: u64,
    port: u16,
}

/// Starts the relay (its HTTP listener on `port`) and waits until its checkpoint reaches `rv`;
/// returns it still running.
fn run_until_checkpointed(config: &Path, port: u16, sim: &Sim, rv: u64) -> (KillOnDrop, Run) {
    let started = Instant::now();
    let relay = common::spawn_relay(config);
    let pid = relay.0.id();
    loop {
        let saved = sim
            .get("configmaps", Some("watchrelay"), "watchrelay-checkpoints")
            .and_then(|cm| cm["data"][STREAM].as_str().map(str::to_string))
            .and_then(|s| serde_json::from_str::<Value>(&s).ok())
            .and_then(|v| v["rv"].as_str()?.parse::<u64>().ok());
        if saved.is_some_and(|s| s >= rv) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "the relay's checkpoint never reached {rv}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let run = Run {
        secs: started.elapsed().as_secs_f64(),
        rss_kib: peak_rss_kib(pid),
        port,
    };
    (relay, run)
}

fn write_config(
    sim: &Sim,
    dir: &Path,
    bootstrap: &str,
    topic: &str,
    membership: &str,
) -> (std::path::PathBuf, u16) {
    let kubeconfig = dir.join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    let port = free_port();
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "clusterName: bench\nkubernetes:\n  kubeconfig: {}\nkafka:\n  bootstrapServers: {bootstrap}\n  oversize: trim\n  maxInFlightPerStream: 20000\n\
             checkpoint:\n  namespace: watchrelay\n  membership:\n    topic: {membership}\nhttp:\n  listen: 127.0.0.1:{port}\n\
             channels:\n  - operationId: watchNamespacedPods\n    namespaces: [{NS}]\n    topic: {topic}\n",
            kubeconfig.display()
        ),
    )
    .unwrap();
    (config, port)
}

fn create_topic(bootstrap: &str, topic: &str, partitions: i32) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    futures::executor::block_on(admin.create_topics([&new], &AdminOptions::new())).unwrap();
}
