//! Handovers under load, as the consumer sees them: scale 3 → 5 → 2, then kill -9 of one of
//! the two, while pods change at `BENCH_RATE` per second (default 5,000) over
//! `BENCH_NAMESPACES` namespaces (default 24), the pods read cluster-wide once per replica and
//! fanned out to 16 shards (the shape `auto` gives a new release's `allNamespaces` channels).
//!
//! Afterwards, once the topic took no record for 5 s, the whole topic is read back and checked
//! against the API server's journal:
//! - **changes lost**: changes made once the first replicas' streams ran that have no record
//!   (every shard that moves resumes where its owner stopped; nothing here excuses a list);
//! - **late records**: per shard and partition, records of an older owner epoch after the
//!   first record of a newer one (a deposed owner's record landing after its successor's);
//! - **unowned time** per shard and handover: from the last record of the old owner epoch to
//!   the first of the new one, p50, p99 and the largest, beside the session timeout (a killed
//!   replica's shards wait for it) and the membership restore the new owners took;
//! - the revoke-to-answer time of every revoke (`shard_handover_seconds`), p50 and p99.
//!
//! `BENCH_GROUP_PROTOCOL=consumer` runs the shard group on KIP-848, whose session and heartbeat
//! the broker sets (scripts/bench.sh starts one with the release's 10 s session and 1 s
//! heartbeats); the default is the classic protocol. The churn's start is printed in ms since
//! the epoch, to line the steps up with the replicas' logs (`BENCH_RELAY_LOG`).
//!
//! Run with scripts/bench.sh handover (it starts a broker) or set KAFKA_BOOTSTRAP_SERVERS.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use common::{
    bench_bed, create_topics, env_or, metric, scrape, sharded_replica_over, stop, total,
    wait_shared, KillOnDrop,
};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use watchrelay_sim::{objects, ChurnSpec};

const SHARDS: u32 = 16;
/// The release's session timeout (the configuration's default).
const SESSION: Duration = Duration::from_secs(10);
const PARTITIONS: i32 = 3;

