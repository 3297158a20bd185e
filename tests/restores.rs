//! The fast tier: etcd restores. A restore brings every object back to the version it had at
//! the snapshot, below positions the relay already passed, and rewinds the checkpoint ConfigMap
//! with the rest of the cluster, but not Kafka. Whether the relay runs through the restore or
//! starts after it, with or without a bumped revision, a consumer ends holding the version of
//! each object the cluster holds.

mod common;

use std::sync::Arc;

use common::bed::{eventually, Bed, Relay};
use common::stream::{bed, config, create, wait_covered};
use common::view::{consumer_view_by, events, highest_view_by, pods_by, version, version_view_by};
use tokio_util::sync::CancellationToken;
use watchrelay::membership::{self, Owner};
use watchrelay::testing::Memory;
use watchrelay_sim::Snapshot;

fn start(bed: &Bed, producer: &Arc<Memory>) -> Relay {
    common::stream::start(bed, config(bed, ""), producer)
}

/// A relay over ten pods, covered; then an etcd snapshot, and changes after it that a restore
/// undoes, covered too (the relay wrote its ConfigMap again past the snapshot).
async fn relayed_past_a_snapshot(bed: &Bed, producer: &Arc<Memory>) -> (Relay, Snapshot) {
    create(bed, (0..10).map(|i| format!("p{i}")));
    let relay = start(bed, producer);
    relay.wait_up(1).await;
    wait_covered(bed).await;
    let snapshot = bed.sim.snapshot();
    diverge(bed);
    wait_covered(bed).await;
    (relay, snapshot)
}

/// Changes after the snapshot, which the restore undoes: one pod edited, one deleted, one
/// created.
fn diverge(bed: &Bed) {
    bed.sim
        .merge_patch(
            "pods",
            Some("a"),
            "p1",
            serde_json::json!({"metadata": {"labels": {"edited": "after-the-snapshot"}}}),
        )
        .unwrap();
    bed.sim.delete("pods", Some("a"), "p2").unwrap();
    create(bed, ["late".to_string()]);
}

/// Waits until a consumer holds, key by key, the version of each pod the cluster holds: one
/// applying records in partition order, and one keeping each key's highest
/// `watchrelay.version`.
async fn converged(bed: &Bed, producer: &Memory) {
    let cluster = || pods_by(&bed.sim, &["a"], |_| true, version);
    eventually(
        || {
            let log = events(producer);
            consumer_view_by(&log, version) == cluster()
                && version_view_by(&log, version) == cluster()
        },
        || {
            format!(
                "the consumer holds {:?}, the cluster {:?}",
                consumer_view_by(&events(producer), version),
                cluster()
            )
        },
    )
    .await;
}

