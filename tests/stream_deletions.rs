//! The stream tests, deletions: an object deleted and created again under its name while the
//! relay is down ends alive downstream, and with tombstones a compacted topic holds exactly the
//! live objects. The relay runs in-process against the simulator with a producer in memory; no
//! broker needed.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::stream::{
    assert_converged, bed, cluster_view, config, create, start, wait_covered, STREAM,
};
use common::view::{consumer_view, events, json, version_view_by};
use watchrelay::producer::Record;
use watchrelay::testing::Memory;

async fn recreated_under_the_same_name_while_down(watch_list: bool) {
    let bed = bed(watch_list).await;
    let producer = Arc::new(Memory::new());
    create(&bed, (0..4).map(|i| format!("p{i}")));
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_up(1).await;
    wait_covered(&bed).await;
    relay.stop().await;
    // While the relay is down p1 is deleted and created again: same name, another uid.
    bed.sim.delete("pods", Some("a"), "p1").unwrap();
    create(&bed, ["p1".to_string()]);
    bed.sim.compact();
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_counter("resyncs_total", STREAM, 1).await;
    wait_covered(&bed).await;
    relay.stop().await;
    // The old uid's DELETED comes before the new uid's ADDED on that key: the consumer ends
    // holding the new object.
    let log = events(&producer);
    assert_eq!(consumer_view(&log), cluster_view(&bed));
    // So does a consumer keeping each key's highest version: the inferred DELETED is below the
    // new object's ADDED, not level with it.
    let uid = |md: &serde_json::Value| md["uid"].as_str().unwrap().to_string();
    assert_eq!(version_view_by(&log, uid), cluster_view(&bed));
    let p1: Vec<(String, String)> = log
        .iter()
        .filter(|r| r.key == "a/p1")
        .map(|r| {
            let v = json(r);
            (
                v["type"].as_str().unwrap().to_string(),
                v["object"]["metadata"]["uid"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let (last_type, last_uid) = p1.last().unwrap();
    assert_eq!(last_type, "ADDED");
    assert_eq!(
        Some(last_uid.as_str()),
        cluster_view(&bed).get("a/p1").map(String::as_str)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_recreated_under_its_name_while_down_ends_alive_with_initial_events() {
    recreated_under_the_same_name_while_down(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_recreated_under_its_name_while_down_ends_alive_with_lists() {
    recreated_under_the_same_name_while_down(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tombstones_a_compacted_topic_holds_exactly_the_live_objects() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    let channel = "  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: pods\n    tombstones: true\n";
    create(&bed, (0..4).map(|i| format!("p{i}")));
    let relay = start(&bed, bed.config(channel, ""), &producer);
    relay.wait_up(1).await;
    bed.sim.delete("pods", Some("a"), "p0").unwrap();
    wait_covered(&bed).await;
    relay.stop().await;
    // A deletion while the relay is down, found by a resync: inferred, and tombstoned too.
    bed.sim.delete("pods", Some("a"), "p1").unwrap();
    bed.sim.compact();
    let relay = start(&bed, bed.config(channel, ""), &producer);
    relay
        .wait_counter("synthetic_deletes_total", STREAM, 1)
        .await;
    wait_covered(&bed).await;
    relay.stop().await;
    let log = events(&producer);
    // Each DELETED is followed by a tombstone on its key.
    for (i, r) in log.iter().enumerate() {
        if !r.tombstone && json(r)["type"] == "DELETED" {
            let next = log[i + 1..].iter().find(|n| n.key == r.key).unwrap();
            assert!(next.tombstone, "{}: no tombstone after its DELETED", r.key);
        }
    }
    // What compaction keeps (the last record per key, a tombstone meaning gone) is the cluster.
    let mut compacted: BTreeMap<&str, &Record> = BTreeMap::new();
    for r in log.iter().filter(|r| r.key.starts_with("a/")) {
        compacted.insert(&r.key, r);
    }
    let live: Vec<&str> = compacted
        .iter()
        .filter(|(_, r)| !r.tombstone)
        .map(|(k, _)| *k)
        .collect();
    assert_eq!(live, ["a/p2", "a/p3"]);
    assert_converged(&bed, &producer);
}
