//! The fast tier: a stream's members (the objects it announced) through lost and failed
//! membership records. A member too many costs an inferred DELETED; it must never cost a live
//! object on the same key.

mod common;

use std::sync::Arc;

use common::bed::{eventually, Bed, Relay};
use common::stream::{config, wait_covered, STREAM};
use common::view::{consumer_view, events, pods};
use watchrelay::producer::Producer;
use watchrelay::testing::Memory;
use watchrelay_sim::{objects, SimConfig};

async fn bed() -> Bed {
    Bed::in_memory(SimConfig::default(), &["a"]).await
}

fn start(bed: &Bed, producer: &Arc<Memory>) -> Relay {
    common::stream::start(bed, config(bed, ""), producer)
}

fn uid(bed: &Bed, name: &str) -> String {
    bed.sim.get("pods", Some("a"), name).unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The latest membership record of `uid` in the stream: `Some(true)` a member, `Some(false)`
/// a tombstone.
fn membership(producer: &Memory, uid: &str) -> Option<bool> {
    let suffix = format!("/{STREAM}/{uid}");
    producer
        .log()
        .iter()
        .rev()
        .find(|r| r.topic.starts_with("membership-") && r.key.ends_with(&suffix))
        .map(|r| !r.tombstone)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_membership_tombstone_is_produced_again() {
    let bed = bed().await;
    let producer = Arc::new(Memory::new());
    for n in ["p0", "p1"] {
        bed.sim
            .create("pods", Some("a"), objects::pod("a", n))
            .unwrap();
    }
    let relay = start(&bed, &producer);
    relay.wait_up(1).await;
    wait_covered(&bed).await;
    let old = uid(&bed, "p0");
    assert_eq!(membership(&producer, &old), Some(true));
    producer.fail_next_tombstones_to("membership-", 1);
    bed.sim.delete("pods", Some("a"), "p0").unwrap();
    wait_covered(&bed).await;
    eventually(
        || producer.topic_failures_left() == 0,
        || "the tombstone was never sent".into(),
    )
    .await;
    // Recreated under its name: a resync after a restart must end the key on the live one.
    bed.sim
        .create("pods", Some("a"), objects::pod("a", "p0"))
        .unwrap();
    wait_covered(&bed).await;
    relay.stop().await;
    assert_eq!(
        membership(&producer, &old),
        Some(false),
        "the failed tombstone was produced again before the stop"
    );
    bed.sim.compact();
    let relay = start(&bed, &producer);
    relay.wait_counter("resyncs_total", STREAM, 1).await;
    wait_covered(&bed).await;
    relay.stop().await;
    assert_eq!(
        consumer_view(&events(&producer)),
        pods(&bed.sim, &["a"], |_| true)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_while_retracting_a_changed_topic_retracts_the_rest_next_time() {
    let bed = bed().await;
    let producer = Arc::new(Memory::new());
    for i in 0..10 {
        bed.sim
            .create("pods", Some("a"), objects::pod("a", &format!("p{i}")))
            .unwrap();
    }
    let on = |topic: &str| {
        bed.config(
            &format!(
                "  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: {topic}\n"
            ),
            "",
        )
    };
    let relay = Relay::start_with(&bed, on("pods"), Some(producer.clone()));
    relay.wait_up(1).await;
    wait_covered(&bed).await;
    relay.stop().await;
    let view_of = |topic: &str| {
        let log: Vec<_> = events(&producer)
            .into_iter()
            .filter(|r| r.topic == topic)
            .collect();
        consumer_view(&log)
    };
    // Moved to another topic: Kafka writes three retractions on the old one, then the relay
    // dies.
    producer.hold(true);
    let relay = Relay::start_with(&bed, on("pods2"), Some(producer.clone()));
    eventually(
        || {
            producer.release_first(1, watchrelay::testing::Order::Sent);
            view_of("pods").len() <= 7
        },
        || "the retraction never began".into(),
    )
    .await;
    relay.kill().await;
    producer.purge();
    producer.hold(false);
    let relay = Relay::start_with(&bed, on("pods2"), Some(producer.clone()));
    relay.wait_up(1).await;
    wait_covered(&bed).await;
    eventually(
        || view_of("pods").is_empty(),
        || format!("the old topic still holds {:?}", view_of("pods").keys()),
    )
    .await;
    relay.stop().await;
    assert_eq!(view_of("pods2"), pods(&bed.sim, &["a"], |_| true));
}
