//! Handovers between replicas of a sharded release, each replica with a producer of its own
//! over one log: what the old owner of a shard could not deliver by the end of its handover
//! never lands after the new owner's records.

mod common;

use std::sync::Arc;

use common::bed::{eventually, shard_of, sharded, Bed, Relay};
use common::view::{consumer_view_by, events, pods_by, version};
use watchrelay::config::Config;
use watchrelay::testing::{Lane, Memory, MemoryGroup};
use watchrelay_sim::objects;

/// A namespace of shard 1 of two: it moves to the second member of the group (dealt shard 1)
/// when it joins.
fn namespace_of_shard_1() -> String {
    (0..)
        .map(|i| format!("team-{i}"))
        .find(|ns| shard_of(2, ns) == 1)
        .expect("some namespace is in shard 1")
}

/// A bed with namespace `ns` and its pod `web`, and the pods channel over `ns` in two shards.
async fn bed_of(ns: &str) -> (Bed, Config) {
    let bed = Bed::in_memory_serving(true, &[ns]).await;
    let channel =
        format!("  - operationId: watchNamespacedPods\n    namespaces: [{ns}]\n    topic: pods\n");
    let cfg = sharded(bed.config(&channel, ""), 2);
    bed.sim
        .create("pods", Some(ns), objects::pod(ns, "web"))
        .unwrap();
    (bed, cfg)
}

fn label(bed: &Bed, ns: &str, value: &str) {
    bed.sim
        .merge_patch(
            "pods",
            Some(ns),
            "web",
            serde_json::json!({"metadata": {"labels": {"v": value}}}),
        )
        .unwrap();
}

/// Replica A owns every shard; the partition of the channel's topic stalls for A (its leader
/// stopped) with a change of `web` queued. Replica B joins and takes A's shard 1: A's handover
/// gives up on the drain, B resumes from the last checkpoint and relays the change and a newer
/// one. Then the partition comes back. The key's last record must be B's newest: A's queued
/// record was purged at the handover, not delivered after B's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_shards_undelivered_records_never_land_after_the_next_owners() {
    let ns = namespace_of_shard_1();
    let (bed, cfg) = bed_of(&ns).await;
    let memory = Arc::new(Memory::new());
    let group = MemoryGroup::default();
    let cluster = || pods_by(&bed.sim, &[&ns], |_| true, version);
    let consumer = || consumer_view_by(&events(&memory), version);

    let lane_a = Lane::new(memory.clone());
    let a = Relay::start_on_lane(&bed, cfg.clone(), lane_a.clone(), &group);
    eventually(|| consumer() == cluster(), || "A never relayed web".into()).await;

    lane_a.hold_to(Some("pods"));
    label(&bed, &ns, "2");
    eventually(|| lane_a.held() > 0, || "A never sent the change".into()).await;

    let lane_b = Lane::new(memory.clone());
    let b = Relay::start_on_lane(&bed, cfg.clone(), lane_b, &group);
    eventually(
        || consumer() == cluster(),
        || "B never relayed the change".into(),
    )
    .await;
    label(&bed, &ns, "3");
    eventually(
        || consumer() == cluster(),
        || "B never relayed the newer change".into(),
    )
    .await;

    // The stalled partition comes back.
    lane_a.release();
    let after = consumer();
    b.stop().await;
    a.stop().await;
    assert_eq!(
        after,
        cluster(),
        "a record of the old owner landed after the new owner's"
    );
}