async fn restored_while_running(watch_list: bool, bump: Option<u64>) {
    let bed = bed(watch_list).await;
    let producer = Arc::new(Memory::new());
    let (relay, snapshot) = relayed_past_a_snapshot(&bed, &producer).await;
    bed.sim.restore(&snapshot, bump);
    converged(&bed, &producer).await;
    if bump.is_some() {
        // A 410 after a bumped restore looks like any compaction: the ConfigMap that went back
        // behind what the relay wrote is what tells.
        eventually(
            || relay.metrics.history_rewinds.get() >= 1,
            || "the rewound ConfigMap was never noticed".into(),
        )
        .await;
    }
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_with_a_bumped_revision_under_a_running_relay() {
    restored_while_running(true, Some(1000)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_with_a_bumped_revision_under_paginated_lists() {
    restored_while_running(false, Some(1000)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_without_a_bump_puts_the_position_ahead_of_the_server() {
    restored_while_running(true, None).await;
}

/// What the version is for: after a restore, bumped or not, a table that keeps each key's
/// highest `watchrelay.resourceVersion` keeps the edit the restore undid, while one that keeps
/// the highest `watchrelay.version` holds what the cluster holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restore_only_the_version_orders_a_key_exactly() {
    for bump in [None, Some(1000)] {
        let bed = bed(true).await;
        let producer = Arc::new(Memory::new());
        let (relay, snapshot) = relayed_past_a_snapshot(&bed, &producer).await;
        bed.sim.restore(&snapshot, bump);
        converged(&bed, &producer).await;
        relay.stop().await;
        let cluster = pods_by(&bed.sim, &["a"], |_| true, version);
        let by_rv = highest_view_by(&events(&producer), "resourceVersion", version);
        let stale: Vec<_> = cluster
            .iter()
            .filter(|(k, v)| by_rv.get(*k) != Some(*v))
            .collect();
        assert!(
            !stale.is_empty(),
            "ordered by resourceVersion, no row went stale after a restore ({bump:?})"
        );
        assert_eq!(
            version_view_by(&events(&producer), version),
            cluster,
            "{bump:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_while_the_relay_is_down_is_told_by_the_copy_in_kafka() {
    for bump in [Some(1000), None] {
        let bed = bed(true).await;
        let producer = Arc::new(Memory::new());
        let (relay, snapshot) = relayed_past_a_snapshot(&bed, &producer).await;
        relay.stop().await;
        bed.sim.restore(&snapshot, bump);
        let relay = start(&bed, &producer);
        converged(&bed, &producer).await;
        assert_eq!(relay.metrics.history_rewinds.get(), 1, "{bump:?}");
        relay.stop().await;
    }
}

/// A term that announces objects and stops without writing its ConfigMap in between, restored
/// to a snapshot taken before it started: the counter the term raised as it started is what
/// tells, and the positions the stop writes are dropped, so the next start reconciles instead
/// of resuming past objects that no longer exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_to_before_a_term_that_never_wrote_is_told_at_its_stop() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    // Writes only when a term starts, when a position is forgotten, and at the stop.
    let quiet = || {
        let mut cfg = config(&bed, "");
        cfg.checkpoint.interval_ms = 600_000;
        common::stream::start(&bed, cfg, &producer)
    };
    create(&bed, (0..4).map(|i| format!("p{i}")));
    let relay = quiet();
    relay.wait_up(1).await;
    converged(&bed, &producer).await;
    relay.stop().await;
    let snapshot = bed.sim.snapshot();
    let relay = quiet();
    relay.wait_up(1).await;
    create(&bed, (4..8).map(|i| format!("p{i}")));
    converged(&bed, &producer).await;
    bed.sim.restore(&snapshot, None);
    relay.stop().await;
    // Revisions after the restore reach the stale positions again.
    create(&bed, (10..14).map(|i| format!("q{i}")));
    let relay = quiet();
    converged(&bed, &producer).await;
    relay.stop().await;
}

/// Versions never go back with the clock: a checkpoint ConfigMap whose era floor is ahead of
/// this replica's clock (written by a replica whose clock runs a day ahead, before a handover
/// to this one) makes every new era of its streams higher still, here the first sync's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_eras_stay_above_the_configmaps_floor_whatever_the_clock() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    let ahead = days_ahead(1);
    bed.sim
        .create(
            "configmaps",
            Some(common::bed::CHECKPOINT_NS),
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": common::bed::CHECKPOINT_NAME,
                    "namespace": common::bed::CHECKPOINT_NS,
                    "annotations": {"watchrelay.io/era-floor": ahead.to_string()},
                },
            }),
        )
        .unwrap();
    create(&bed, (0..3).map(|i| format!("p{i}")));
    let relay = start(&bed, &producer);
    wait_covered(&bed).await;
    relay.stop().await;
    let eras = eras_above(&producer, ahead);
    // And the floor is kept on the ConfigMap for the next owner.
    let floor = era_floor(&bed);
    assert!(floor >= eras[0]);
}

/// Versions never go back across a restore either, whatever the clocks: a replica whose clock
/// ran two days ahead took eras that far ahead, stamped its floor on the ConfigMap and copied it
/// into the membership topic; then a restore while the relay was down took the ConfigMap back to
/// before it existed. The copy is not rewound, so every era after the restore is above those.
/// (The other replica's traces are written here: within one process eras never go back anyway.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_rewinds_no_era_whatever_the_clock_that_took_it() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    create(&bed, (0..3).map(|i| format!("p{i}")));
    let ahead = days_ahead(2);
    let owner = Owner::new(common::bed::CHECKPOINT_NS, common::bed::CHECKPOINT_NAME);
    let copy = membership::writes_record(&bed.membership, &owner, 5, ahead);
    membership::send_all(producer.as_ref(), [copy], &CancellationToken::new())
        .await
        .unwrap();
    let relay = start(&bed, &producer);
    wait_covered(&bed).await;
    assert_eq!(
        relay.metrics.history_rewinds.get(),
        1,
        "the restore is told"
    );
    relay.stop().await;
    eras_above(&producer, ahead);
    // And the ConfigMap has its floor back.
    let floor = era_floor(&bed);
    assert!(floor > ahead);
}

/// The clock `days` ahead, in milliseconds since the Unix epoch: an era a replica whose clock
/// runs that far ahead takes.
fn days_ahead(days: u64) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    now + days * 86_400_000
}

/// The era of each record published with a `watchrelay.version`, asserted above `floor` (and
/// some record published).
fn eras_above(producer: &Memory, floor: u64) -> Vec<u64> {
    let eras: Vec<u64> = events(producer)
        .iter()
        .filter_map(|r| {
            let v: u128 = common::view::json(r)["watchrelay"]["version"]
                .as_str()?
                .parse()
                .ok()?;
            Some((v >> 64) as u64)
        })
        .collect();
    assert!(!eras.is_empty());
    assert!(
        eras.iter().all(|&e| e > floor),
        "eras {eras:?} not above the floor {floor}"
    );
    eras
}

/// The era floor stamped on the checkpoint ConfigMap.
fn era_floor(bed: &Bed) -> u64 {
    let cm = bed.checkpoint_configmap();
    cm["metadata"]["annotations"]["watchrelay.io/era-floor"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}
