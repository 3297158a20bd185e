//! The tables tier: one DuckDB table of several resource kinds of several clusters
//! (`recipes/duckdb/objects.sql`). Two clusters (a simulator each), each relayed by a release of
//! its own `clusterName`, pods and services changing, deleted and recreated under the same
//! name while it runs; the dumps of all four topics, in one directory, make one table that must
//! hold exactly every live object of both clusters, by cluster, kind and key.
//!
//! Needs (`scripts/test.sh` provides it): `WATCHRELAY_TABLES_PYTHON`, a Python with DuckDB.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::bed::{eventually, Bed, Relay};
use common::view::{consumer_view_by, events, version};
use watchrelay::producer::Record;
use watchrelay::testing::Memory;
use watchrelay_sim::objects;

const NAMESPACES: [&str; 2] = ["a", "b"];

/// Every live pod and service of `bed`, as `cluster/kind/namespace/name -> uid@rv`.
fn live(bed: &Bed, cluster: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (resource, kind) in [("pods", "Pod"), ("services", "Service")] {
        for ns in NAMESPACES {
            for o in bed.sim.list(resource, Some(ns)) {
                let md = &o["metadata"];
                let name = md["name"].as_str().unwrap();
                out.insert(format!("{cluster}/{kind}/{ns}/{name}"), version(md));
            }
        }
    }
    out
}

/// A cluster named `cluster` relayed through churn; its records, and its live objects.
async fn relayed(cluster: &str) -> (Vec<Record>, BTreeMap<String, String>) {
    let bed = Bed::in_memory(watchrelay_sim::SimConfig::default(), &NAMESPACES).await;
    for ns in NAMESPACES {
        for i in 0..3 {
            bed.sim
                .create("pods", Some(ns), objects::pod(ns, &format!("p{i}")))
                .unwrap();
        }
        for i in 0..2 {
            bed.sim
                .create("services", Some(ns), objects::service(ns, &format!("s{i}")))
                .unwrap();
        }
    }
    let producer = Arc::new(Memory::new());
    let mut cfg = bed.config(
        "  - operationId: watchNamespacedPods\n    namespaces: [a, b]\n  - operationId: watchNamespacedServices\n    namespaces: [a, b]\n",
        "",
    );
    cfg.cluster_name = cluster.to_string();
    let relay = Relay::start_with(&bed, cfg, Some(producer.clone()));
    relay.wait_up(4).await;
    bed.sim
        .merge_patch(
            "pods",
            Some("a"),
            "p0",
            serde_json::json!({"metadata": {"labels": {"n": "1"}}}),
        )
        .unwrap();
    bed.sim.delete("services", Some("b"), "s0").unwrap();
    bed.sim.delete("pods", Some("a"), "p1").unwrap();
    bed.sim
        .create("pods", Some("a"), objects::pod("a", "p1"))
        .unwrap();
    let held = |bed: &Bed| {
        let mut want = BTreeMap::new();
        for (k, v) in live(bed, cluster) {
            let key = k.splitn(3, '/').nth(2).unwrap().to_string();
            want.insert(key, v);
        }
        want
    };
    eventually(
        || consumer_view_by(&events(&producer), version) == held(&bed),
        || "the consumer never held the cluster's objects".into(),
    )
    .await;
    relay.stop().await;
    (events(&producer), live(&bed, cluster))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_table_holds_several_kinds_of_several_clusters() {
    let dumps = tempfile::tempdir().unwrap();
    let mut want = BTreeMap::new();
    for cluster in ["east", "west"] {
        let (records, live) = relayed(cluster).await;
        want.extend(live);
        // A dump a topic, as `kcat -J` writes one.
        let mut by_topic: BTreeMap<String, String> = BTreeMap::new();
        for r in records {
            let payload = (!r.tombstone).then(|| String::from_utf8(r.value.clone()).unwrap());
            let line = serde_json::json!({"key": r.key, "payload": payload}).to_string();
            let dump = by_topic.entry(r.topic.clone()).or_default();
            dump.push_str(&line);
            dump.push('\n');
        }
        assert_eq!(by_topic.len(), 2, "a topic a kind: {:?}", by_topic.keys());
        for (topic, dump) in by_topic {
            std::fs::write(dumps.path().join(format!("{topic}.jsonl")), dump).unwrap();
        }
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let python = std::env::var("WATCHRELAY_TABLES_PYTHON")
        .expect("WATCHRELAY_TABLES_PYTHON is not set (scripts/test.sh sets it)");
    let out = std::process::Command::new(python)
        .arg(format!("{root}/tests/tables/duckdb_objects.py"))
        .arg(format!("{root}/recipes/duckdb/objects.sql"))
        .arg(dumps.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "DuckDB: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table: BTreeMap<String, String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let c: Vec<&str> = line.split(',').collect();
            (
                format!("{}/{}/{}", c[0], c[1], c[2]),
                format!("{}@{}", c[3], c[4]),
            )
        })
        .collect();
    assert_eq!(table, want, "DuckDB's table of every kind of every cluster");
}
