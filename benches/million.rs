//! A million objects, several replicas, one channel read cluster-wide: the first sync of a
//! sharded release, next to the pass-through of the same objects in the same run.
//!
//! 1. The simulator (in this process) holds N small pods (~700 bytes of JSON each,
//!    `BENCH_PODS`, default 1,000,000) over `BENCH_NAMESPACES` namespaces (default 1,000).
//! 2. Pass-through: a child reads the collection once as the relay does at a start (a
//!    `sendInitialEvents` watch of `/api/v1/pods`) and produces each object's line as it is,
//!    unkeyed, to a topic of its own, until the initial events end and Kafka acknowledged
//!    them: the floor of a first sync on this bed. Its time and peak RSS.
//! 3. The release: `BENCH_REPLICAS` (default 3) replicas of the real binary, sharded
//!    (`BENCH_SHARDS`, default 64 as the chart's), one channel `watchAllPods`, started at once
//!    with nothing saved. From their start to the moment the records they published together
//!    reach N: the time, and per replica the records it published, its share of them and its
//!    peak RSS; the list and watch requests the API server received.
//!
//! 4. A relist after a 410: while the API server refuses every request, every watch is cut,
//!    `BENCH_CHANGED` pods (default 1,000) change and the history is compacted, so every shard
//!    relists: the time until every shard of the
//!    release resynced and published the changes, and the records it published meanwhile.
//!
//! Steps 3 and 4 run once for each `kafka.delivery` in `BENCH_DELIVERY` (default
//! `atLeastOnce,exactlyOnce`), each release with a topic, checkpoint and shard group of its own,
//! against the same pass-through. `BENCH_GROUP_PROTOCOL=consumer` forms the shard group on
//! KIP-848 instead of the classic protocol.
//!
//! Every shard relays its part of the collection, each replica reading it once for its shards:
//! the shares say how evenly the replicas split it, the objects each replica received of
//! other replicas' shards what it read to drop. By default the simulator, like an API server
//! without sharded lists and watches, sends every replica everything; with
//! `BENCH_SERVER_SHARDS=1` it serves them as kube-apiserver with `ShardedListAndWatch` on,
//! and each replica is sent its shards' pods only.
//!
//! Run with `scripts/bench.sh million` (it starts a broker) or set KAFKA_BOOTSTRAP_SERVERS.

