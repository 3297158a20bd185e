//! The stream tests, stopping: a clean stop drains so the final checkpoint covers everything, a
//! stop with records Kafka never acknowledges ends within its budget, and a leader deposed
//! (its Lease lost) purges its queue and checkpoints nothing more. The relay runs in-process
//! against the simulator with a producer in memory; no broker needed.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::bed::eventually;
use common::stream::{
    assert_checkpoint_before, assert_converged, bed, cluster_view, config, create,
    first_pod_rv_after, last_pod_rv, running, start, wait_covered, wait_held, wait_until_saved,
    STREAM,
};
use common::view::{consumer_view, events};
use watchrelay::producer::{Producer, Record};
use watchrelay::testing::{Memory, Order};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_drains_so_the_final_checkpoint_covers_everything() {
    let (bed, producer, relay) = running().await;
    producer.hold(true);
    create(&bed, (0..15).map(|i| format!("p{i}")));
    wait_held(&producer, 15).await;
    let stopping = tokio::spawn(relay.stop());
    producer.hold(false);
    producer.release(Order::Shuffled(7));
    stopping.await.unwrap();
    assert!(bed.checkpoint_rv(STREAM).unwrap() >= last_pod_rv(&bed));
    assert_eq!(consumer_view(&events(&producer)), cluster_view(&bed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_with_records_kafka_never_acknowledges_ends_within_its_budget() {
    let (bed, producer, relay) = running().await;
    wait_until_saved(&bed).await;
    let before = bed.sim.current_rv();
    producer.hold(true);
    create(&bed, (0..5).map(|i| format!("p{i}")));
    wait_held(&producer, 5).await;
    // Never acknowledged: the stop gives up on them within its budget, checkpointing nothing
    // past them (the next start replays them).
    let asked = Instant::now();
    relay.stop().await;
    let took = asked.elapsed();
    // The budget is the whole stop (`shutdownTimeoutSeconds`, 13 s in the bed's configuration);
    // of it, the streams wait for acknowledgements for `drain_time()` (the budget less the
    // reserves for the final checkpoint write and the Lease release: 5 s). Nothing is ever
    // acknowledged here, so the stop must have waited the whole drain time: it does not give up
    // at once. The in-memory producer's flush returns at once and the final write is quick, so
    // the stop takes about the drain time; it must end within the budget, plus a margin for this
    // test's side (the relay's runtime joining, threads scheduled late on a loaded machine), not
    // for the relay's.
    let cfg = config(&bed, "");
    let budget = Duration::from_secs(cfg.shutdown_timeout_seconds);
    const MARGIN: Duration = Duration::from_secs(1);
    assert!(
        took >= cfg.drain_time(),
        "the stop took {took:?}: it gave up before its drain time of {:?}",
        cfg.drain_time()
    );
    assert!(
        took <= budget + MARGIN,
        "the stop took {took:?}, past its budget of {budget:?} (plus {MARGIN:?})"
    );
    assert_checkpoint_before(&bed, first_pod_rv_after(&bed, before));
    // They never land: only the replay of the next start can deliver them.
    producer.purge();
    producer.hold(false);
    assert!(events(&producer).iter().all(|r| !r.key.starts_with("a/p")));
    let relay = start(&bed, config(&bed, ""), &producer);
    wait_covered(&bed).await;
    relay.stop().await;
    assert_converged(&bed, &producer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_purges_its_queue_and_checkpoints_nothing_more() {
    const LEASES: &str = "leases.coordination.k8s.io";
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    let mut cfg = config(&bed, "");
    let le = &mut cfg.leader_election;
    le.enabled = true;
    le.lease_duration_seconds = 4;
    le.renew_deadline_seconds = 3;
    le.retry_period_seconds = 1;
    let relay = start(&bed, cfg, &producer);
    relay.wait_up(1).await;
    wait_until_saved(&bed).await;
    // Records queued but not sent when the Lease is lost.
    let before = bed.sim.current_rv();
    producer.hold(true);
    create(&bed, (0..10).map(|i| format!("p{i}")));
    wait_held(&producer, 10).await;
    bed.sim.deny(LEASES);
    eventually(
        || relay.metrics.leader.get() == 0,
        || "the leader kept relaying without its Lease".into(),
    )
    .await;
    // The queue is purged: none of it is ever delivered, and nothing is checkpointed after.
    wait_held(&producer, 0).await;
    let delivered = |log: &[Record]| log.iter().filter(|r| r.key.starts_with("a/p")).count();
    assert_eq!(delivered(&events(&producer)), 0);
    assert_checkpoint_before(&bed, first_pod_rv_after(&bed, before));
    // Once it leads again it replays from its checkpoint: nothing is lost.
    producer.hold(false);
    bed.sim.allow(LEASES);
    eventually(
        || relay.metrics.leader.get() == 1,
        || "the Lease was never taken again".into(),
    )
    .await;
    wait_covered(&bed).await;
    relay.stop().await;
    assert_converged(&bed, &producer);
}
