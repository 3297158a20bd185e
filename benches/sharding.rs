//! Scale-out: events/s and CPU per event of one and of three sharded replicas on the same load,
//! and the takeover after one of three is killed.
//!
//! 1. The simulator's history is filled with N modifications of ~4 KB pods spread over
//!    `BENCH_NAMESPACES` namespaces (default 24), before the clock starts.
//! 2. For 1 and 3 replicas, alternating for BENCH_ROUNDS rounds (default 3): a fresh release
//!    (its own topics and group) whose shard ConfigMaps hold every stream's position just
//!    before those events; that many replicas of the real binary start and share the shards
//!    while the simulator refuses pods (403: the streams retry), so that the replay begins once
//!    every replica owns its share. The clock and the CPU (summed over the replicas, read from
//!    /proc) run from the publication of the first W events to that of the N after them. Each
//!    side is reported by its median round.
//! 3. Takeover: in the last round of three replicas, one is killed (SIGKILL); the time until the
//!    two others own every shard is reported (the group's session timeout, 10 s by default,
//!    plus the claim and restore of its shards).
//!
//! Run with scripts/bench.sh sharding (it starts a broker) or set KAFKA_BOOTSTRAP_SERVERS.

mod common;

use common::{
    bench_bed, cpu_seconds, create_topics, env_or, sharded_replica, stop, total, wait_shared,
    KillOnDrop,
};
use std::time::{Duration, Instant};

use serde_json::json;
use watchrelay::config::ShardingConfig;
use watchrelay_sim::objects;

const SHARDS: u32 = 8;

/// One round's figures.
struct Round {
    rate: f64,
    cpu_us: f64,
}

fn median(rounds: &mut [Round]) -> (f64, f64) {
    rounds.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    let rate = rounds[rounds.len() / 2].rate;
    rounds.sort_by(|a, b| a.cpu_us.total_cmp(&b.cpu_us));
    (rate, rounds[rounds.len() / 2].cpu_us)
}

fn main() {
    let n = env_or("BENCH_EVENTS", 100_000);
    let namespaces = env_or("BENCH_NAMESPACES", 24).max(1);
    let rounds = env_or("BENCH_ROUNDS", 3).max(1);
    let warmup = (n / 10).clamp(1, 5_000);
    let (bootstrap, rt, sim, dir) = bench_bed(n + 500_000);
    let _runtime = rt.enter();
    let names: Vec<String> = (0..namespaces).map(|i| format!("team-{i}")).collect();
    for ns in names.iter().map(String::as_str).chain(["watchrelay"]) {
        sim.create("namespaces", None, objects::namespace(ns))
            .unwrap();
    }
    let pods = 20;
    for ns in &names {
        for i in 0..pods {
            sim.create("pods", Some(ns), objects::pod(ns, &format!("pod-{i}")))
                .unwrap();
        }
    }
    let start_rv = sim.current_rv();
    for i in 0..warmup + n {
        let ns = &names[i % namespaces];
        sim.merge_patch(
            "pods",
            Some(ns),
            &format!("pod-{}", (i / namespaces) % pods),
            json!({"metadata": {"annotations": {"bench/seq": i.to_string()}}}),
        )
        .unwrap();
    }
    println!(
        "pre-generated {warmup} + {n} pod modifications over {namespaces} namespaces, {SHARDS} shards"
    );
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    let sharding = ShardingConfig {
        enabled: true,
        shards: SHARDS,
        ..ShardingConfig::default()
    };

    let mut release = 0;
    // Starts a fresh release of `replicas` replicas resuming just before the events.
    let mut start = |replicas: usize| -> (Vec<KillOnDrop>, Vec<u16>) {
        release += 1;
        let name = format!("bench-{}-{release}", std::process::id());
        rt.block_on(create_topics(&bootstrap, &[&name]));
        let saved = json!({ "rv": start_rv.to_string() }).to_string();
        for k in 0..SHARDS {
            let data: serde_json::Map<String, serde_json::Value> = names
                .iter()
                .map(|ns| format!("watchNamespacedPods.{ns}"))
                .filter(|id| sharding.shard_of_stream(id) == k)
                .map(|id| (id, json!(saved)))
                .collect();
            let cm = ShardingConfig::configmap(&name, k);
            sim.create(
                "configmaps",
                Some("watchrelay"),
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cm, "namespace": "watchrelay"}, "data": data}),
            )
            .unwrap();
        }
        sim.deny("pods");
        let mut children = Vec::new();
        let mut ports = Vec::new();
        for r in 0..replicas {
            let (child, port) = sharded_replica(
                dir.path(),
                &kubeconfig,
                &bootstrap,
                &name,
                SHARDS,
                &names,
                r,
            );
            children.push(child);
            ports.push(port);
        }
        wait_shared(&ports, SHARDS);
        sim.allow("pods");
        (children, ports)
    };

    let published = |ports: &[u16], pids: &[u32], count: usize, since: Instant| loop {
        if total(ports, "watchrelay_events_published_total") as usize >= count {
            let cpu: f64 = pids.iter().map(|p| cpu_seconds(*p)).sum();
            return (Instant::now(), cpu);
        }
        assert!(
            since.elapsed() < Duration::from_secs(600),
            "the replicas did not publish {count} events"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut one = Vec::new();
    let mut three = Vec::new();
    let mut takeover = None;
    for round in 1..=rounds {
        for replicas in [1, 3] {
            let (children, ports) = start(replicas);
            let pids: Vec<u32> = children.iter().map(|c| c.0.id()).collect();
            let began = Instant::now();
            let (t0, cpu0) = published(&ports, &pids, warmup, began);
            let (t1, cpu1) = published(&ports, &pids, warmup + n, began);
            let r = Round {
                rate: n as f64 / (t1 - t0).as_secs_f64(),
                cpu_us: (cpu1 - cpu0) * 1e6 / n as f64,
            };
            println!(
                "round {round}: {replicas} replica(s) {:.0} events/s, {:.2} µs/event (summed over replicas)",
                r.rate, r.cpu_us
            );
            if replicas == 1 {
                one.push(r);
            } else {
                three.push(r);
            }
            let mut children = children;
            if replicas == 3 && round == rounds {
                let owned = |ports: &[u16]| total(ports, "watchrelay_shards_owned ") as u32;
                let killed = children.remove(0);
                let killed_at = Instant::now();
                drop(killed);
                while owned(&ports[1..]) < SHARDS {
                    assert!(
                        killed_at.elapsed() < Duration::from_secs(120),
                        "no takeover"
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
                takeover = Some(killed_at.elapsed());
            }
            for c in children {
                stop(c);
            }
        }
    }
    let (rate1, cpu1) = median(&mut one);
    let (rate3, cpu3) = median(&mut three);
    println!("1 replica: {rate1:.0} events/s, {cpu1:.2} µs/event");
    println!("3 replicas: {rate3:.0} events/s, {cpu3:.2} µs/event (summed)");
    println!(
        "3 vs 1 replica: {:.2}x events/s, {:.2}x CPU per event",
        rate3 / rate1,
        cpu3 / cpu1
    );
    if let Some(t) = takeover {
        println!(
            "takeover after kill -9 of 1 of 3 replicas: {:.1} s (session timeout 10 s)",
            t.as_secs_f64()
        );
    }
}