mod common;

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    create_small_pods, create_topics, env_or, open_lines, peak_rss_kib, plain_producer,
    pods_release, run_stamp, send_when_room, start_sim, total,
};
use rdkafka::producer::{BaseRecord, Producer};
use serde_json::{json, Value};
use watchrelay_sim::{objects, Fault, SimConfig};

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().map(String::as_str) == Some("passthrough") {
        return passthrough(&args[1], &args[2], &args[3]);
    }
    let n = env_or("BENCH_PODS", 1_000_000);
    let namespaces = env_or("BENCH_NAMESPACES", 1_000);
    let replicas = env_or("BENCH_REPLICAS", 3);
    let server_shards = env_or("BENCH_SERVER_SHARDS", 0) == 1;
    let shards = u32::try_from(env_or("BENCH_SHARDS", 64)).expect("BENCH_SHARDS fits a u32");
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP_SERVERS")
        .expect("KAFKA_BOOTSTRAP_SERVERS is not set: run scripts/bench.sh million");
    let (rt, sim) = start_sim(SimConfig {
        watch_list: true,
        history_limit: 10_000,
        journal_limit: Some(1_000),
        sharded_list_and_watch: server_shards,
        ..Default::default()
    });
    let _runtime = rt.enter();
    let dir = tempfile::tempdir().unwrap();
    sim.create("namespaces", None, objects::namespace("watchrelay"))
        .unwrap();
    for i in 0..namespaces {
        sim.create("namespaces", None, objects::namespace(&format!("ns-{i}")))
            .unwrap();
    }
    create_small_pods(&sim, n, |i| format!("ns-{}", i % namespaces));
    let name = format!("bench.million.{}", run_stamp());
    let floor = format!("{name}.passthrough");
    rt.block_on(create_topics(&bootstrap, &[&floor]));
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();

    // 2. The pass-through.
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["passthrough", &bootstrap, &floor, &sim.url()])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let floor: Value = serde_json::from_slice(out.stdout.trim_ascii()).unwrap();

    let floor_secs = floor["secs"].as_f64().unwrap();
    println!(
        "{:<34} {:>9} {:>12} {:>8} {:>13}",
        format!(
            "{n} pods, {namespaces} namespaces{}",
            if server_shards { ", sharded reads" } else { "" }
        ),
        "time s",
        "records",
        "share",
        "peak RSS MiB"
    );
    println!(
        "{:<34} {floor_secs:>9.1} {:>12} {:>8} {:>13.0}",
        "pass-through (one process)",
        floor["records"],
        "",
        floor["rss_kib"].as_f64().unwrap() / 1024.0
    );
    let deliveries =
        std::env::var("BENCH_DELIVERY").unwrap_or_else(|_| "atLeastOnce,exactlyOnce".to_string());
    let bed = Bed {
        sim: &sim,
        dir: dir.path(),
        kubeconfig: &kubeconfig,
        bootstrap: &bootstrap,
        n,
        namespaces,
        replicas,
        shards,
        floor_secs,
    };
    for (generation, delivery) in deliveries.split(',').enumerate() {
        let topic = format!("{name}.{}", delivery.to_lowercase());
        rt.block_on(create_topics(&bootstrap, &[&topic]));
        release(&bed, delivery, &topic, generation + 1);
    }
}

/// What every release of the run shares.
struct Bed<'a> {
    sim: &'a watchrelay_sim::Sim,
    dir: &'a std::path::Path,
    kubeconfig: &'a std::path::Path,
    bootstrap: &'a str,
    n: usize,
    namespaces: usize,
    replicas: usize,
    shards: u32,
    floor_secs: f64,
}