/// A shard's checkpoint keeps moving whatever happens to the group's epochs: after the group's
/// committed offsets are lost (its epochs start again at 1, below the one stamped on the shard's
/// ConfigMap) and after the stamp is raised by hand, the owner relays and checkpoints under an
/// epoch above every one stamped, and its records carry it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epochs_stay_above_every_one_stamped_when_the_group_forgets_them() {
    let ns = namespace_of_shard_1();
    let stream = format!("watchNamespacedPods.{ns}");
    let (bed, cfg) = bed_of(&ns).await;
    let memory = Arc::new(Memory::new());
    let group = MemoryGroup::default();
    let (bed, stream) = (&bed, &stream);
    let covered = || {
        let rv = bed.journal("pods", Some(&ns)).last().map(|e| e.rv).unwrap();
        move || bed.shard_checkpoint_rv(1, stream).is_some_and(|r| r >= rv)
    };
    // Two terms: epoch 2 stamped.
    for term in 1..=2 {
        let r = Relay::start_in(bed, cfg.clone(), memory.clone(), &group);
        let covered = covered();
        eventually(
            || bed.shard_epoch(1) >= Some(term) && covered(),
            || "the first owners never checkpointed".into(),
        )
        .await;
        r.stop().await;
    }
    let before = bed.shard_epoch(1).expect("an epoch stamped");
    assert!(before >= 2);

    group.forget_epochs();
    let r = Relay::start_in(bed, cfg.clone(), memory.clone(), &group);
    label(bed, &ns, "2");
    eventually(covered(), || {
        format!(
            "no checkpoint written after the group's epochs restarted (stamp {:?})",
            bed.shard_epoch(1)
        )
    })
    .await;
    let after = bed.shard_epoch(1).unwrap();
    assert!(after > before, "epoch {after} not above {before}");

    // The stamp raised by hand deposes this owner: it fences itself and claims again above it.
    bed.sim
        .merge_patch(
            "configmaps",
            Some(common::bed::CHECKPOINT_NS),
            &format!("{}-s1", common::bed::CHECKPOINT_NAME),
            serde_json::json!({"metadata": {"annotations": {"watchrelay.io/owner-epoch": "1000"}}}),
        )
        .unwrap();
    label(bed, &ns, "3");
    eventually(covered(), || {
        format!(
            "no checkpoint written after the stamp was raised by hand (stamp {:?})",
            bed.shard_epoch(1)
        )
    })
    .await;
    assert!(bed.shard_epoch(1).unwrap() > 1000);
    r.stop().await;
    let last = events(&memory)
        .into_iter()
        .rfind(|r| r.topic == "pods")
        .expect("records");
    let epoch: u64 = last.headers.get("ce_ownerepoch").unwrap().parse().unwrap();
    assert!(epoch > 1000, "the last record carries epoch {epoch}");
}

/// A shard's ConfigMap belongs to the owner that stamped it: another replica with the same
/// epoch cannot write it, and a deposed owner takes no resync request meant for the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_stamping_owner_writes_a_shards_configmap_or_takes_its_requests() {
    use watchrelay::checkpoint::{CheckpointError, Ownership, Store};
    let bed = Bed::in_memory_serving(true, &[]).await;
    let client = bed.client(&bed.config("  - operationId: watchNodes\n", "").kubernetes);
    let name = format!("{}-s3", common::bed::CHECKPOINT_NAME);
    let store = |replica: &str, epoch: u64| {
        Store::new(client.clone(), common::bed::CHECKPOINT_NS, &name).owned(Ownership {
            replica: replica.into(),
            epoch,
        })
    };
    let plain = Store::new(client.clone(), common::bed::CHECKPOINT_NS, &name);
    assert_eq!(plain.claim_epoch("r1", 4).await.unwrap(), 4);
    let owner = store("r1", 4);
    owner.write(&Default::default()).await.unwrap();
    // Another replica under the same epoch is not the owner.
    let twin = store("r2", 4);
    assert!(matches!(
        twin.write(&Default::default()).await,
        Err(CheckpointError::Deposed { .. })
    ));
    // A newer owner stamps 5; a request set then is its to take, not the deposed one's.
    assert_eq!(plain.claim_epoch("r2", 2).await.unwrap(), 5);
    plain.request_resync("all").await.unwrap();
    assert_eq!(owner.take_resync_request().await.unwrap(), None);
    assert_eq!(
        store("r2", 5)
            .take_resync_request()
            .await
            .unwrap()
            .as_deref(),
        Some("all")
    );
}
