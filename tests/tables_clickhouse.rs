//! The tables tier: the ClickHouse recipe (`recipes/clickhouse/pods.sql`) run on ClickHouse's
//! engine (chDB) over a topic the relay wrote through a chaotic run, against the simulator:
//! churn, a same-name recreate, a crash (kill -9) with Kafka having written part of what was
//! sent, a 410 with inferred DELETEDs, a namespace leaving the selector, and etcd restores
//! without and with a bumped revision. The table must then hold exactly the cluster's pods:
//! none missing, none extra, none stale (by key, uid and resourceVersion). The same records in
//! a table ordered by `watchrelay.resourceVersion` instead of `watchrelay.version` must hold a
//! stale row: the version is what makes the table exact.
//!
//! Needs `WATCHRELAY_CHDB_PYTHON`, a Python with chDB (`scripts/test.sh` installs it).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::bed::{Bed, Relay};
use common::view::{consumer_view_by, events, pods_by, version};
use watchrelay::producer::Producer;
use watchrelay::testing::{Memory, Order};
use watchrelay_sim::objects;

const NAMESPACES: [&str; 2] = ["a", "b"];

fn pod(bed: &Bed, ns: &str, name: &str) {
    bed.sim
        .create("pods", Some(ns), objects::pod(ns, name))
        .unwrap();
}

fn touch(bed: &Bed, ns: &str, name: &str, n: u32) {
    bed.sim
        .merge_patch(
            "pods",
            Some(ns),
            name,
            serde_json::json!({"metadata": {"labels": {"n": n.to_string()}}}),
        )
        .unwrap();
}

/// The cluster's pods in scope, as `key -> uid@resourceVersion`.
fn cluster(bed: &Bed) -> BTreeMap<String, String> {
    let in_scope: Vec<&str> = NAMESPACES
        .into_iter()
        .filter(|ns| {
            bed.sim
                .get("namespaces", None, ns)
                .is_some_and(|n| n["metadata"]["labels"]["relay"].as_str() == Some("yes"))
        })
        .collect();
    pods_by(&bed.sim, &in_scope, |_| true, version)
}

async fn converged(bed: &Bed, producer: &Memory) {
    common::bed::eventually(
        || consumer_view_by(&events(producer), version) == cluster(bed),
        || {
            format!(
                "the consumer never held the cluster's pods\nconsumer {:?}\ncluster  {:?}",
                consumer_view_by(&events(producer), version),
                cluster(bed)
            )
        },
    )
    .await;
}

/// The live rows of the recipe's table over `producer`'s records, as `key -> uid@rv`, the table
/// ordered by `by` (`version` or `resourceVersion`).
fn table(producer: &Memory, by: &str) -> BTreeMap<String, String> {
    let python = std::env::var("WATCHRELAY_CHDB_PYTHON")
        .expect("WATCHRELAY_CHDB_PYTHON: a Python with chDB (scripts/test.sh installs one)");
    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("records.jsonl");
    let mut lines = String::new();
    for r in events(producer) {
        let value = (!r.tombstone).then(|| String::from_utf8(r.value.clone()).unwrap());
        lines.push_str(&serde_json::json!({"key": r.key, "value": value}).to_string());
        lines.push('\n');
    }
    std::fs::write(&records, lines).unwrap();
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new(python)
        .arg(format!("{root}/tests/tables/clickhouse.py"))
        .arg(format!("{root}/recipes/clickhouse/pods.sql"))
        .arg(&records)
        .arg(by)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chDB: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let cols: Vec<&str> = line.split(',').map(|c| c.trim_matches('"')).collect();
            (cols[0].to_string(), format!("{}@{}", cols[1], cols[2]))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clickhouse_table_holds_exactly_the_clusters_pods_after_chaos() {
    let bed = Bed::in_memory(watchrelay_sim::SimConfig::default(), &NAMESPACES).await;
    for ns in NAMESPACES {
        bed.label(ns, true);
        for i in 0..6 {
            pod(&bed, ns, &format!("p{i}"));
        }
    }
    let producer = Arc::new(Memory::new());
    let cfg = bed.config(
        "  - operationId: watchNamespacedPods\n    namespaceSelector: relay=yes\n    topic: pods\n",
        "",
    );
    let start = || Relay::start_with(&bed, cfg.clone(), Some(producer.clone()));
    let relay = start();
    relay.wait_up(2).await;
    for n in 0..3 {
        touch(&bed, "a", "p0", n);
    }
    // A same-name recreate.
    bed.sim.delete("pods", Some("a"), "p1").unwrap();
    pod(&bed, "a", "p1");
    converged(&bed, &producer).await;

    // A crash mid-churn: Kafka wrote half of what was sent.
    producer.hold(true);
    touch(&bed, "a", "p2", 1);
    touch(&bed, "b", "p2", 1);
    bed.sim.delete("pods", Some("b"), "p3").unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let written = producer.held() / 2;
    producer.release_first(written, Order::Sent);
    relay.kill().await;
    producer.purge();
    producer.hold(false);

    // While it is down, deletions past the history window: a 410, then inferred DELETEDs.
    bed.sim.delete("pods", Some("a"), "p4").unwrap();
    bed.sim.delete("pods", Some("b"), "p4").unwrap();
    bed.sim.compact();
    let relay = start();
    relay.wait_up(2).await;
    converged(&bed, &producer).await;

    // A namespace leaves the selector: its pods leave the table.
    bed.label("b", false);
    converged(&bed, &producer).await;

    // etcd restores, without then with a bumped revision, each undoing changes after its
    // snapshot.
    for bump in [None, Some(1000)] {
        let snapshot = bed.sim.snapshot();
        touch(&bed, "a", "p5", 9);
        bed.sim.delete("pods", Some("a"), "p2").unwrap();
        pod(&bed, "a", "late");
        converged(&bed, &producer).await;
        // The relay wrote its ConfigMap past the snapshot: what tells it a bumped restore.
        bed.wait_pods_covered("watchNamespacedPods.a", "a").await;
        bed.sim.restore(&snapshot, bump);
        converged(&bed, &producer).await;
    }
    relay.stop().await;

    let want = cluster(&bed);
    assert_eq!(
        table(&producer, "version"),
        want,
        "ordered by watchrelay.version"
    );
    let by_rv = table(&producer, "resourceVersion");
    assert_ne!(
        by_rv, want,
        "ordered by resourceVersion, the table should have kept an edit a restore undid"
    );
}
