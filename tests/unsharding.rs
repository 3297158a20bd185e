//! Turning sharding off in place: a release that ran sharded refuses to start as a single
//! leader, with leader election on (its Lease is parked: every replica would stand by forever)
//! or off (it would resume from the positions it had before sharding), and says the safe way.
//! The relay runs in-process against the simulator with the group and producer in memory.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::bed::{eventually, Bed, Relay, CHECKPOINT_NAME, CHECKPOINT_NS};
use common::stream::{bed, config, create};
use watchrelay::config::Config;
use watchrelay::producer::Producer;
use watchrelay::testing::{Memory, MemoryGroup};

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
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    create(&bed, (0..3).map(|i| format!("p{i}")));
    ran_sharded(&bed, &producer).await;
    let mut cfg = config(&bed, "");
    let le = &mut cfg.leader_election;
    le.enabled = true;
    le.retry_period_seconds = 1;
    assert_refused(single_leader(&bed, cfg, &producer).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_ran_sharded_refuses_a_single_leader_without_election() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    create(&bed, (0..3).map(|i| format!("p{i}")));
    ran_sharded(&bed, &producer).await;
    // Without election the chart grants no access to the Lease: the checkpoint ConfigMap says.
    bed.sim.deny("leases.coordination.k8s.io");
    let cfg = config(&bed, "");
    assert!(!cfg.leader_election.enabled);
    assert_refused(single_leader(&bed, cfg, &producer).await);
}
