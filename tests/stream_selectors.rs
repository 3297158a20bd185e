//! The stream tests, selectors: a label selector changed across a restart reconciles instead of
//! resuming the other query's position, and a namespace leaving the namespace selector deletes
//! what its stream announced. The relay runs in-process against the simulator with a producer
//! in memory; no broker needed.

mod common;

use std::sync::Arc;

use common::bed::eventually;
use common::stream::{bed, create, start, wait_covered, STREAM};
use common::view::{consumer_view, events, json};
use watchrelay::testing::Memory;
use watchrelay_sim::objects;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_selector_reconciles_instead_of_resuming_another_querys_position() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    for (name, tier) in [("w0", "web"), ("w1", "web"), ("d0", "db"), ("d1", "db")] {
        let mut pod = objects::pod("a", name);
        pod["metadata"]["labels"]["tier"] = tier.into();
        bed.sim.create("pods", Some("a"), pod).unwrap();
    }
    let channel = |tier: &str| {
        format!("  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: pods\n    labelSelector: tier={tier}\n")
    };
    let relay = start(&bed, bed.config(&channel("web"), ""), &producer);
    relay.wait_up(1).await;
    wait_covered(&bed).await;
    relay.stop().await;
    // The same stream, another query: what no longer matches is deleted downstream, what now
    // matches is announced; the old position is not resumed.
    let relay = start(&bed, bed.config(&channel("db"), ""), &producer);
    relay.wait_up(1).await;
    eventually(
        || {
            consumer_view(&events(&producer))
                .keys()
                .all(|k| k.starts_with("a/d"))
        },
        || format!("{:?}", consumer_view(&events(&producer))),
    )
    .await;
    wait_covered(&bed).await;
    relay.stop().await;
    let view = consumer_view(&events(&producer));
    assert_eq!(
        view.keys().map(String::as_str).collect::<Vec<_>>(),
        ["a/d0", "a/d1"]
    );
    let inferred = events(&producer)
        .iter()
        .filter(|r| json(r)["watchrelay"]["synthetic"] == true)
        .count();
    assert_eq!(inferred, 2, "w0 and w1 left the query");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_leaving_the_selector_deletes_what_its_stream_announced() {
    let bed = bed(true).await;
    let label = |value: serde_json::Value| {
        bed.sim
            .merge_patch(
                "namespaces",
                None,
                "a",
                serde_json::json!({"metadata": {"labels": {"relay": value}}}),
            )
            .unwrap();
    };
    label("yes".into());
    create(&bed, (0..3).map(|i| format!("p{i}")));
    let producer = Arc::new(Memory::new());
    let cfg = bed.config(
        "  - operationId: watchNamespacedPods\n    namespaceSelector: relay=yes\n    topic: pods\n",
        "",
    );
    let relay = start(&bed, cfg, &producer);
    relay.wait_up(1).await;
    wait_covered(&bed).await;
    assert_eq!(consumer_view(&events(&producer)).len(), 3);
    // The namespace stops matching: its objects leave the consumer's view, flagged as inferred.
    label(serde_json::Value::Null);
    eventually(
        || consumer_view(&events(&producer)).is_empty(),
        || format!("still held: {:?}", consumer_view(&events(&producer))),
    )
    .await;
    bed.wait_checkpoint(|c| !c.contains_key(STREAM)).await;
    relay.stop().await;
    let deletes: Vec<serde_json::Value> = events(&producer)
        .iter()
        .map(json)
        .filter(|v| v["type"] == "DELETED")
        .collect();
    assert_eq!(deletes.len(), 3);
    assert!(deletes.iter().all(|v| v["watchrelay"]["synthetic"] == true));
}
