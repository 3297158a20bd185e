//! The stream tests, delivery: the relay in-process against the simulator, its records going to
//! a producer in memory that acknowledges out of order, stalls, refuses for size and fails.
//! Acknowledgements never move the checkpoint past a gap, backpressure bounds what awaits
//! acknowledgement, oversize records become references, failed deliveries replay from the
//! checkpoint and a fatal producer error makes the process unhealthy. No broker needed.
//!
//! Each test compares what a consumer holds after applying the delivered records key by key
//! with what the simulated cluster holds.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::bed::{eventually, Relay};
use common::stream::{
    assert_checkpoint_before, assert_converged, bed, cluster_view, config, create,
    first_pod_rv_after, last_pod_rv, running, start, wait_covered, wait_held, wait_until_saved,
    STREAM,
};
use common::view::{consumer_view, events, json};
use watchrelay::testing::{Lane, Memory, MemoryGroup, Order, Transactions};
use watchrelay_sim::objects;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_order_acknowledgements_never_move_the_checkpoint_past_a_gap() {
    let (bed, producer, relay) = running().await;
    wait_until_saved(&bed).await;
    let before = bed.sim.current_rv();
    producer.hold(true);
    create(&bed, (0..20).map(|i| format!("p{i}")));
    wait_held(&producer, 20).await;
    // Everything is sent, nothing acknowledged: the checkpoint stays before all of it.
    assert_checkpoint_before(&bed, first_pod_rv_after(&bed, before));
    producer.hold(false);
    producer.release(Order::Reversed);
    wait_covered(&bed).await;
    relay.stop().await;
    assert_converged(&bed, &producer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backpressure_bounds_what_awaits_acknowledgement() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    let relay = start(&bed, config(&bed, "  maxInFlightPerStream: 5\n"), &producer);
    relay.wait_up(1).await;
    producer.hold(true);
    create(&bed, (0..30).map(|i| format!("p{i}")));
    wait_held(&producer, 5).await;
    // Released in shuffled batches, never more than the bound in flight.
    for round in 0..40u64 {
        assert!(producer.held() <= 5, "{} held", producer.held());
        assert!(relay.metrics.in_flight.with_label_values(&[STREAM]).get() <= 5);
        producer.release(Order::Shuffled(round + 1));
        if bed
            .checkpoint_rv(STREAM)
            .is_some_and(|rv| rv >= last_pod_rv(&bed))
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    producer.hold(false);
    producer.release(Order::Sent);
    wait_covered(&bed).await;
    relay.stop().await;
    assert_converged(&bed, &producer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_records_become_references_in_their_place() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    // The broker refuses big records in its report; the relay's own bound catches bigger ones.
    producer.refuse_larger_than(6_000, true);
    let relay = start(&bed, config(&bed, "  maxMessageBytes: 20000\n"), &producer);
    relay.wait_up(1).await;
    let mut big = objects::pod("a", "big");
    big["metadata"]["annotations"]["blob"] = "x".repeat(8_000).into();
    let mut huge = objects::pod("a", "huge");
    huge["metadata"]["annotations"]["blob"] = "x".repeat(30_000).into();
    bed.sim.create("pods", Some("a"), big).unwrap();
    bed.sim.create("pods", Some("a"), huge).unwrap();
    create(&bed, ["small".to_string()]);
    wait_covered(&bed).await;
    relay.stop().await;
    let log = events(&producer);
    let truncated: BTreeMap<String, u64> = log
        .iter()
        .filter_map(|r| {
            Some((
                r.key.clone(),
                json(r)["watchrelay"]["truncatedBytes"].as_u64()?,
            ))
        })
        .collect();
    assert_eq!(truncated.keys().collect::<Vec<_>>(), ["a/big", "a/huge"]);
    assert!(truncated["a/big"] > 8_000 && truncated["a/huge"] > 30_000);
    assert_eq!(consumer_view(&log), cluster_view(&bed));
    assert_eq!(
        log.iter().map(|r| r.topic.as_str()).collect::<Vec<_>>(),
        vec!["pods"; log.len()],
        "oversize: trim keeps references on the channel's topic"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_refused_for_size_is_retried_record_by_record() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    producer.refuse_batches_with_larger_than(8_000);
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_up(1).await;
    producer.hold(true);
    create(&bed, (0..5).map(|i| format!("p{i}")));
    let mut big = objects::pod("a", "big");
    big["metadata"]["annotations"]["blob"] = "x".repeat(10_000).into();
    bed.sim.create("pods", Some("a"), big).unwrap();
    wait_held(&producer, 6).await;
    // The whole batch is refused for the one big record; tried alone, only it is too large.
    producer.hold(false);
    producer.release(Order::Sent);
    wait_covered(&bed).await;
    relay.stop().await;
    let log = events(&producer);
    let truncated: Vec<&str> = log
        .iter()
        .filter(|r| json(r)["watchrelay"]["truncatedBytes"].is_u64())
        .map(|r| r.key.as_str())
        .collect();
    assert_eq!(truncated, ["a/big"]);
    assert_eq!(consumer_view(&log), cluster_view(&bed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delivery_replays_from_the_checkpoint() {
    let (bed, producer, relay) = running().await;
    producer.fail_next_to("pods", 3);
    create(&bed, (0..10).map(|i| format!("p{i}")));
    relay.wait_counter("watch_restarts_total", STREAM, 1).await;
    wait_covered(&bed).await;
    relay.stop().await;
    assert_converged(&bed, &producer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_producer_error_makes_the_process_unhealthy() {
    // The simulator must outlive the relay.
    let (_bed, producer, relay) = running().await;
    assert_eq!(relay.registry.health(), Ok(()));
    producer.fail_fatally("out of order sequence number");
    eventually(
        || relay.registry.health().is_err(),
        || "a fatal producer error left the process healthy".into(),
    )
    .await;
    assert!(relay
        .registry
        .health()
        .unwrap_err()
        .contains("out of order sequence number"));
    relay.stop().await;
}

/// Under exactly once, a principal Kafka refuses the transactional ids (a missing ACL) holds
/// `/readyz` with the ACL to grant, and nothing is relayed; once it is granted, the relay
/// goes on by itself and the hold is lifted. As a single leader (its term's producer refused),
/// and sharded with the single leader's id alone refused (each shard fences it before it
/// copies what a single leader left).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_transactional_id_is_named_in_readiness_until_granted() {
    for sharded in [false, true] {
        let bed = bed(true).await;
        create(&bed, (0..3).map(|i| format!("p{i}")));
        let producer = Arc::new(Memory::new());
        let txns = Transactions::new(producer.clone());
        let mut cfg = config(&bed, "");
        cfg.kafka.delivery = watchrelay::config::Delivery::ExactlyOnce;
        let leader = format!(
            "watchrelay/{}/{}/{}",
            cfg.cluster_name, cfg.checkpoint.namespace, cfg.checkpoint.name
        );
        let relay = if sharded {
            txns.deny_id(&leader);
            let cfg = common::bed::sharded(cfg, 2);
            let lane = Lane::new(producer.clone());
            Relay::start_on_lane_with(&bed, cfg, lane, &MemoryGroup::default(), Some(&txns))
        } else {
            txns.deny(Some("watchrelay/"));
            Relay::start_with_txns(&bed, cfg, producer.clone(), Some(&txns))
        };
        let refused = || relay.metrics.transactional_ids_refused.get();
        eventually(
            || relay.registry.readiness().blocked.is_some() && refused() == 1,
            || format!("a refused transactional id left the relay ready (sharded: {sharded})"),
        )
        .await;
        let readiness = relay.registry.readiness();
        let reason = readiness.blocked.unwrap();
        assert!(!readiness.ready);
        assert!(
            reason.contains(&format!("transactional id {leader}"))
                && reason.contains("transactional ids prefixed watchrelay/"),
            "{reason}"
        );
        assert!(consumer_view(&events(&producer)).is_empty());
        txns.deny(None);
        eventually(
            || {
                relay.registry.readiness().ready
                    && refused() == 0
                    && consumer_view(&events(&producer)) == cluster_view(&bed)
            },
            || format!("still {:?}", relay.registry.readiness().blocked),
        )
        .await;
        relay.stop().await;
    }
}
