//! Syncs that outlast what the API server allows one request: an initial state streamed for
//! longer than a watch timeout, a paginated list whose continue token expires. Each completes,
//! and what a consumer holds ends as the cluster.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::bed::{eventually, Bed, Relay};
use common::view::{self, consumer_view, events, json};
use tokio_util::sync::CancellationToken;
use watchrelay::testing::{Memory, Order};
use watchrelay_sim::{objects, SimConfig};

const PODS: usize = 150;

/// `PODS` pods in namespace `a`, each carrying `pad` bytes of annotation.
async fn bed_with(watch_list: bool, pad: usize) -> Bed {
    let bed = Bed::in_memory(
        SimConfig {
            watch_list,
            ..SimConfig::default()
        },
        &["a", "other"],
    )
    .await;
    for i in 0..PODS {
        let mut pod = objects::pod("a", &format!("p{i}"));
        pod["metadata"]["annotations"] = serde_json::json!({ "pad": "x".repeat(pad) });
        bed.sim.create("pods", Some("a"), pod).unwrap();
    }
    bed
}

/// A slow consumer of records: Kafka acknowledges what is held every `every`.
fn slow_acks(producer: &Arc<Memory>, every: Duration) -> CancellationToken {
    producer.hold(true);
    let stop = CancellationToken::new();
    let (p, s) = (producer.clone(), stop.clone());
    tokio::spawn(async move {
        while !s.is_cancelled() {
            tokio::time::sleep(every).await;
            p.release(Order::Sent);
        }
        p.hold(false);
        p.release(Order::Sent);
    });
    stop
}

fn start(bed: &Bed, watch_timeout: u32, producer: &Arc<Memory>) -> Relay {
    let mut cfg = bed.config(
        "  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: pods\n",
        "  maxInFlightPerStream: 8\n",
    );
    cfg.kubernetes.watch_timeout_seconds = watch_timeout;
    Relay::start_with(bed, cfg, Some(producer.clone()))
}

