//! Handover under load: how long a shard's revoke takes to be answered (its term stopped,
//! drained its own records, wrote its positions) while the replica's other shards keep
//! relaying, over many rebalances.
//!
//! Two replicas of the real binary share the shards of a release whose pods change at
//! `BENCH_RATE` per second (default 5,000) over `BENCH_NAMESPACES` namespaces (default 24).
//! A third replica joins and, once the shards are shared by three, leaves (SIGTERM): each join
//! revokes shards from the two while their other shards keep relaying (a partial revoke under
//! load), each leave hands the third's over. That is repeated `BENCH_REBALANCES` times (default
//! 10). The two steady replicas' `shard_handover_seconds` histograms (revoke to answer, per
//! revoke) give the p50 and p99 of their handovers (each figure its bucket's upper bound), with
//! the time each leave took to give the two every shard again, the events per second they
//! published meanwhile and how many of their handovers had to purge.
//!
//! Run with scripts/bench.sh handover (it starts a broker) or set KAFKA_BOOTSTRAP_SERVERS.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{bench_bed, create_topics, env_or, scrape, sharded_replica, stop, total, wait_shared};
use watchrelay_sim::{objects, ChurnSpec};

const SHARDS: u32 = 16;

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

fn main() {
    let rate = env_or("BENCH_RATE", 5_000) as f64;
    let namespaces = env_or("BENCH_NAMESPACES", 24).max(1);
    let rebalances = env_or("BENCH_REBALANCES", 10).max(1);
    let (bootstrap, rt, sim, dir) = bench_bed(200_000);
    let _runtime = rt.enter();
    let names: Vec<String> = (0..namespaces).map(|i| format!("team-{i}")).collect();
    for ns in names.iter().map(String::as_str).chain(["watchrelay"]) {
        sim.create("namespaces", None, objects::namespace(ns))
            .unwrap();
    }
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    let name = format!("handover-{}", std::process::id());
    rt.block_on(create_topics(&bootstrap, &[&name]));
    let replica = |r: usize| {
        sharded_replica(
            dir.path(),
            &kubeconfig,
            &bootstrap,
            &name,
            SHARDS,
            &names,
            r,
        )
    };
    let (a, pa) = replica(0);
    let (b, pb) = replica(1);
    wait_shared(&[pa, pb], SHARDS);
    let churn = sim.start_churn(ChurnSpec {
        rate_per_sec: rate,
        namespaces: names.clone(),
        resources: vec!["pods".into()],
        max_objects_per_kind: 20,
        total_events: None,
    });
    // Not a wait: the churn reaches its pace before the first rebalance.
    std::thread::sleep(Duration::from_secs(3));
    let published = |ports: &[u16]| total(ports, "watchrelay_events_published_total");
    let began = Instant::now();
    let before = published(&[pa, pb]);
    let mut all: BTreeMap<u64, f64> = BTreeMap::new();
    for round in 0..rebalances {
        let (c, pc) = replica(2 + round);
        wait_shared(&[pa, pb, pc], SHARDS);
        let was = Instant::now();
        stop(c);
        wait_shared(&[pa, pb], SHARDS);
        println!(
            "rebalance {}: a third replica joined and left; back to two in {:.1} s",
            round + 1,
            was.elapsed().as_secs_f64()
        );
    }
    let after = published(&[pa, pb]);
    let elapsed = began.elapsed().as_secs_f64();
    for port in [pa, pb] {
        for (bound, n) in buckets(port) {
            *all.entry(bound).or_default() += n;
        }
    }
    let purges = total(&[pa, pb], "watchrelay_shard_handover_purges_total ");
    let changes = rt.block_on(churn.stop());
    let count = all.values().copied().fold(0.0, f64::max);
    println!(
        "churn {rate:.0}/s ({changes} changes); the two steady replicas published {:.0} events/s meanwhile",
        (after - before) / elapsed
    );
    println!(
        "handover (revoke to answer) over {count:.0} revokes of {rebalances} joins and leaves: p50 {}, p99 {}; handovers that purged: {purges:.0}",
        quantile(&all, 0.5),
        quantile(&all, 0.99)
    );
    stop(a);
    stop(b);
}