/// 3 and 4 for one release with `kafka.delivery: delivery`, publishing to `topic`; the pods
/// the relist changes are annotated with `generation`.
fn release(bed: &Bed<'_>, delivery: &str, topic: &str, generation: usize) {
    let Bed {
        sim,
        dir,
        kubeconfig,
        bootstrap,
        n,
        namespaces,
        replicas,
        shards,
        floor_secs,
    } = *bed;
    let verb = |v: &str| sim.requests_for("pods").get(v).copied().unwrap_or(0);
    let lists = || verb("list");
    let watches = || verb("watch");
    let (lists0, watches0) = (lists(), watches());
    let started = Instant::now();
    let release = pods_release(
        dir,
        replicas,
        shards,
        kubeconfig,
        bootstrap,
        topic,
        &format!("  maxInFlightPerStream: 20000\n  delivery: {delivery}\n"),
    );
    let ports: Vec<u16> = release.iter().map(|(_, p, _)| *p).collect();
    let published = |ports: &[u16]| total(ports, "watchrelay_events_published_total");
    while published(&ports) < n as f64 {
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "the release never published the {n} pods"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let secs = started.elapsed().as_secs_f64();
    let (lists1, watches1) = (lists(), watches());
    let inferred = total(&ports, "watchrelay_synthetic_deletes_total");

    // 4. A relist after a 410.
    let changed = env_or("BENCH_CHANGED", 1_000);
    let resyncs = |ports: &[u16]| total(ports, "watchrelay_resyncs_total");
    let (published0, resyncs0) = (published(&ports), resyncs(&ports));
    let relist = Instant::now();
    // The API server refuses every request while the watches are cut, the pods change and the
    // history is compacted: every replica's watch then reopens from a position gone.
    sim.fail_next(usize::MAX, Fault::ServerError);
    sim.drop_watches();
    for i in 0..changed {
        let ns = format!("ns-{}", i % namespaces);
        sim.merge_patch(
            "pods",
            Some(&ns),
            &format!("web-{i:07}"),
            json!({"metadata": {"annotations": {"bench/generation": generation.to_string()}}}),
        )
        .unwrap();
    }
    sim.compact();
    sim.stop_failing();
    // Every shard was told of the 410, is watching again, and published the changes.
    let up = |ports: &[u16]| total(ports, "watchrelay_stream_up");
    while resyncs(&ports) < resyncs0 + f64::from(shards)
        || up(&ports) < f64::from(shards)
        || published(&ports) < published0 + changed as f64
    {
        assert!(
            relist.elapsed() < Duration::from_secs(1800),
            "the release never relisted"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let relist_secs = relist.elapsed().as_secs_f64();
    let relisted = published(&ports) - published0;
    println!("{delivery}:");
    let mut shares = Vec::new();
    for (r, (_, port, pid)) in release.iter().enumerate() {
        let records = published(&[*port]).max(0.0);
        shares.push(records / n as f64);
        let received = |whose: &str| {
            total(
                &[*port],
                &format!("watchrelay_fanout_objects_received_total{{whose=\"{whose}\"}}"),
            )
        };
        println!(
            "{:<34} {:>9} {records:>12.0} {:>7.0}% {:>13.0}   received {:.0} own, {:.0} other",
            format!("replica {r} of {replicas}"),
            "",
            records / n as f64 * 100.0,
            peak_rss_kib(*pid) as f64 / 1024.0,
            received("own"),
            received("other"),
        );
    }
    println!(
        "{:<34} {secs:>9.1} ({:.2}x the pass-through); API requests: {} lists, {} watches; {inferred} inferred DELETEDs",
        "the release's first sync",
        secs / floor_secs,
        lists1 - lists0,
        watches1 - watches0
    );
    println!(
        "{:<34} {relist_secs:>9.1} {relisted:>12.0} records for {changed} changed pods; API requests: {} lists, {} watches",
        "a relist after a 410",
        lists() - lists1,
        watches() - watches1
    );
    let rss: Vec<String> = release
        .iter()
        .map(|(_, _, pid)| (peak_rss_kib(*pid) / 1024).to_string())
        .collect();
    println!(
        "BENCH million delivery={delivery} pods={n} replicas={replicas} shards={shards} first_sync_vs_passthrough={:.2} relist_s={relist_secs:.1} relist_records={relisted:.0} shares={} rss_mib={}",
        secs / floor_secs,
        shares
            .iter()
            .map(|s| format!("{s:.2}"))
            .collect::<Vec<_>>()
            .join(","),
        rss.join(",")
    );
    drop(release);
}

/// The pass-through child: reads the pods once with a `sendInitialEvents` watch and produces
/// each line as it is until the initial events end; prints its time, records and peak RSS.
fn passthrough(bootstrap: &str, topic: &str, url: &str) {
    let producer = plain_producer(bootstrap);
    let started = Instant::now();
    let mut r = open_lines(
        url,
        "/api/v1/pods?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
    );
    let mut line = Vec::new();
    let mut records = 0u64;
    loop {
        line.clear();
        let k = r.read_until(b'\n', &mut line).unwrap();
        assert!(k > 0, "the watch ended before its initial events did");
        const MARKER: &[u8] = b"\"type\":\"BOOKMARK\"";
        if line.windows(MARKER.len()).any(|w| w == MARKER) {
            break;
        }
        send_when_room(
            &producer,
            BaseRecord::<(), [u8]>::to(topic).payload(&line[..k - 1]),
        );
        records += 1;
    }
    producer.flush(Duration::from_secs(600)).unwrap();
    println!(
        "{}",
        json!({"secs": started.elapsed().as_secs_f64(), "records": records, "rss_kib": peak_rss_kib(std::process::id())})
    );
}
