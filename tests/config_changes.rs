//! Configuration changes to a sharded release that move keys from a stream in one shard to a
//! stream in another: a replica refuses to start on one while any shard still holds the old
//! stream, and the two-step way it names ends with the consumer's view equal to the cluster.

mod common;

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

/// Whether any shard's checkpoint ConfigMap still holds a stream of the pods channel.
fn pods_recorded(bed: &Bed) -> bool {
    (0..SHARDS).any(|k| {
        bed.shard_configmap(k).is_some_and(|cm| {
            cm["data"]
                .as_object()
                .is_some_and(|d| d.keys().any(|k| k.starts_with(CHANNEL)))
        })
    })
}

/// A rollout from per-namespace to cluster-wide streams: the new replica refuses while the
/// shards hold the per-namespace streams; removing the channel first, then adding it in its new
/// shape, ends with every live pod live downstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_strategy_switch_is_refused_until_the_old_streams_are_retired() {
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
    // Another channel, so that a configuration without the pods channel has one.
    let other = format!(
        "  - operationId: watchNamespacedServices\n    namespaces: [{a}]\n    topic: services\n"
    );
    let memory = Arc::new(Memory::new());
    let group = MemoryGroup::default();
    let cluster = || pods(&bed.sim, &[&a, &b], |_| true);
    let consumer = || {
        let log: Vec<_> = events(&memory)
            .into_iter()
            .filter(|r| r.topic == "pods")
            .collect();
        consumer_view(&log)
    };

    let old = Relay::start_in(
        &bed,
        config(&bed, &format!("{}{other}", channel("perNamespace"))),
        memory.clone(),
        &group,
    );
    eventually(
        || consumer() == cluster() && pods_recorded(&bed),
        || "the per-namespace streams never relayed and checkpointed".into(),
    )
    .await;

    // The rollout's new replica, cluster-wide: refused, or (without the refusal) running.
    let wide = config(&bed, &format!("{}{other}", channel("clusterWide")));
    let new = Relay::start_in(&bed, wide.clone(), memory.clone(), &group);
    eventually(
        || new.ended() || new.metrics.shards_owned.get() > 0,
        || "the new replica neither refused nor relayed".into(),
    )
    .await;
    if !new.ended() {
        // Unrefused, the rollout goes on: the old replica leaves, its shards retire their
        // per-namespace streams after the cluster-wide one announced.
        old.stop().await;
        let all = format!("{CHANNEL}._all");
        eventually(
            || !pods_recorded(&bed) || new.stream_up(&all),
            || "never retired".into(),
        )
        .await;
        eventually(|| !pods_recorded(&bed), || "never retired".into()).await;
        let view = consumer();
        new.stop().await;
        assert_eq!(view, cluster(), "live pods ended DELETED downstream");
        return;
    }
    let refused = new.outcome().await.expect_err("refused");
    assert!(refused.contains("two steps"), "{refused}");

    // Step one: the channel removed, rolled out until every shard retired its streams.
    old.stop().await;
    let without = Relay::start_in(&bed, config(&bed, &other), memory.clone(), &group);
    eventually(
        || !pods_recorded(&bed),
        || "the per-namespace streams were never retired".into(),
    )
    .await;
    without.stop().await;
    // The retirement's DELETEDs carry their shard and its owner epoch, as every record does.
    let retracted: Vec<serde_json::Value> = events(&memory)
        .iter()
        .filter(|r| r.topic == "pods" && !r.tombstone)
        .map(common::view::json)
        .filter(|v| v["type"] == "DELETED")
        .collect();
    assert!(!retracted.is_empty());
    for v in &retracted {
        assert!(
            v["watchrelay"]["ownerEpoch"].as_u64().is_some()
                && v["watchrelay"]["shard"].as_u64().is_some(),
            "a retirement's DELETED without its shard and owner epoch: {v}"
        );
    }
    // Step two: the new shape starts, and announces every pod again.
    let new = Relay::start_in(&bed, wide, memory.clone(), &group);
    eventually(
        || consumer() == cluster(),
        || format!("the consumer holds {:?}", consumer()),
    )
    .await;
    assert!(!new.ended());
    new.stop().await;
    assert_eq!(consumer(), cluster());
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
