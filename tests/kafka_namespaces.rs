//! Namespace label selectors: streams follow namespaces in and out of the selection.

mod common;

use common::bed::{eventually, Bed, Relay};
use common::kafka;
use watchrelay_sim::objects;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_follow_namespaces_into_and_out_of_the_selector() {
    let bed = Bed::new(&[]).await;
    let mut a = objects::namespace("team-a");
    a["metadata"]["labels"] = serde_json::json!({"relay": "on"});
    bed.sim.create("namespaces", None, a).unwrap();
    bed.sim
        .create("namespaces", None, objects::namespace("team-b"))
        .unwrap();
    let topic = kafka::unique("selector");
    kafka::create_topics(&[&topic], 3).await;
    let relay = Relay::start(
        &bed,
        bed.config(&format!("  - operationId: watchNamespacedPods\n    namespaceSelector: relay=on\n    topic: {topic}\n"), ""),
    );
    relay.wait_up(1).await;
    bed.sim
        .create("pods", Some("team-a"), objects::pod("team-a", "a1"))
        .unwrap();
    bed.sim
        .create("pods", Some("team-b"), objects::pod("team-b", "b1"))
        .unwrap();

    // team-b joins, team-a leaves.
    bed.sim
        .merge_patch(
            "namespaces",
            None,
            "team-b",
            serde_json::json!({"metadata": {"labels": {"relay": "on"}}}),
        )
        .unwrap();
    relay.wait_up(2).await;
    bed.sim
        .create("pods", Some("team-b"), objects::pod("team-b", "b2"))
        .unwrap();
    bed.sim
        .merge_patch(
            "namespaces",
            None,
            "team-a",
            serde_json::json!({"metadata": {"labels": {"relay": null}}}),
        )
        .unwrap();
    eventually(
        || {
            !relay
                .registry
                .phases()
                .contains_key("watchNamespacedPods.team-a")
        },
        || "team-a's stream was not retired".into(),
    )
    .await;
    bed.sim
        .create("pods", Some("team-a"), objects::pod("team-a", "a2"))
        .unwrap();
    bed.sim
        .create("pods", Some("team-b"), objects::pod("team-b", "b3"))
        .unwrap();

    // Records of different keys sit in different partitions, read in no particular order: wait
    // for every expected key, then check nothing else came.
    let expected = ["team-a/a1", "team-b/b1", "team-b/b2", "team-b/b3"];
    let msgs = bed
        .read_until(&topic, move |m| {
            expected
                .iter()
                .all(|k| m.iter().any(|m| m.key.as_deref() == Some(*k)))
        })
        .await;
    let mut keys: Vec<&str> = msgs.iter().filter_map(|m| m.key.as_deref()).collect();
    keys.sort();
    keys.dedup();
    // b1 existed when team-b joined: its stream's list announced it.
    assert_eq!(keys, expected);
    bed.wait_checkpoint(|c| {
        !c.contains_key("watchNamespacedPods.team-a")
            && c.contains_key("watchNamespacedPods.team-b")
    })
    .await;
    relay.stop().await;
}
