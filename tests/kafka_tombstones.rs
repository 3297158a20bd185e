//! Tombstones through a real broker: after a DELETED, the same key with a null value.

mod common;

use common::bed::{Bed, Relay};
use common::kafka;
use watchrelay_sim::objects;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_object_is_followed_by_a_null_record_on_its_key() {
    let bed = Bed::new(&["a"]).await;
    // Created by the relay, compacted for its tombstones.
    let topic = kafka::unique("tombstones");
    let cfg = bed.config(
        &format!("  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: {topic}\n    tombstones: true\n"),
        "",
    );
    let relay = Relay::start(&bed, cfg);
    relay.wait_up(1).await;
    bed.sim
        .create("pods", Some("a"), objects::pod("a", "gone"))
        .unwrap();
    bed.sim.delete("pods", Some("a"), "gone").unwrap();
    let msgs = bed
        .read_until(&topic, |m| {
            m.iter()
                .any(|m| m.key.as_deref() == Some("a/gone") && m.raw_len == 0)
        })
        .await;
    relay.stop().await;
    let on_key: Vec<_> = msgs
        .iter()
        .filter(|m| m.key.as_deref() == Some("a/gone"))
        .collect();
    let types: Vec<&str> = on_key
        .iter()
        .map(|m| m.value["type"].as_str().unwrap_or("null"))
        .collect();
    assert_eq!(types, ["ADDED", "DELETED", "null"]);
    assert!(on_key[2].value.is_null() && on_key[2].headers.is_empty());
}
