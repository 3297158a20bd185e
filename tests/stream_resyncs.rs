//! The stream tests, positions and resyncs: a watch whose position expired (410) resyncs and
//! infers what was deleted meanwhile, re-announcing only what changed; a requested resync (delta
//! or full) is done and its request cleared; a position ahead of the server (an etcd restore)
//! leads to a relist; a watch cache lagging behind the position (504) leads to a delta resync,
//! not a full one; a stalled watch is reopened; positions the API server will not serve at
//! start are read again until it does; a sharded release takes a request set on its checkpoint
//! ConfigMap. The relay runs in-process against the simulator with a
//! producer in memory; no broker needed.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::bed::{eventually, Bed, Relay};
use common::stream::{
    assert_converged, bed, cluster_view, config, create, start, wait_covered, STREAM,
};
use common::view::{consumer_view, events, json};
use watchrelay::producer::Record;
use watchrelay::testing::{Memory, MemoryGroup};
use watchrelay_sim::objects;

async fn list_watch_gone_resync(watch_list: bool) {
    let bed = bed(watch_list).await;
    let producer = Arc::new(Memory::new());
    create(&bed, (0..12).map(|i| format!("p{i}")));
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_up(1).await;
    // Live changes on the watch.
    create(&bed, ["live".to_string()]);
    bed.sim.delete("pods", Some("a"), "p0").unwrap();
    wait_covered(&bed).await;
    assert_eq!(consumer_view(&events(&producer)), cluster_view(&bed));
    relay.stop().await;

    // While the relay is down: deletions, a change, a creation; then the history is compacted,
    // so the restarted stream's position has expired (410) and it resyncs.
    for n in ["p1", "p2", "p3"] {
        bed.sim.delete("pods", Some("a"), n).unwrap();
    }
    bed.sim
        .merge_patch(
            "pods",
            Some("a"),
            "p4",
            serde_json::json!({"metadata": {"labels": {"changed": "yes"}}}),
        )
        .unwrap();
    create(&bed, ["late".to_string()]);
    bed.sim.compact();
    let relay = start(&bed, config(&bed, ""), &producer);
    relay
        .wait_counter("synthetic_deletes_total", STREAM, 3)
        .await;
    wait_covered(&bed).await;
    relay.stop().await;

    let log = events(&producer);
    assert_eq!(consumer_view(&log), cluster_view(&bed));
    let mut inferred: Vec<String> = log
        .iter()
        .filter(|r| json(r)["watchrelay"]["synthetic"] == true)
        .map(|r| r.key.clone())
        .collect();
    inferred.sort();
    assert_eq!(inferred, ["a/p1", "a/p2", "a/p3"]);
    let ends = log
        .iter()
        .filter(|r| {
            json(r)["object"]["metadata"]["annotations"]["watchrelay.io/resync-end"] == "true"
        })
        .count();
    assert_eq!(ends, 1, "one resync, marked once");
    let reannounced = log
        .iter()
        .filter(|r| json(r)["watchrelay"]["resync"] == true && json(r)["type"] == "ADDED")
        .count();
    assert_eq!(
        reannounced, 2,
        "the resync re-announces only what changed since the position: p4 and late"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_watch_expiry_and_resync_converge_with_initial_events() {
    list_watch_gone_resync(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_watch_expiry_and_resync_converge_with_paginated_lists() {
    list_watch_gone_resync(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requested_resync_reannounces_and_the_request_is_cleared() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    create(&bed, (0..5).map(|i| format!("p{i}")));
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_up(1).await;
    wait_covered(&bed).await;
    ask_resync(&bed, "watchNamespacedPods");
    relay.wait_counter("resyncs_total", STREAM, 1).await;
    wait_resync_end(&producer).await;
    let cm = bed.checkpoint_configmap();
    assert!(cm["metadata"]["annotations"]["watchrelay.io/resync"].is_null());
    relay.stop().await;
    let log = events(&producer);
    let reannounced = log
        .iter()
        .filter(|r| json(r)["watchrelay"]["resync"] == true && json(r)["type"] == "ADDED")
        .count();
    assert_eq!(reannounced, 5);
    assert_eq!(consumer_view(&log), cluster_view(&bed));
}

/// Records a resync published as re-announcements (ADDED flagged `resync`) and inferred
/// DELETEDs, in `log`.
fn resync_records(log: &[Record]) -> (usize, usize) {
    let added = log
        .iter()
        .filter(|r| json(r)["watchrelay"]["resync"] == true && json(r)["type"] == "ADDED")
        .count();
    let inferred = log
        .iter()
        .filter(|r| json(r)["watchrelay"]["synthetic"] == true)
        .count();
    (added, inferred)
}

async fn request_resync(bed: &Bed, relay: &Relay, value: &str, resyncs: u64) {
    ask_resync(bed, value);
    relay.wait_counter("resyncs_total", STREAM, resyncs).await;
}

/// Sets the resync request `value` on the checkpoint ConfigMap, as `kubectl annotate` does.
fn ask_resync(bed: &Bed, value: &str) {
    bed.sim
        .merge_patch(
            "configmaps",
            Some(common::bed::CHECKPOINT_NS),
            common::bed::CHECKPOINT_NAME,
            serde_json::json!({"metadata": {"annotations": {"watchrelay.io/resync": value}}}),
        )
        .unwrap();
}

/// Waits until the producer holds a resync's end mark.
async fn wait_resync_end(producer: &Memory) {
    let ended = || {
        events(producer).iter().any(|r| {
            json(r)["object"]["metadata"]["annotations"]["watchrelay.io/resync-end"] == "true"
        })
    };
    eventually(ended, || "the resync never ended".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_410_over_thousands_of_objects_republishes_only_what_changed() {
    let bed = bed(false).await;
    let producer = Arc::new(Memory::new());
    create(&bed, (0..3000).map(|i| format!("p{i}")));
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_up(1).await;
    wait_covered(&bed).await;
    relay.stop().await;
    let before = events(&producer).len();

    // While the relay is down: 40 changed, 10 deleted, 5 created; the history is compacted.
    for i in 0..40 {
        bed.sim
            .merge_patch(
                "pods",
                Some("a"),
                &format!("p{i}"),
                serde_json::json!({"metadata": {"labels": {"changed": "yes"}}}),
            )
            .unwrap();
    }
    for i in 100..110 {
        bed.sim.delete("pods", Some("a"), &format!("p{i}")).unwrap();
    }
    create(&bed, (0..5).map(|i| format!("late{i}")));
    bed.sim.compact();
    let relay = start(&bed, config(&bed, ""), &producer);
    relay
        .wait_counter("resync_unchanged_total", STREAM, 1)
        .await;
    wait_covered(&bed).await;
    let unchanged = relay.counter("resync_unchanged_total", STREAM);
    relay.stop().await;

    let log = events(&producer);
    assert_eq!(consumer_view(&log), cluster_view(&bed));
    let after = &log[before..];
    assert_eq!(
        resync_records(after),
        (45, 10),
        "the changed and the new; the deleted"
    );
    let ends = after
        .iter()
        .filter(|r| {
            json(r)["object"]["metadata"]["annotations"]["watchrelay.io/resync-end"] == "true"
        })
        .count();
    assert_eq!(ends, 1, "the end is marked");
    assert_eq!(after.len(), 45 + 10 + 1, "nothing else is published");
    assert_eq!(unchanged, 3000 - 40 - 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requested_delta_resync_reannounces_only_what_changed_and_a_full_one_everything() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    create(&bed, (0..20).map(|i| format!("p{i}")));
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_up(1).await;
    wait_covered(&bed).await;
    let before = events(&producer).len();
    request_resync(&bed, &relay, "watchNamespacedPods;delta", 1).await;
    eventually(
        || events(&producer).len() > before,
        || "the delta resync never ended".into(),
    )
    .await;
    wait_covered(&bed).await;
    let log = events(&producer);
    assert_eq!(resync_records(&log[before..]), (0, 0), "nothing changed");
    assert_eq!(log.len(), before + 1, "only the resync-end marker");

    let before = log.len();
    request_resync(&bed, &relay, "all", 2).await;
    eventually(
        || events(&producer).len() > before + 20,
        || "the full resync never ended".into(),
    )
    .await;
    relay.stop().await;
    let log = events(&producer);
    assert_eq!(resync_records(&log[before..]), (20, 0), "every object");
    assert_eq!(consumer_view(&log), cluster_view(&bed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_position_ahead_of_the_server_leads_to_a_relist_not_endless_retries() {
    let bed = bed(true).await;
    create(&bed, (0..5).map(|i| format!("p{i}")));
    // A checkpoint from before an etcd restore: ahead of everything the server has.
    let mut cm = objects::configmap(common::bed::CHECKPOINT_NS, common::bed::CHECKPOINT_NAME);
    cm["data"] = serde_json::json!({ (STREAM): "{\"rv\":\"999999\"}" });
    bed.sim
        .create("configmaps", Some(common::bed::CHECKPOINT_NS), cm)
        .unwrap();
    let producer = Arc::new(Memory::new());
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_counter("resyncs_total", STREAM, 1).await;
    // The position from before the restore is replaced by the relist's.
    bed.wait_checkpoint(|c| {
        c.get(STREAM)
            .and_then(|s| s.rv.as_ref())
            .is_some_and(|r| r.parse::<u64>().unwrap() < 999_999)
    })
    .await;
    relay.stop().await;
    assert!(bed.checkpoint_rv(STREAM).unwrap() <= bed.sim.current_rv());
    assert_eq!(consumer_view(&events(&producer)), cluster_view(&bed));
}

/// A watch refused with 504 "Too large resource version" by an API server whose watch cache
/// lags (the history did not go back): the stream resyncs as a delta from its position, so
/// nothing unchanged is announced again, where an etcd restore would re-announce everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_watch_cache_is_not_taken_for_a_rewind() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    create(&bed, (0..10).map(|i| format!("p{i}")));
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_up(1).await;
    wait_covered(&bed).await;
    let before = events(&producer).len();
    bed.sim.lag_next_watches("pods", 1);
    bed.sim.drop_watches();
    relay.wait_counter("resyncs_total", STREAM, 1).await;
    create(&bed, ["late".to_string()]);
    wait_covered(&bed).await;
    let restarts = |reason: &str| {
        relay
            .metrics
            .watch_restarts
            .with_label_values(&[STREAM, reason])
            .get()
    };
    assert_eq!((restarts("behind"), restarts("rewound")), (1, 0));
    relay.stop().await;
    let log = events(&producer);
    let (again, inferred) = resync_records(&log[before..]);
    assert_eq!((again, inferred), (0, 0), "nothing re-announced");
    assert_eq!(consumer_view(&log), cluster_view(&bed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_watch_is_reopened_and_nothing_is_lost() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    let mut cfg = config(&bed, "");
    cfg.kubernetes.watch_idle_timeout_seconds = 2;
    let relay = start(&bed, cfg, &producer);
    relay.wait_up(1).await;
    // The next watch is accepted and then silent, as over a half-open connection.
    bed.sim.stall_next_watch();
    bed.sim.drop_watches();
    create(&bed, (0..10).map(|i| format!("p{i}")));
    relay.wait_counter("watch_restarts_total", STREAM, 1).await;
    wait_covered(&bed).await;
    let stalled = relay
        .metrics
        .watch_restarts
        .with_label_values(&[STREAM, "stalled"])
        .get();
    assert_eq!(stalled, 1);
    relay.stop().await;
    assert_converged(&bed, &producer);
}

/// The API server fails the relay's first reads of its checkpoints (500): the relay neither ends
/// nor starts a stream without its position; it reads them again until it gets them, and the
/// consumer ends holding what the cluster holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_the_api_server_fails_to_serve_at_start_are_read_again() {
    let bed = bed(false).await;
    let producer = Arc::new(Memory::new());
    create(&bed, (0..5).map(|i| format!("p{i}")));
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_up(1).await;
    wait_covered(&bed).await;
    relay.stop().await;
    create(&bed, ["later".to_string()]);
    bed.sim.fail_next(3, watchrelay_sim::Fault::ServerError);
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_up(1).await;
    assert_eq!(bed.sim.pending_failures(), 0, "the failures were served");
    wait_covered(&bed).await;
    relay.stop().await;
    assert_converged(&bed, &producer);
}

/// A sharded release takes a resync request set on its checkpoint ConfigMap, where `kubectl
/// annotate` sets it without sharding: a replica passes it on to every shard's ConfigMap, the
/// owner of the stream's shard resyncs, and the request is cleared. The replicas create that
/// ConfigMap and summarize there which of them claimed each shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_release_takes_a_resync_requested_on_its_checkpoint_configmap() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    create(&bed, (0..5).map(|i| format!("p{i}")));
    let cfg = common::bed::sharded(config(&bed, ""), 4);
    let group = MemoryGroup::default();
    let replicas: Vec<Relay> = (0..2)
        .map(|_| Relay::start_in(&bed, cfg.clone(), producer.clone(), &group))
        .collect();
    let announced = || {
        events(&producer)
            .iter()
            .filter(|r| json(r)["type"] == "ADDED")
            .count()
    };
    // The replicas create the checkpoint ConfigMap and say there who claimed each shard.
    let summarized = || {
        bed.sim
            .get(
                "configmaps",
                Some(common::bed::CHECKPOINT_NS),
                common::bed::CHECKPOINT_NAME,
            )
            .and_then(|cm| {
                let owners =
                    cm["metadata"]["annotations"]["watchrelay.io/shard-owners"].as_str()?;
                serde_json::from_str::<BTreeMap<u32, String>>(owners).ok()
            })
            .is_some_and(|owners| owners.len() == 4)
    };
    eventually(
        || announced() == 5 && summarized(),
        || {
            format!(
                "{} pods announced, or no summary of the shards' owners",
                announced()
            )
        },
    )
    .await;
    ask_resync(&bed, "all");
    let resyncs = || -> u64 {
        replicas
            .iter()
            .map(|r| r.counter("resyncs_total", STREAM))
            .sum()
    };
    eventually(
        || resyncs() >= 1,
        || "the stream's owner never resynced".into(),
    )
    .await;
    wait_resync_end(&producer).await;
    let cm = bed.checkpoint_configmap();
    assert!(cm["metadata"]["annotations"]["watchrelay.io/resync"].is_null());
    for r in replicas {
        r.stop().await;
    }
    let (reannounced, _) = resync_records(&events(&producer));
    assert_eq!(reannounced, 5);
    assert_converged(&bed, &producer);
}
