//! Configuration changes to a sharded release: a `watchStrategy` switch keeps every key in its
//! shard and hands the members over, and a replica whose shard count is not the release's
//! refuses to start.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::bed::{eventually, shard_of, sharded, Bed, Relay};
use common::view::{consumer_view, events, pods};
use watchrelay::config::Config;
use watchrelay::testing::{Memory, MemoryGroup};
use watchrelay_sim::objects;

const SHARDS: u32 = 4;
const CHANNEL: &str = "watchNamespacedPods";

/// Two namespaces whose shards differ from the cluster-wide stream's.
fn namespaces() -> (String, String) {
    let mut apart = (0..)
        .map(|i| format!("team-{i}"))
        .filter(|ns| shard_of(SHARDS, ns) != shard_of(SHARDS, CHANNEL));
    (apart.next().unwrap(), apart.next().unwrap())
}

fn config(bed: &Bed, channels: &str) -> Config {
    sharded(bed.config(channels, ""), SHARDS)
}

/// The pods channel's streams that the shards' checkpoint ConfigMaps hold.
fn pods_recorded(bed: &Bed) -> Vec<String> {
    (0..SHARDS)
        .filter_map(|k| bed.shard_configmap(k))
        .flat_map(|cm| {
            cm["data"]
                .as_object()
                .map(|d| d.keys().cloned().collect::<Vec<_>>())
                .unwrap_or_default()
        })
        .filter(|k| k.starts_with(&format!("{CHANNEL}.")))
        .collect()
}

/// Whether every recorded pods stream is a shard's part of the collection (`wide`) or a
/// namespace's stream, and there is one.
fn recorded_as(bed: &Bed, wide: bool) -> bool {
    let ids = pods_recorded(bed);
    !ids.is_empty() && ids.iter().all(|id| id.contains("._all-s") == wide)
}

/// A rollout from per-namespace streams to one watch fanned out to the shards, with the old
/// and the new replicas side by side while pods change, then back: an object lives in its
/// namespace's shard in either shape, so no start is refused and each shard hands its members
/// over to the new shape's streams instead of retracting them. The consumer never sees a live
/// pod DELETED, and ends with the cluster each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_strategy_switch_hands_each_shards_members_over() {
    let (a, b) = namespaces();
    let bed = Bed::in_memory_serving(true, &[&a, &b]).await;
    for ns in [&a, &b] {
        for i in 0..3 {
            bed.sim
                .create("pods", Some(ns), objects::pod(ns, &format!("p{i}")))
                .unwrap();
        }
    }
    let channel = |strategy: &str| {
        format!("  - operationId: {CHANNEL}\n    namespaces: [{a}, {b}]\n    topic: pods\n    watchStrategy: {strategy}\n")
    };
    let memory = Arc::new(Memory::new());
    let group = MemoryGroup::default();
    let cluster = || pods(&bed.sim, &[&a, &b], |_| true);
    let pod_log = || -> Vec<_> {
        events(&memory)
            .into_iter()
            .filter(|r| r.topic == "pods")
            .collect()
    };
    let consumer = || consumer_view(&pod_log());
    let per_ns = config(&bed, &channel("perNamespace"));
    let wide = config(&bed, &channel("clusterWide"));

    let old = Relay::start_in(&bed, per_ns.clone(), memory.clone(), &group);
    eventually(
        || consumer() == cluster() && recorded_as(&bed, false),
        || "the per-namespace streams never relayed and checkpointed".into(),
    )
    .await;

    // The rollout's new replica runs beside the old one, and takes shards over.
    let new = Relay::start_in(&bed, wide.clone(), memory.clone(), &group);
    eventually(
        || new.ended() || new.metrics.shards_owned.get() > 0,
        || "the new replica never took a shard".into(),
    )
    .await;
    assert!(!new.ended(), "the switch was refused");
    bed.sim.delete("pods", Some(&a), "p0").unwrap();
    bed.sim
        .create("pods", Some(&b), objects::pod(&b, "p9"))
        .unwrap();
    old.stop().await;
    eventually(
        || consumer() == cluster() && recorded_as(&bed, true),
        || format!("never fanned out: {:?}", pods_recorded(&bed)),
    )
    .await;

    // And back: the fanned-out parts scatter their members to the namespaces' streams.
    let back = Relay::start_in(&bed, per_ns, memory.clone(), &group);
    eventually(
        || back.metrics.shards_owned.get() > 0,
        || "the rolled-back replica never took a shard".into(),
    )
    .await;
    new.stop().await;
    eventually(
        || consumer() == cluster() && recorded_as(&bed, false),
        || format!("never back per namespace: {:?}", pods_recorded(&bed)),
    )
    .await;
    back.stop().await;
    assert_eq!(consumer(), cluster());

    // Nothing was retracted: the one DELETED is the deleted pod's.
    let deleted: BTreeSet<String> = pod_log()
        .iter()
        .filter(|r| !r.tombstone && common::view::json(r)["type"] == "DELETED")
        .map(|r| r.key.clone())
        .collect();
    assert_eq!(deleted, BTreeSet::from([format!("{a}/p0")]));
}

/// The shard count is the release's for good: a replica configured with another count (and
/// another shards' topic, which would otherwise run a second generation beside the first)
/// refuses to start, and says how the release was made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_another_shard_count_refuses_to_start() {
    let (a, _) = namespaces();
    let bed = Bed::in_memory_serving(true, &[&a]).await;
    let channel = format!("  - operationId: {CHANNEL}\n    namespaces: [{a}]\n    topic: pods\n");
    let memory = Arc::new(Memory::new());
    let group = MemoryGroup::default();
    let cfg = config(&bed, &channel);
    let first = Relay::start_in(&bed, cfg.clone(), memory.clone(), &group);
    eventually(
        || first.metrics.shards_owned.get() == i64::from(SHARDS),
        || "the first replica never claimed its shards".into(),
    )
    .await;

    let mut resharded = cfg.clone();
    resharded.sharding.shards = SHARDS * 2;
    resharded.sharding.topic = Some(format!(
        "{}.shards-8",
        cfg.checkpoint.membership.topic("test")
    ));
    let second = Relay::start_in(&bed, resharded, memory.clone(), &MemoryGroup::default());
    let refused = second.outcome().await.expect_err("refused");
    assert!(
        refused.contains(&format!("made as `{SHARDS} ")),
        "{refused}"
    );
    // The release's own configuration still starts.
    let again = Relay::start_in(&bed, cfg, memory.clone(), &group);
    first.stop().await;
    eventually(
        || again.metrics.shards_owned.get() == i64::from(SHARDS),
        || "a replica of the release's configuration was refused".into(),
    )
    .await;
    again.stop().await;
}
