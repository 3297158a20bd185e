//! Moving between a single leader and sharding in place. Turning sharding off: a release that
//! ran sharded refuses to start as a single leader, with leader election on (its Lease is
//! parked: every replica would stand by forever) or off (it would resume from the positions it
//! had before sharding), and says the safe way. Turning it on for a release that ran without
//! leader election: the single leader stops once the Lease is parked, and the shards copy only
//! the state it left. The relay runs in-process against the simulator with the group and
//! producer in memory.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::bed::{eventually, Bed, Relay, CHECKPOINT_NAME, CHECKPOINT_NS};
use common::stream::{bed, config, create};
use common::view::{self, consumer_view, events};
use watchrelay::config::Config;
use watchrelay::producer::Producer;
use watchrelay::testing::{Memory, MemoryGroup};

/// A bed with pods p0, p1 and p2 in namespace `a`, and a producer in memory.
async fn three_pods() -> (Bed, Arc<Memory>) {
    let bed = bed(true).await;
    create(&bed, (0..3).map(|i| format!("p{i}")));
    (bed, Arc::new(Memory::new()))
}

/// Runs a sharded release until its shards' owners are recorded, then stops it.
async fn ran_sharded(bed: &Bed, producer: &Arc<Memory>) {
    let cfg = common::bed::sharded(config(bed, ""), 2);
    let group = MemoryGroup::default();
    let relay = Relay::start_in(bed, cfg, producer.clone(), &group);
    relay.wait_up(1).await;
    eventually(
        || {
            bed.sim
                .get("configmaps", Some(CHECKPOINT_NS), CHECKPOINT_NAME)
                .is_some_and(|cm| {
                    cm["metadata"]["annotations"]["watchrelay.io/shard-owners"].is_string()
                })
        },
        || "the shards' owners were never recorded".into(),
    )
    .await;
    relay.stop().await;
}

/// How a single-leader relay of `cfg` ends by itself (within a minute).
async fn single_leader(bed: &Bed, cfg: Config, producer: &Arc<Memory>) -> Result<(), String> {
    let relay = watchrelay::Relay::new(cfg.clone(), bed.client(&cfg.kubernetes))
        .with_producer(producer.clone() as Arc<dyn Producer>, producer.clone());
    let shutdown = relay.shutdown();
    let ended = tokio::time::timeout(Duration::from_secs(60), relay.run()).await;
    shutdown.cancel();
    ended
        .expect("a release that ran sharded was not refused within a minute")
        .map_err(|e| e.to_string())
}

fn assert_refused(outcome: Result<(), String>) {
    let e = outcome.expect_err("refused");
    assert!(
        e.contains("ran sharded")
            && e.contains("sharding.enabled")
            && e.contains("checkpoint.name"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_ran_sharded_refuses_a_single_leader_with_election() {
    let (bed, producer) = three_pods().await;
    ran_sharded(&bed, &producer).await;
    let mut cfg = config(&bed, "");
    let le = &mut cfg.leader_election;
    le.enabled = true;
    le.retry_period_seconds = 1;
    assert_refused(single_leader(&bed, cfg, &producer).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_ran_sharded_refuses_a_single_leader_without_election() {
    let (bed, producer) = three_pods().await;
    ran_sharded(&bed, &producer).await;
    // Without election the chart grants no access to the Lease: the checkpoint ConfigMap says.
    bed.sim.deny("leases.coordination.k8s.io");
    let cfg = config(&bed, "");
    assert!(!cfg.leader_election.enabled);
    assert_refused(single_leader(&bed, cfg, &producer).await);
}

/// An etcd restore to before sharding takes the Lease, the shards' ConfigMaps and the release
/// ConfigMap's annotations back to then, but not Kafka: the shards' members are still live in
/// their topic, and say the release ran sharded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_to_before_sharding_is_refused_from_what_kafka_holds() {
    let (bed, producer) = three_pods().await;
    ran_sharded(&bed, &producer).await;
    let lease = config(&bed, "").leader_election.name;
    bed.sim
        .delete("leases.coordination.k8s.io", Some(CHECKPOINT_NS), &lease)
        .unwrap();
    for cm in bed.sim.list("configmaps", Some(CHECKPOINT_NS)) {
        let name = cm["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if name.starts_with(&format!("{CHECKPOINT_NAME}-s")) {
            bed.sim
                .delete("configmaps", Some(CHECKPOINT_NS), &name)
                .unwrap();
        }
    }
    bed.sim
        .merge_patch(
            "configmaps",
            Some(CHECKPOINT_NS),
            CHECKPOINT_NAME,
            serde_json::json!({"metadata": {"annotations": {
                "watchrelay.io/sharding": null,
                "watchrelay.io/shard-owners": null,
            }}}),
        )
        .unwrap();
    let mut cfg = config(&bed, "");
    cfg.sharding.topic = common::bed::sharded(config(&bed, ""), 2).sharding.topic;
    let e = single_leader(&bed, cfg, &producer)
        .await
        .expect_err("refused");
    assert!(
        e.contains("ran sharded") && e.contains("shards' membership topic"),
        "{e}"
    );
}

/// A single leader without election never held a Lease to wait for: once sharded replicas of
/// its release start, it stops, and they copy its state only after it did, so the two never
/// relay side by side and nothing it relayed last is missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_without_election_hands_its_state_to_the_shards_it_turns_into() {
    let (bed, producer) = three_pods().await;
    let cfg = config(&bed, "");
    assert!(!cfg.leader_election.enabled);
    let single = Relay::start_with(&bed, cfg.clone(), Some(producer.clone()));
    single.wait_up(1).await;
    let group = MemoryGroup::default();
    let sharded = Relay::start_in(&bed, common::bed::sharded(cfg, 2), producer.clone(), &group);
    // Changes while both run: whoever relays them, the last word on each key is right.
    create(&bed, (3..6).map(|i| format!("p{i}")));
    bed.sim.delete("pods", Some("a"), "p0").unwrap();
    let e = single.outcome().await.expect_err("the single leader stops");
    assert!(e.contains("started sharded"), "{e}");
    sharded.wait_up(1).await;
    create(&bed, ["p6".to_string()]);
    bed.sim.delete("pods", Some("a"), "p1").unwrap();
    eventually(
        || consumer_view(&events(&producer)) == view::pods(&bed.sim, &["a"], |_| true),
        || "the consumer's view never matched the cluster".into(),
    )
    .await;
    sharded.stop().await;
}
