//! One replica in the shard group. Its group client failing beyond repair: a sharded replica
//! whose group client reports a fatal error (a Kafka consumer fenced as a static member) fails
//! `/healthz`, so the platform restarts it, instead of standing in the group owning nothing
//! while it looks healthy. Its load on the API server: what it follows for the whole replica is
//! followed once, however many shards it owns. Other releases' claims it cannot read delay its
//! streams by its session timeout at most. A broker stall shorter than half the session's margin
//! holds its shards and fences nothing. The relay runs in-process against the simulator with
//! the group and producer in memory.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::bed::{eventually, Bed, Relay};
use common::stream::{bed, config, create};
use common::view::{assert_published, events, json, repeated, unpublished};
use watchrelay::config::Delivery;
use watchrelay::testing::{Lane, Memory, MemoryGroup, Transactions};

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
        || events(&producer).iter().any(|e| e.key.ends_with("/late")),
        || "the replica relayed nothing".into(),
    )
    .await;
    relay.stop().await;
}

/// A broker that answers nothing for seconds (a long pause, a saturated disk or request queue)
/// while the group moves nothing: the replica's renewals are answered late, past its ownership
/// deadline. It holds its shards meanwhile, taking and committing nothing for them, and goes on
/// once a renewal proves its ownership again: nothing is fenced, replayed or published twice,
/// in either delivery mode. (Fenced at the deadline, as before, the stream replayed from its
/// checkpoint: at least once, every change since was published twice.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_within_the_sessions_margin_holds_the_shards_and_fences_nothing() {
    for once in [false, true] {
        let bed = bed(true).await;
        create(&bed, (0..3).map(|i| format!("p{i}")));
        let mut cfg = common::bed::sharded(config(&bed, ""), 2);
        // The session's 10 s outlast it by 8 s: a hold may last half of that.
        cfg.sharding.ownership_deadline_ms = 2_000;
        if once {
            cfg.kafka.delivery = Delivery::ExactlyOnce;
        }
        let memory = Arc::new(Memory::new());
        let txns = once.then(|| Transactions::new(memory.clone()));
        let group = MemoryGroup::default();
        let lane = Lane::new(memory.clone());
        let relay = Relay::start_on_lane_with(&bed, cfg, lane, &group, txns.as_ref());
        relay.wait_up(1).await;
        let relayed = |n: usize| {
            events(&memory)
                .iter()
                .filter(|r| !r.tombstone && json(r)["type"] == "ADDED")
                .count()
                >= n
        };
        eventually(|| relayed(3), || "the pods were never relayed".into()).await;
        let from = bed.sim.current_rv();
        let stall = {
            let group = group.clone();
            tokio::task::spawn_blocking(move || group.stall(0, Duration::from_secs(4)))
        };
        // Changes before, during and after the hold (not a wait: the stall's stretch).
        let mut n = 0;
        while !stall.is_finished() {
            change(&bed, n);
            n += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        stall.await.unwrap();
        for _ in 0..3 {
            change(&bed, n);
            n += 1;
        }
        let journal = bed.journal_after("pods", None, from);
        eventually(
            || unpublished(&events(&memory), &journal).is_empty(),
            || "the changes made around the stall were never all published".into(),
        )
        .await;
        let log = events(&memory);
        assert_published(&log, &journal, "");
        let twice = repeated(&log);
        assert!(
            twice.is_empty(),
            "published twice (exactly once: {once}): {twice:?}"
        );
        assert!(
            relay.metrics.shard_holds.get() >= 1,
            "the shards were never held"
        );
        assert_eq!(relay.metrics.shard_fences.get(), 0, "exactly once: {once}");
        relay.stop().await;
    }
}

/// The `n`th change to the pods of `a`.
fn change(bed: &Bed, n: usize) {
    let patch = serde_json::json!({"metadata": {"annotations": {"n": n.to_string()}}});
    bed.sim
        .merge_patch("pods", Some("a"), &format!("p{}", n % 3), patch)
        .unwrap();
}