/// The cumulative bucket counts of `watchrelay_shard_handover_seconds` on one replica: upper
/// bound (seconds) -> count.
fn buckets(port: u16) -> BTreeMap<u64, f64> {
    scrape(port)
        .lines()
        .filter(|l| l.starts_with("watchrelay_shard_handover_seconds_bucket"))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let bound = if le == "+Inf" {
                u64::MAX
            } else {
                (le.parse::<f64>().ok()? * 1e6) as u64
            };
            Some((bound, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
}

/// The upper bound of the bucket holding quantile `q` of the cumulative `buckets`.
fn quantile(buckets: &BTreeMap<u64, f64>, q: f64) -> String {
    let all = buckets.values().copied().fold(0.0, f64::max);
    let want = (all * q).ceil().max(1.0);
    match buckets.iter().find(|(_, n)| **n >= want) {
        Some((&u64::MAX, _)) => "over the largest bucket".into(),
        Some((bound, _)) => format!("≤ {:.2} s", *bound as f64 / 1e6),
        None => "no handover".into(),
    }
}

/// A record of the topic, as the checks need it.
struct Read {
    partition: i32,
    shard: u32,
    epoch: u64,
    /// Its timestamp (the producer's), in milliseconds.
    at: i64,
    id: String,
}

/// Waits until `topic`'s partitions took no record for 5 s (at most 3 minutes; it says so if
/// they never did). A failed look counts as not quiet.
fn settle(bootstrap: &str, topic: &str) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let ends = || -> Option<Vec<i64>> {
        (0..PARTITIONS)
            .map(|p| {
                consumer
                    .fetch_watermarks(topic, p, Duration::from_secs(10))
                    .ok()
                    .map(|(_, high)| high)
            })
            .collect()
    };
    let (mut last, mut quiet) = (ends(), 0);
    for _ in 0..180 {
        std::thread::sleep(Duration::from_secs(1));
        let now = ends();
        quiet = if now.is_some() && now == last {
            quiet + 1
        } else {
            0
        };
        if quiet >= 5 {
            return;
        }
        last = now;
    }
    eprintln!("the topic still took records 3 minutes after the churn stopped");
}

/// Every record of `topic`, partition by partition in offset order.
fn read_all(bootstrap: &str, topic: &str) -> Vec<Read> {
    #[derive(serde::Deserialize)]
    struct Value {
        watchrelay: Meta,
    }
    #[derive(serde::Deserialize)]
    struct Meta {
        id: String,
    }
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("{topic}-read"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut reads = Vec::new();
    for p in 0..PARTITIONS {
        let (_, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
        consumer.assign(&tpl).unwrap();
        let mut next = 0;
        while next < high {
            let Some(m) = consumer.poll(Duration::from_secs(5)) else {
                panic!("partition {p} stopped at {next} of {high}");
            };
            let m = m.unwrap();
            next = m.offset() + 1;
            let (mut shard, mut epoch) = (None, None);
            for h in m.headers().into_iter().flat_map(|h| h.iter()) {
                let v = h.value.and_then(|v| std::str::from_utf8(v).ok());
                match h.key {
                    "ce_shard" => shard = v.and_then(|v| v.parse().ok()),
                    "ce_ownerepoch" => epoch = v.and_then(|v| v.parse().ok()),
                    _ => {}
                }
            }
            let Some(payload) = m.payload().filter(|p| !p.is_empty()) else {
                continue;
            };
            let Ok(value) = serde_json::from_slice::<Value>(payload) else {
                continue;
            };
            reads.push(Read {
                partition: p,
                shard: shard.expect("every record names its shard"),
                epoch: epoch.expect("every record names its owner epoch"),
                at: m.timestamp().to_millis().unwrap_or_default(),
                id: value.watchrelay.id,
            });
        }
    }
    reads
}

/// The value at quantile `q` of `sorted`.
fn at_quantile(sorted: &[i64], q: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// What one run of the scenario measured.
struct Run {
    changes: usize,
    lost: usize,
    late: usize,
    /// Unowned time per shard and handover, ms, sorted; with the worst handover's shard, epochs
    /// and when its gap began, in ms from the churn's start.
    unowned: Vec<i64>,
    worst: Option<(u32, u64, u64, i64)>,
    restore_ms: f64,
    revokes: BTreeMap<u64, f64>,
    /// When each step was done, in ms from the churn's start.
    steps: Vec<(&'static str, i64)>,
}

/// The scenario over the pods channel with `scope`, on its own topic and release.
fn scenario(scope: &str, rate: f64, names: &[String], label: &str) -> Run {
    // The server keeps every change of the run: no position expires, so none is excused.
    let (bootstrap, rt, sim, dir) = bench_bed(2_000_000);
    let _runtime = rt.enter();
    for ns in names.iter().map(String::as_str).chain(["watchrelay"]) {
        sim.create("namespaces", None, objects::namespace(ns))
            .unwrap();
    }
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    let name = format!("handover-{label}-{}", std::process::id());
    rt.block_on(create_topics(&bootstrap, &[&name]));
    let replica = |r: usize| {
        sharded_replica_over(dir.path(), &kubeconfig, &bootstrap, &name, SHARDS, scope, r)
    };
    // Revoke-to-answer histograms, scraped from each replica before it goes.
    let mut revokes: BTreeMap<u64, f64> = BTreeMap::new();
    let mut restores: Vec<f64> = Vec::new();
    let mut leave = |(child, port): (KillOnDrop, u16), kill: bool| {
        for (bound, n) in buckets(port) {
            *revokes.entry(bound).or_default() += n;
        }
        restores.extend(metric(port, "watchrelay_membership_restore_seconds "));
        if kill {
            drop(child);
        } else {
            stop(child);
        }
    };

    let mut live: Vec<(KillOnDrop, u16)> = (0..3).map(replica).collect();
    let ports = |live: &[(KillOnDrop, u16)]| live.iter().map(|(_, p)| *p).collect::<Vec<_>>();
    wait_shared(&ports(&live), SHARDS);
    // Every stream running before the history checked begins.
    let streams = if scope.starts_with("namespaces") {
        names.len()
    } else {
        SHARDS as usize
    };
    while total(&ports(&live), "watchrelay_stream_up{") < streams as f64 {
        std::thread::sleep(Duration::from_millis(50));
    }
    let from = sim.current_rv();
    let churn = sim.start_churn(ChurnSpec {
        rate_per_sec: rate,
        namespaces: names.to_vec(),
        resources: vec!["pods".into()],
        max_objects_per_kind: 20,
        total_events: None,
    });
    let began = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let since = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
            - began
    };
    let mut steps = vec![(
        "the churn begins (ms since the epoch, for the replicas' logs)",
        began,
    )];
    let pause = || std::thread::sleep(Duration::from_secs(3));
    pause();
    steps.push(("scale 3 → 5 begins", since()));
    live.push(replica(3));
    live.push(replica(4));
    wait_shared(&ports(&live), SHARDS);
    steps.push(("shared by 5", since()));
    pause();
    steps.push(("scale 5 → 2 begins (SIGTERM)", since()));
    for _ in 0..3 {
        let gone = live.remove(2);
        leave(gone, false);
    }
    wait_shared(&ports(&live), SHARDS);
    steps.push(("shared by 2", since()));
    pause();
    steps.push(("kill -9 of one of two", since()));
    let killed = live.remove(1);
    leave(killed, true);
    wait_shared(&ports(&live), SHARDS);
    steps.push(("owned by the last one", since()));
    pause();
    let changes = rt.block_on(churn.stop()) as usize;
    // The last owner catches up (on a busy machine it may be tens of seconds behind): the
    // release is stopped once the topic stopped growing for 5 s, not while records are still
    // coming.
    settle(&bootstrap, &name);
    for r in live.drain(..) {
        leave(r, false);
    }

    let reads = read_all(&bootstrap, &name);
    let ids: HashSet<&str> = reads.iter().map(|r| r.id.as_str()).collect();
    let journal: Vec<_> = sim
        .journal()
        .into_iter()
        .filter(|e| e.resource == "pods" && e.rv > from)
        .collect();
    let lost = journal
        .iter()
        .filter(|e| !ids.contains(format!("{}/{}", e.uid, e.rv).as_str()))
        .count();
    // Per shard and partition, in offset order: a record of an older epoch after a newer one.
    let mut newest: BTreeMap<(u32, i32), u64> = BTreeMap::new();
    let mut late = 0;
    // Per shard and epoch: the first and last record's time.
    let mut spans: BTreeMap<u32, BTreeMap<u64, (i64, i64)>> = BTreeMap::new();
    for r in &reads {
        let top = newest.entry((r.shard, r.partition)).or_default();
        if r.epoch < *top {
            late += 1;
        }
        *top = (*top).max(r.epoch);
        let span = spans
            .entry(r.shard)
            .or_default()
            .entry(r.epoch)
            .or_insert((r.at, r.at));
        span.0 = span.0.min(r.at);
        span.1 = span.1.max(r.at);
    }
    let mut gaps: Vec<(i64, u32, u64, u64, i64)> = Vec::new();
    for (shard, epochs) in &spans {
        let e: Vec<(&u64, &(i64, i64))> = epochs.iter().collect();
        for w in e.windows(2) {
            let ((old, (_, last)), (new, (first, _))) = (w[0], w[1]);
            gaps.push(((first - last).max(0), *shard, *old, *new, last - began));
        }
    }
    gaps.sort_unstable();
    Run {
        changes: changes.max(journal.len()),
        lost,
        late,
        unowned: gaps.iter().map(|g| g.0).collect(),
        worst: gaps.last().map(|g| (g.1, g.2, g.3, g.4)),
        restore_ms: restores.iter().copied().fold(0.0, f64::max) * 1e3,
        revokes,
        steps,
    }
}

fn main() {
    let rate = env_or("BENCH_RATE", 5_000) as f64;
    let namespaces = env_or("BENCH_NAMESPACES", 24).max(1);
    let names: Vec<String> = (0..namespaces).map(|i| format!("team-{i}")).collect();
    let shapes = [
        (
            "fanned out (allNamespaces, one read per replica)",
            "allNamespaces: true\n    watchStrategy: clusterWide".to_string(),
            "fanned",
        ),
        (
            "per namespace (namespaces: [...])",
            format!("namespaces: [{}]", names.join(", ")),
            "listed",
        ),
    ];
    println!("churn {rate:.0} changes/s over {namespaces} namespaces, {SHARDS} shards; session timeout {} ms", SESSION.as_millis());
    let only = std::env::var("BENCH_SHAPES").ok();
    for (what, scope, label) in shapes {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|s| s == label))
        {
            continue;
        }
        let run = scenario(&scope, rate, &names, label);
        println!("{what}:");
        for (step, at) in &run.steps {
            println!("  {at:>6} ms  {step}");
        }
        println!(
            "  changes lost: {} of {}; records of an old owner after its successor's first: {}",
            run.lost, run.changes, run.late
        );
        println!(
            "  unowned time per shard and handover ({} handovers): p50 {} ms, p99 {} ms, largest {} ms (shard {:?}, from {:?} ms); largest membership restore {:.0} ms",
            run.unowned.len(),
            at_quantile(&run.unowned, 0.5),
            at_quantile(&run.unowned, 0.99),
            run.unowned.last().copied().unwrap_or_default(),
            run.worst.map(|w| (w.0, w.1, w.2)),
            run.worst.map(|w| w.3),
            run.restore_ms
        );
        println!(
            "  revoke to answer over {:.0} revokes: p50 {}, p99 {}",
            run.revokes.values().copied().fold(0.0, f64::max),
            quantile(&run.revokes, 0.5),
            quantile(&run.revokes, 0.99)
        );
    }
}