/// `watch_restarts_total` of the stream for `reason`.
fn restarts(relay: &Relay, reason: &str) -> u64 {
    let text = String::from_utf8(relay.metrics.render()).unwrap();
    text.lines()
        .filter(|l| {
            l.starts_with("watchrelay_watch_restarts_total")
                && l.contains(&format!("reason=\"{reason}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

async fn wait_all_announced(producer: &Memory) {
    eventually(
        || consumer_view(&events(producer)).len() == PODS,
        || {
            format!(
                "{} of {PODS} announced",
                consumer_view(&events(producer)).len()
            )
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initial_state_streamed_for_longer_than_a_watch_timeout_completes() {
    // 15 MB of initial state, far more than the watch buffers, read at the pace of a slow
    // producer: several times the one-second timeout.
    let bed = bed_with(true, 100_000).await;
    let producer = Arc::new(Memory::new());
    let acks = slow_acks(&producer, Duration::from_millis(60));
    let relay = start(&bed, 1, &producer);
    wait_all_announced(&producer).await;
    acks.cancel();
    relay.wait_up(1).await;
    assert_eq!(restarts(&relay, "sync_interrupted"), 0, "the sync was cut");
    relay.stop().await;
    assert_eq!(
        consumer_view(&events(&producer)),
        view::pods(&bed.sim, &["a"], |_| true)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_whose_continue_token_expires_is_fetched_page_by_page_and_reconciled() {
    let bed = bed_with(false, 0).await;
    let producer = Arc::new(Memory::new());
    let acks = slow_acks(&producer, Duration::from_millis(30));
    // History is compacted all along: every continue token pinned to an older snapshot expires.
    // Some objects the first pages announce are deleted meanwhile.
    let compacting = CancellationToken::new();
    let compactor = {
        let (sim, stop) = (bed.sim.clone(), compacting.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.is_cancelled() {
                tokio::time::sleep(Duration::from_millis(40)).await;
                n += 1;
                let name = format!("tick{n}");
                sim.create("pods", Some("other"), objects::pod("other", &name))
                    .unwrap();
                if n % 5 == 0 {
                    let _ = sim.delete("pods", Some("a"), &format!("p{}", n / 5));
                }
                sim.compact();
            }
        })
    };
    let relay = start(&bed, 290, &producer);
    bed.sim.reset_requests();
    // A list completes while compaction goes on: its end is marked.
    eventually(
        || {
            events(&producer).iter().any(|r| {
                json(r)["object"]["metadata"]["annotations"]["watchrelay.io/resync-end"] == "true"
            })
        },
        || format!("{:?}", relay.registry.phases()),
    )
    .await;
    compacting.cancel();
    compactor.await.unwrap();
    acks.cancel();
    // Each list restarted at most once, to be read whole: the first one at least did.
    let (expired, resyncs) = (
        restarts(&relay, "continue_expired"),
        relay.counter("resyncs_total", "watchNamespacedPods.a"),
    );
    assert!(
        (1..=resyncs + 1).contains(&expired),
        "{expired} expiries over {resyncs} resyncs"
    );
    assert_eq!(
        bed.sim.requests().unpaged_lists,
        0,
        "no request asks for the whole collection at once, however slow the server"
    );
    let want = view::pods(&bed.sim, &["a"], |_| true);
    eventually(
        || consumer_view(&events(&producer)) == want,
        || {
            format!(
                "consumer {:?}\ncluster {want:?}",
                consumer_view(&events(&producer))
            )
        },
    )
    .await;
    relay.stop().await;
}

/// A list cut midway (a later page refused) starts over: what its first page announced is not
/// announced again (an object changed meanwhile would be: see `stream::relist`'s tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_cut_midway_starts_over_without_announcing_again() {
    let bed = bed_with(false, 0).await;
    let producer = Arc::new(Memory::new());
    let mut cfg = bed.config(
        "  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: pods\n",
        "",
    );
    cfg.kubernetes.list_page_size = 40;
    bed.sim.fail_next_pages(1);
    let relay = Relay::start_with(&bed, cfg, Some(producer.clone()));
    wait_all_announced(&producer).await;
    relay.wait_up(1).await;
    relay.stop().await;
    assert_eq!(bed.sim.pages_to_fail(), 0, "the second page was refused");
    let mut ids: Vec<String> = events(&producer)
        .iter()
        .filter_map(|r| json(r)["watchrelay"]["id"].as_str().map(str::to_string))
        .collect();
    let all = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(all, ids.len(), "every object announced once");
    assert_eq!(
        consumer_view(&events(&producer)),
        view::pods(&bed.sim, &["a"], |_| true)
    );
}

/// A sync waiting for Kafka lends its permit: with one permit, a stream whose partition stops
/// acknowledging does not keep the other stream from syncing.
async fn a_stuck_partition_leaves_other_syncs_running(watch_list: bool) {
    let bed = Bed::in_memory_serving(watch_list, &["a", "b"]).await;
    for ns in ["a", "b"] {
        for i in 0..20 {
            bed.sim
                .create("pods", Some(ns), objects::pod(ns, &format!("p{i}")))
                .unwrap();
        }
    }
    let producer = Arc::new(Memory::new());
    producer.hold_to(Some("stuck"));
    let mut cfg = bed.config(
        "  - operationId: watchNamespacedPods\n    name: stuck\n    namespaces: [a]\n    topic: stuck\n\
         \x20 - operationId: watchNamespacedPods\n    name: fine\n    namespaces: [b]\n    topic: fine\n",
        "  maxInFlightPerStream: 5\n",
    );
    cfg.kubernetes.max_concurrent_syncs = 1;
    let relay = Relay::start_with(&bed, cfg, Some(producer.clone()));
    let fine = || {
        let log: Vec<_> = events(&producer)
            .into_iter()
            .filter(|r| r.topic == "fine")
            .collect();
        consumer_view(&log)
    };
    eventually(
        || fine() == view::pods(&bed.sim, &["b"], |_| true),
        || format!("the other stream announced {} of 20", fine().len()),
    )
    .await;
    producer.hold_to(None);
    producer.release(Order::Sent);
    relay.wait_up(2).await;
    relay.stop().await;
    assert_eq!(
        consumer_view(&events(&producer)).len(),
        40,
        "both namespaces, once Kafka took the stuck records"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_partition_leaves_other_syncs_running_with_initial_events() {
    a_stuck_partition_leaves_other_syncs_running(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_partition_leaves_other_syncs_running_with_lists() {
    a_stuck_partition_leaves_other_syncs_running(false).await;
}
