//! One replica in the shard group. Its group client failing beyond repair: a sharded replica
//! whose group client reports a fatal error (a Kafka consumer fenced as a static member) fails
//! `/healthz`, so the platform restarts it, instead of standing in the group owning nothing
//! while it looks healthy. Its load on the API server: what it follows for the whole replica is
//! followed once, however many shards it owns. Other releases' claims it cannot read delay its
//! streams by its session timeout at most. The relay runs in-process against the simulator
//! with the group and producer in memory.

mod common;

use std::sync::Arc;

use common::bed::{eventually, Bed, Relay};
use common::stream::{bed, config, create};
use watchrelay::testing::{Memory, MemoryGroup};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_error_of_the_shard_groups_client_fails_health() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    create(&bed, (0..3).map(|i| format!("p{i}")));
    let cfg = common::bed::sharded(config(&bed, ""), 2);
    let group = MemoryGroup::default();
    let relay = Relay::start_in(&bed, cfg, producer.clone(), &group);
    relay.wait_up(1).await;
    assert!(relay.registry.health().is_ok());
    group.fail_fatally("FencedInstanceId: fenced by another member with the same instance id");
    eventually(
        || {
            relay
                .registry
                .health()
                .is_err_and(|e| e.contains("shard group") && e.contains("FencedInstanceId"))
        },
        || format!("health: {:?}", relay.registry.health()),
    )
    .await;
    relay.stop().await;
}

/// A replica owning sixteen shards follows the namespaces its selector matches once, not once
/// per shard, and relays every namespace's stream from that one watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_follows_each_selector_once_whatever_it_owns() {
    let namespaces = ["a", "b", "c", "d", "e", "f"];
    let bed = Bed::in_memory(watchrelay_sim::SimConfig::default(), &namespaces).await;
    for ns in namespaces {
        bed.label(ns, true);
    }
    let cfg = common::bed::sharded(
        bed.config(
            "  - operationId: watchNamespacedPods\n    namespaceSelector: relay=yes\n    topic: pods\n",
            "",
        ),
        16,
    );
    let producer = Arc::new(Memory::new());
    let group = MemoryGroup::default();
    let relay = Relay::start_in(&bed, cfg, producer, &group);
    relay.wait_up(namespaces.len()).await;
    bed.label("a", false);
    eventually(
        || {
            !relay
                .registry
                .phases()
                .contains_key("watchNamespacedPods.a")
        },
        || "the namespace that left kept its stream".into(),
    )
    .await;
    // One list counts them when the replica starts (deciding the selector's shape), one list
    // and one watch follow them.
    let asked = bed.sim.requests_for("namespaces");
    assert_eq!(
        (asked.get("list"), asked.get("watch")),
        (Some(&2), Some(&1)),
        "namespace requests: {asked:?}"
    );
    relay.stop().await;
}

/// Other releases' claims that cannot be read (a partition of the single-leader membership
/// topic without a leader) keep a restarting sharded replica's streams waiting for its session
/// timeout at most: then they start unchecked against them, rather than never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_claims_delay_a_replica_by_its_session_only() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    create(&bed, (0..3).map(|i| format!("p{i}")));
    let mut cfg = common::bed::sharded(config(&bed, ""), 2);
    cfg.sharding.session_timeout_ms = 6_000;
    let single = cfg.checkpoint.membership.topic(&cfg.cluster_name);
    let group = MemoryGroup::default();
    // The shards' first run (their first owner copies what a single leader left, which needs
    // that topic).
    let relay = Relay::start_in(&bed, cfg.clone(), producer.clone(), &group);
    relay.wait_up(1).await;
    relay.stop().await;
    producer.fail_replays_of(Some(&single));
    let relay = Relay::start_in(&bed, cfg, producer.clone(), &group);
    relay.wait_up(1).await;
    create(&bed, ["late".to_string()]);
    eventually(
        || {
            common::view::events(&producer)
                .iter()
                .any(|e| e.key.ends_with("/late"))
        },
        || "the replica relayed nothing".into(),
    )
    .await;
    relay.stop().await;
}
