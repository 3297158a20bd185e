//! One watch, many shards: a channel read over one collection in a sharded release is read
//! once per replica, each shard relaying its part, and its objects move with their shards at
//! a handover.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::bed::{eventually, sharded, wait_for, Bed, Relay, CHECKPOINT_NAME, CHECKPOINT_NS};
use common::view::{assert_published, consumer_view_by, events, json, pods_by, repeated, version};
use watchrelay::config::{Config, Delivery};
use watchrelay::metrics::Metrics;
use watchrelay::testing::{Lane, Memory, MemoryGroup, Order, Transactions};
use watchrelay::RelayError;
use watchrelay_sim::{objects, ChurnSpec, SimConfig};

const NAMESPACES: [&str; 8] = ["a", "b", "c", "d", "e", "f", "g", "h"];

/// Replica A relays every shard, from one watch of the collection; B joins and takes shards
/// over, reading the collection once for all of them; the pods change on both sides; then A
/// leaves and B relays everything. At each step the consumer's view is the cluster's, and
/// every record came from the shard of its namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_is_read_once_per_replica_and_dealt_to_its_shards() {
    let bed = Bed::in_memory_serving(true, &NAMESPACES).await;
    for ns in NAMESPACES {
        for name in ["p1", "p2"] {
            bed.sim
                .create("pods", Some(ns), objects::pod(ns, name))
                .unwrap();
        }
    }
    let channel = "  - operationId: watchNamespacedPods\n    allNamespaces: true\n    watchStrategy: clusterWide\n    topic: pods\n";
    let cfg = sharded(bed.config(channel, ""), 4);
    let memory = Arc::new(Memory::new());
    let group = MemoryGroup::default();
    let cluster = || pods_by(&bed.sim, &NAMESPACES, |_| true, version);
    let consumer = || consumer_view_by(&events(&memory), version);

    let a = Relay::start_on_lane(&bed, cfg.clone(), Lane::new(memory.clone()), &group);
    eventually(
        || consumer() == cluster(),
        || "A never relayed the pods".into(),
    )
    .await;
    // Four shards, one watch and one list.
    assert_eq!(a.metrics.fanout_watches.get(), 1);
    assert_eq!(a.metrics.fanout_lists.get(), 1);

    let b = Relay::start_on_lane(&bed, cfg.clone(), Lane::new(memory.clone()), &group);
    eventually(
        || b.metrics.shards_owned.get() > 0,
        || "B never took a shard".into(),
    )
    .await;
    change_p1(&bed, "2");
    eventually(
        || consumer() == cluster(),
        || "the change never reached the consumer".into(),
    )
    .await;
    let from_b = published(&b.metrics);
    assert!(from_b > 0.0, "B published nothing of its shards");
    assert!(
        b.metrics.fanout_watches.get() <= 2,
        "B watched the collection {} times",
        b.metrics.fanout_watches.get()
    );

    a.stop().await;
    bed.sim.delete("pods", Some("a"), "p2").unwrap();
    change_p1(&bed, "3");
    eventually(
        || consumer() == cluster(),
        || "B never relayed A's shards".into(),
    )
    .await;
    b.stop().await;

    // Each record from its namespace's shard.
    let sharding = &cfg.sharding;
    let mut shards = BTreeSet::new();
    for r in events(&memory) {
        let Some((ns, _)) = r.key.split_once('/') else {
            continue;
        };
        let shard: u32 = r.headers.get("ce_shard").unwrap().parse().unwrap();
        assert_eq!(shard, sharding.shard_of(ns), "record of {}", r.key);
        shards.insert(shard);
    }
    assert!(shards.len() > 1, "one shard relayed everything: {shards:?}");
}

/// A replica that owns many shards at once reads the collection once for their first sync,
/// then publishes every change from that one read on. Each shard's stream saves its new era
/// before it reads, and a replica's checkpoint writers take turns; were those writes paced,
/// the streams would join the read one turn apart, and the read would begin before most had
/// joined and be read again for the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_owning_many_shards_reads_the_collection_once_to_sync_them() {
    const SHARDS: i64 = 32;
    let bed = Bed::in_memory_serving(true, &NAMESPACES).await;
    pods_p1(&bed);
    let channel = "  - operationId: watchAllPods\n    topic: pods\n";
    let cfg = sharded(bed.config(channel, ""), SHARDS as u32);
    let memory = Arc::new(Memory::new());
    let group = MemoryGroup::default();
    let a = Relay::start_on_lane(&bed, cfg, Lane::new(memory.clone()), &group);
    owns(&a, Some(SHARDS), "A never owned the shards").await;
    eventually(
        || {
            consumer_view_by(&events(&memory), version)
                == pods_by(&bed.sim, &NAMESPACES, |_| true, version)
        },
        || "A never relayed the pods".into(),
    )
    .await;
    a.wait_up(SHARDS as usize).await;
    assert_eq!(
        a.metrics.fanout_lists.get(),
        1,
        "the collection was read more than once for {SHARDS} shards claimed together"
    );
    changes_all_reach_the_consumer(&bed, &memory, 3).await;
    assert_eq!(
        a.metrics.fanout_lists.get(),
        1,
        "a live change was relisted"
    );
    a.stop().await;
}

/// Where the API server filters by shard (the simulator serving `shardSelector` as
/// kube-apiserver with `ShardedListAndWatch` on), each replica is sent its shards' pods only,
/// before and after a second replica takes shards over; a namespace created later is taken in
/// by its shard's relist. The consumer's view is the cluster's throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_filters_by_shard_sends_each_replica_its_shards_only() {
    let (bed, cfg) = filtering_bed().await;
    let memory = Arc::new(Memory::new());
    let group = MemoryGroup::default();
    let mut namespaces: Vec<&str> = NAMESPACES.to_vec();
    let cluster = |namespaces: &[&str]| pods_by(&bed.sim, namespaces, |_| true, version);
    let consumer = || consumer_view_by(&events(&memory), version);
    let other = |m: &Metrics| m.fanout_objects.with_label_values(&["other"]).get();

    let a = Relay::start_on_lane(&bed, cfg.clone(), Lane::new(memory.clone()), &group);
    eventually(
        || consumer() == cluster(&namespaces),
        || "A never relayed the pods".into(),
    )
    .await;
    assert_eq!(a.metrics.fanout_server_filtered.get(), 1);
    assert_eq!(
        other(&a.metrics),
        0,
        "the server sent A pods of no shard of its"
    );

    let a_watches = a.metrics.fanout_watches.get();
    let b = Relay::start_on_lane(&bed, cfg.clone(), Lane::new(memory.clone()), &group);
    eventually(
        || b.metrics.shards_owned.get() > 0 && a.metrics.shards_owned.get() < 4,
        || "B never took a shard".into(),
    )
    .await;
    // A pod `name` in every namespace, then the consumer holds it.
    let add_everywhere = |name: &'static str| {
        for ns in NAMESPACES {
            bed.sim
                .create("pods", Some(ns), objects::pod(ns, name))
                .unwrap();
        }
        eventually(
            move || consumer() == cluster(&NAMESPACES),
            move || format!("the pods {name} never reached the consumer"),
        )
    };
    add_everywhere("p2").await;
    // Steady: A's reads left B's shards out once they moved, and B's, read whole from A's
    // positions (older than B's first list of namespaces), were narrowed to its shards.
    eventually(
        || b.metrics.fanout_server_filtered.get() == 1,
        || "B's reads were never narrowed to its shards".into(),
    )
    .await;
    // A's watch, reopened a moment after its parts of B's shards left, for its own only.
    eventually(
        || a.metrics.fanout_watches.get() > a_watches,
        || "A's watch was never narrowed to its shards".into(),
    )
    .await;
    let before = (other(&a.metrics), other(&b.metrics));
    add_everywhere("p3").await;
    assert_eq!(
        (other(&a.metrics), other(&b.metrics)),
        before,
        "the server sent a replica another's pods"
    );
    assert!(published(&b.metrics) > 0.0, "B published nothing");

    // A namespace the replicas did not know when their reads began.
    bed.sim
        .create("namespaces", None, objects::namespace("late"))
        .unwrap();
    bed.sim
        .create("pods", Some("late"), objects::pod("late", "p1"))
        .unwrap();
    namespaces.push("late");
    eventually(
        || consumer() == cluster(&namespaces),
        || "the late namespace's pod never reached the consumer".into(),
    )
    .await;
    a.stop().await;
    b.stop().await;
}

/// The records a replica published, every stream together.
/// History, not only the final view: while pods change all the time, shards move between
/// replicas (B joins, A is killed, C joins and leaves), and each new owner of a shard resumes
/// its part where the old owner's checkpoint stopped, through its replica's shared watch, instead
/// of listing: every change the API server made after the relay started has its record, and
/// the consumer's view ends as the cluster's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handovers_publish_every_change_the_server_holds() {
    let bed = Bed::in_memory_serving(true, &NAMESPACES).await;
    let channel = "  - operationId: watchNamespacedPods\n    allNamespaces: true\n    watchStrategy: clusterWide\n    topic: pods\n";
    let cfg = sharded(bed.config(channel, ""), 4);
    let memory = Arc::new(Memory::new());
    let group = MemoryGroup::default();
    let cluster = || pods_by(&bed.sim, &NAMESPACES, |_| true, version);
    let consumer = || consumer_view_by(&events(&memory), version);
    let start = || Relay::start_on_lane(&bed, cfg.clone(), Lane::new(memory.clone()), &group);
    let a = start();
    owns(&a, Some(4), "A never owned the shards").await;
    a.wait_up(4).await;
    // Changes from here on: the first sync before them announced the state as it was.
    let (b, from, made) = handovers_under_churn(&bed, a, &start).await;
    eventually(
        || consumer() == cluster(),
        || "the consumer's view never became the cluster's".into(),
    )
    .await;
    b.stop().await;
    assert!(made > 100, "the churn made {made} changes only");
    let journal = bed.journal_after("pods", None, from);
    assert_published(&events(&memory), &journal, "");
}

/// A release before fan-out relayed a channel over one collection whole, in its channel's shard
/// (`<channel>._all`). Replicas of this version keep it so, side by side with the older ones: a
/// new owner of that shard resumes the stream from its checkpoint, no shard runs a part of it,
/// nothing is retracted, and every change the server made is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_kept_whole_from_before_fan_out_loses_no_change() {
    let bed = Bed::in_memory_serving(true, &NAMESPACES).await;
    pods_p1(&bed);
    let channel = "  - operationId: watchNamespacedPods\n    allNamespaces: true\n    watchStrategy: clusterWide\n    topic: pods\n";
    let cfg = sharded(bed.config(channel, ""), 4);
    // As the older release left it: the stream recorded whole in its channel's shard.
    let whole = "watchNamespacedPods._all";
    let home = recorded_whole(&bed, &cfg, whole);
    let memory = Arc::new(Memory::new());
    let group = MemoryGroup::default();
    let cluster = || pods_by(&bed.sim, &NAMESPACES, |_| true, version);
    let consumer = || consumer_view_by(&events(&memory), version);
    let start = || Relay::start_on_lane(&bed, cfg.clone(), Lane::new(memory.clone()), &group);
    let a = start();
    owns(&a, Some(4), "A never owned the shards").await;
    a.wait_up(1).await;
    eventually(
        || consumer() == cluster(),
        || "A never relayed the pods".into(),
    )
    .await;
    // The stream's shard moves to B, at the latest when A is killed.
    let (b, from, made) = handovers_under_churn(&bed, a, &start).await;
    eventually(
        || consumer() == cluster(),
        || "the consumer's view never became the cluster's".into(),
    )
    .await;
    assert_eq!(
        b.metrics.fanout_watches.get(),
        0,
        "the collection was fanned out"
    );
    assert_eq!(b.registry.phases().keys().collect::<Vec<_>>(), [whole]);
    b.stop().await;
    assert!(made > 100, "the churn made {made} changes only");
    for k in 0..4 {
        let cm = bed.shard_configmap(k).unwrap_or_default();
        let ids: Vec<&String> = cm["data"]
            .as_object()
            .map(|d| d.keys().filter(|id| id.contains("._all")).collect())
            .unwrap_or_default();
        let expected: Vec<&str> = if k == home { vec![whole] } else { vec![] };
        assert_eq!(ids, expected, "shard {k}");
    }
    assert!(bed.shard_checkpoint_rv(home, whole).is_some());
    assert_history_unretracted(&bed, &memory, from);
}

/// `watchrelay split-whole` fans out a stream kept whole from before fan-out. Refused while a
/// replica runs; with the release stopped, every shard's part takes its objects' members and
/// the stream's position, so the next start resumes each part from there: every change made
/// while the release was down and after is published once (two changes of one object while
/// down would collapse into a list), nothing is retracted, and the collection is never listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_kept_whole_split_into_the_shards_parts_loses_no_change() {
    let channel = "  - operationId: watchNamespacedPods\n    allNamespaces: true\n    watchStrategy: clusterWide\n    topic: pods\n";
    split_loses_no_change(channel, false).await;
}

/// The same with exactly-once delivery: the split fences every shard's transactional id and
/// takes the position committed with the stream's records; no change is published twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_a_stream_kept_whole_split_into_the_shards_parts_publishes_every_change_once()
{
    let channel = "  - operationId: watchNamespacedPods\n    allNamespaces: true\n    watchStrategy: clusterWide\n    topic: pods\n";
    split_loses_no_change(channel, true).await;
}

/// The same over a `namespaces` list read cluster-wide: each part's scope is its shard's
/// namespaces of the list, which the stream's position covered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_stream_kept_whole_split_into_the_shards_parts_loses_no_change() {
    let channel = format!(
        "  - operationId: watchNamespacedPods\n    namespaces: [{}]\n    watchStrategy: clusterWide\n    topic: pods\n",
        NAMESPACES.join(", ")
    );
    split_loses_no_change(&channel, false).await;
}

/// The same over a namespace selector read cluster-wide: each part's scope is its shard's
/// namespaces the selector matches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selected_stream_kept_whole_split_into_the_shards_parts_loses_no_change() {
    let channel = "  - operationId: watchNamespacedPods\n    namespaceSelector: relay=yes\n    watchStrategy: clusterWide\n    topic: pods\n";
    split_loses_no_change(channel, false).await;
}

/// A stream of `channel` kept whole, relayed, split while the release is down, and relayed
/// by its parts (`once`: with exactly-once delivery): see the tests above. A namespace
/// selector's `relay=yes` matches every namespace.
async fn split_loses_no_change(channel: &str, once: bool) {
    let bed = Bed::in_memory_serving(true, &NAMESPACES).await;
    pods_p1(&bed);
    for ns in NAMESPACES {
        bed.label(ns, true);
    }
    let mut cfg = sharded(bed.config(channel, ""), 4);
    if once {
        cfg.kafka.delivery = Delivery::ExactlyOnce;
    }
    let whole = "watchNamespacedPods._all";
    let home = recorded_whole(&bed, &cfg, whole);
    let memory = Arc::new(Memory::new());
    let txns = once.then(|| Transactions::new(memory.clone()));
    let group = MemoryGroup::default();
    let cluster = || pods_by(&bed.sim, &NAMESPACES, |_| true, version);
    let consumer = || consumer_view_by(&events(&memory), version);
    let lane = || Lane::new(memory.clone());
    let start = || Relay::start_on_lane_with(&bed, cfg.clone(), lane(), &group, txns.as_ref());
    let split = || Relay::split_whole(&bed, cfg.clone(), Some((lane(), &group)), txns.as_ref());
    let caught_up =
        |what: &'static str| eventually(|| consumer() == cluster(), move || what.into());
    // Never run sharded: refused, with nothing marked (A starts).
    let refused = split().await;
    assert!(
        matches!(&refused, Err(RelayError::Refused(why)) if why.contains("never run by a sharded replica")),
        "a split of a shard this version never ran: {refused:?}"
    );
    let a = start();
    owns(&a, Some(4), "A never owned the shards").await;
    caught_up("A never relayed the pods").await;
    let from = bed.sim.current_rv();
    change_p1(&bed, "1");
    caught_up("A never relayed the change").await;
    let refused = split().await;
    assert!(
        matches!(refused, Err(RelayError::Refused(_))),
        "a split while a replica runs: {refused:?}"
    );
    // Stopped by a crash once the stream has a position: the checkpoint ConfigMap may lag what
    // was relayed (under exactly once, the positions committed in Kafka).
    eventually(
        || bed.shard_checkpoint_rv(home, whole).is_some(),
        || "the stream kept whole never wrote its position".into(),
    )
    .await;
    a.kill().await;
    // While the release is down: two changes of every pod, one deleted, one created.
    change_p1(&bed, "2");
    change_p1(&bed, "3");
    bed.sim.delete("pods", Some(NAMESPACES[0]), "p1").unwrap();
    let p2 = objects::pod(NAMESPACES[1], "p2");
    bed.sim.create("pods", Some(NAMESPACES[1]), p2).unwrap();
    let splits = split().await.expect("the split");
    assert_eq!(splits.len(), 1, "{splits:?}");
    let made = &splits[0];
    assert_eq!((made.stream.as_str(), made.shard), (whole, home));
    assert_eq!(made.members.values().sum::<usize>(), NAMESPACES.len());
    let position: u64 = made
        .position
        .as_deref()
        .expect("a position")
        .parse()
        .unwrap();
    for k in 0..4 {
        let part = format!("watchNamespacedPods._all-s{k}");
        assert_eq!(bed.shard_checkpoint_rv(k, whole), None, "shard {k}");
        assert_eq!(
            bed.shard_checkpoint_rv(k, &part),
            Some(position),
            "shard {k}"
        );
    }
    let again = split().await;
    assert!(again.expect("a second split").is_empty());
    let b = start();
    owns(&b, Some(4), "B never owned the shards").await;
    caught_up("B never relayed the changes made while the release was down").await;
    let label = serde_json::json!({"metadata": {"labels": {"v": "4"}}});
    (bed.sim
        .merge_patch("pods", Some(NAMESPACES[1]), "p2", label))
    .unwrap();
    caught_up("B never relayed the last change").await;
    assert!(b.metrics.fanout_watches.get() > 0, "not fanned out");
    assert_eq!(b.metrics.fanout_lists.get(), 0, "a part relisted");
    let mut ids: Vec<String> = b.registry.phases().into_keys().collect();
    ids.sort();
    let parts: Vec<String> = (0..4)
        .map(|k| format!("watchNamespacedPods._all-s{k}"))
        .collect();
    assert_eq!(ids, parts);
    b.stop().await;
    assert_history_unretracted(&bed, &memory, from);
    if once {
        let twice = repeated(&events(&memory));
        assert!(twice.is_empty(), "published twice: {twice:?}");
    }
}

/// Every change of the pods the server made after `from` is published in `memory`, and no
/// object was retracted (no inferred DELETED).
fn assert_history_unretracted(bed: &Bed, memory: &Memory, from: u64) {
    let log = events(memory);
    let retracted = log
        .iter()
        .filter(|r| json(r)["watchrelay"]["synthetic"] == true)
        .count();
    assert_eq!(retracted, 0, "objects were retracted");
    let journal = bed.journal_after("pods", None, from);
    assert_published(&log, &journal, "");
}

/// While a split of streams kept whole is under way, or was cut short, no replica starts; a
/// replica that settled the release before a split stops at its next term, rather than run
/// what it settled (a stream kept whole that the split handed to the shards' parts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_runs_nothing_of_a_release_being_split() {
    let bed = Bed::in_memory_serving(true, &NAMESPACES).await;
    pods_p1(&bed);
    let channel = "  - operationId: watchNamespacedPods\n    allNamespaces: true\n    watchStrategy: clusterWide\n    topic: pods\n";
    let cfg = sharded(bed.config(channel, ""), 4);
    let memory = Arc::new(Memory::new());
    let group = MemoryGroup::default();
    let start = || Relay::start_on_lane(&bed, cfg.clone(), Lane::new(memory.clone()), &group);
    let mark = |k: u32, key: &str, value: &str| {
        let name = format!("{CHECKPOINT_NAME}-s{k}");
        let data = serde_json::json!({"data": {key: value}});
        (bed.sim
            .merge_patch("configmaps", Some(CHECKPOINT_NS), &name, data))
        .unwrap();
    };
    let a = start();
    owns(&a, Some(4), "A never owned the shards").await;
    // A split made after A settled the release (one whose marks A's start raced).
    for k in 0..4 {
        mark(k, ".splits", "1");
    }
    let b = start();
    owns(&b, None, "B never took a shard").await;
    b.kill().await;
    eventually(
        || a.ended(),
        || "A ran a term of a release split since it started".into(),
    )
    .await;
    assert_eq!(a.outcome().await, Ok(()));
    // A split cut short.
    mark(1, ".splitting", "watchNamespacedPods._all");
    let refused = start().outcome().await;
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("split-whole")),
        "{refused:?}"
    );
}

/// Records `whole` in its shard's checkpoint ConfigMap, as a release before fan-out left it
/// (without a position); its shard.
fn recorded_whole(bed: &Bed, cfg: &Config, whole: &str) -> u32 {
    let home = cfg.sharding.shard_of_stream(whole);
    bed.sim
        .create(
            "configmaps",
            Some(CHECKPOINT_NS),
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": format!("{CHECKPOINT_NAME}-s{home}"), "namespace": CHECKPOINT_NS},
                "data": {whole: "{\"rv\":null}"},
            }),
        )
        .unwrap();
    home
}

/// S11: a reopen of the shared watch answered 504 (the server's cache behind the position, as
/// another API server's may be) is tried again from the same position: no part relists, and
/// every change is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_cache_at_a_reopen_relists_no_part() {
    let bed = Bed::in_memory_serving(true, &NAMESPACES).await;
    pods_p1(&bed);
    let channel = "  - operationId: watchNamespacedPods\n    allNamespaces: true\n    watchStrategy: clusterWide\n    topic: pods\n";
    let memory = Arc::new(Memory::new());
    let a = relaying_every_shard(&bed, channel, &memory).await;
    let cluster = || pods_by(&bed.sim, &NAMESPACES, |_| true, version);
    let consumer = || consumer_view_by(&events(&memory), version);
    let lists = a.metrics.fanout_lists.get();
    let from = bed.sim.current_rv();
    // The next two watches of pods from a position get 504; the watch is cut, and pods change
    // once the first reopen met its 504 (so the reopens are from the position before them).
    bed.sim.lag_next_watches("pods", 2);
    bed.sim.drop_watches();
    eventually(
        || bed.sim.lagging_watches() < 2,
        || "the shared watch never reopened".into(),
    )
    .await;
    change_p1(&bed, "1");
    change_p1(&bed, "2");
    eventually(
        || consumer() == cluster() && bed.sim.lagging_watches() == 0,
        || "the changes never reached the consumer past both 504s".into(),
    )
    .await;
    assert_eq!(a.metrics.fanout_lists.get(), lists, "a part relisted");
    a.stop().await;
    let journal = bed.journal_after("pods", None, from);
    assert_eq!(journal.len(), 2 * NAMESPACES.len());
    assert_published(&events(&memory), &journal, "");
}

/// S13: a failed delivery of a fanned-out part (here filtered to a selector's namespaces)
/// replays its share of the shared watch from its checkpoint, as any stream's watch does: no
/// list, no full resync, every change published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delivery_of_a_part_publishes_every_change() {
    let bed = Bed::in_memory_serving(true, &NAMESPACES).await;
    pods_p1(&bed);
    for ns in NAMESPACES {
        bed.label(ns, true);
    }
    let channel = "  - operationId: watchNamespacedPods\n    namespaceSelector: relay=yes\n    watchStrategy: clusterWide\n    topic: pods\n";
    let memory = Arc::new(Memory::new());
    let a = relaying_every_shard(&bed, channel, &memory).await;
    let lists = a.metrics.fanout_lists.get();
    memory.fail_next_to("pods", 2);
    changes_all_reach_the_consumer(&bed, &memory, 4).await;
    assert_eq!(a.metrics.fanout_lists.get(), lists, "a part relisted");
    a.stop().await;
}

/// A selector's fanned-out parts move to another replica while a namespace holding a pod
/// enters the scope and the pods change, with more than ten namespaces of each shard in scope
/// without a pod: more than a part's fingerprint alone can tell apart. The new owner tells
/// from each part's saved set-sum which namespaces its position covered, resumes every part
/// from it and takes the entering namespace in: every change is published, none collapsed
/// into a list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_part_with_many_empty_namespaces_in_scope_resumes() {
    let empty: Vec<String> = (0..64).map(|i| format!("empty-{i:02}")).collect();
    let mut all: Vec<&str> = NAMESPACES.to_vec();
    all.push("late");
    all.extend(empty.iter().map(String::as_str));
    let bed = Bed::in_memory_serving(true, &all).await;
    pods_p1(&bed);
    bed.sim
        .create("pods", Some("late"), objects::pod("late", "p1"))
        .unwrap();
    for ns in NAMESPACES
        .iter()
        .copied()
        .chain(empty.iter().map(String::as_str))
    {
        bed.label(ns, true);
    }
    let channel = "  - operationId: watchNamespacedPods\n    namespaceSelector: relay=yes\n    watchStrategy: clusterWide\n    topic: pods\n";
    let memory = Arc::new(Memory::new());
    let cfg = sharded(bed.config(channel, ""), 4);
    let group = MemoryGroup::default();
    let a = relaying_every_shard_in(&bed, cfg.clone(), &memory, &group).await;
    a.stop().await;

    let from = bed.sim.current_rv();
    change_p1(&bed, "1");
    change_p1(&bed, "2");
    bed.label("late", true);
    let b = Relay::start_on_lane(&bed, cfg, Lane::new(memory.clone()), &group);
    owns(&b, Some(4), "B never owned the shards").await;
    let mut scope = NAMESPACES.to_vec();
    scope.push("late");
    eventually(
        || caught_up(&bed, &memory, &scope, from),
        || {
            let log = events(&memory);
            format!(
                "changes never published: {:?}",
                common::view::unpublished(&log, &bed.journal_after("pods", None, from))
            )
        },
    )
    .await;
    b.stop().await;
}

/// S12: a busy shard listed again while the shared watch runs (here: a namespace the reads
/// were not asked for) holds its live lines until its list ends; lines past what a part may
/// hold are dropped and the part resumes from its list's position once the list ends, instead
/// of relisting each time its lines outgrow the bound. One list, every change published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_shard_during_a_long_list_resumes_instead_of_relisting() {
    let cfg = SimConfig {
        sharded_list_and_watch: true,
        watch_list: false,
        ..SimConfig::default()
    };
    let bed = Bed::in_memory(cfg, &NAMESPACES).await;
    pods_p1(&bed);
    let channel = "  - operationId: watchAllPods\n    topic: pods\n";
    let memory = Arc::new(Memory::new());
    let a = relaying_every_shard(&bed, channel, &memory).await;
    let lists = a.metrics.fanout_lists.get();
    let own = || a.metrics.fanout_objects.with_label_values(&["own"]).get();
    let from = bed.sim.current_rv();
    // A namespace the reads were not asked for: its shard's part lists again, and that list
    // takes long while its pod changes, in more bytes than a part may hold meanwhile.
    bed.sim.hold_next_list("pods");
    bed.sim
        .create("namespaces", None, objects::namespace("late"))
        .unwrap();
    eventually(
        || bed.sim.list_held(),
        || "the late namespace's shard was never listed".into(),
    )
    .await;
    let before = (own(), expired(&a.metrics));
    let changes = 100;
    let filler = "x".repeat(100_000);
    for i in 0..changes {
        let pod = objects::pod("late", "busy");
        if i == 0 {
            bed.sim.create("pods", Some("late"), pod).unwrap();
        } else {
            bed.sim
                .merge_patch(
                    "pods",
                    Some("late"),
                    "busy",
                    serde_json::json!({"metadata": {"annotations": {"n": i.to_string(), "filler": filler}}}),
                )
                .unwrap();
        }
    }
    // The shared watch dealt every change, or the part was let go (relisting).
    eventually(
        || own() >= before.0 + changes || expired(&a.metrics) > before.1,
        || "the shared watch never received the changes".into(),
    )
    .await;
    bed.sim.release_list();
    let mut namespaces = NAMESPACES.to_vec();
    namespaces.push("late");
    eventually(
        || caught_up(&bed, &memory, &namespaces, from),
        || "the busy pod's changes never all reached the consumer".into(),
    )
    .await;
    assert_eq!(a.metrics.fanout_lists.get(), lists + 1, "a part relisted");
    a.stop().await;
}

/// S4: a replica whose namespaces' watch went quiet (a half-open connection) takes shards
/// over whose positions are gone, and lists them: the list asks the server for every namespace
/// a fresh list of them finds, not only those the replica's follower knows, so the pods of a
/// namespace created meanwhile, announced by the former owner, are not taken for deleted. And
/// the server's answer to those positions (an error event on the reopened shared watch) sends
/// only the parts that needed them to a list, not the replica's others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_namespaces_lag_takes_no_live_object_for_deleted() {
    let (bed, cfg) = filtering_bed().await;
    let memory = Arc::new(Memory::new());
    let group = MemoryGroup::default();
    let start = || Relay::start_on_lane(&bed, cfg.clone(), Lane::new(memory.clone()), &group);
    let a = start();
    owns(&a, Some(4), "A never owned the shards").await;
    a.wait_up(4).await;
    // B's namespaces' watch goes quiet as it opens, after its first list of them.
    bed.sim.stall_next_watch_of("namespaces");
    let b = start();
    eventually(
        || b.metrics.shards_owned.get() > 0 && a.metrics.shards_owned.get() < 4,
        || "B never took a shard".into(),
    )
    .await;
    eventually(
        || !bed.sim.watch_stall_armed(),
        || "B's namespaces were never watched".into(),
    )
    .await;
    // A namespace in one of A's shards, which only A's follower sees.
    let a_shards: BTreeSet<u32> = a
        .registry
        .phases()
        .keys()
        .filter_map(|id| id.rsplit("-s").next()?.parse().ok())
        .collect();
    let late = (0..)
        .map(|i| format!("late-{i}"))
        .find(|ns| a_shards.contains(&cfg.sharding.shard_of(ns)))
        .unwrap();
    bed.sim
        .create("namespaces", None, objects::namespace(&late))
        .unwrap();
    for name in ["p1", "p2", "p3"] {
        bed.sim
            .create("pods", Some(&late), objects::pod(&late, name))
            .unwrap();
    }
    let mut namespaces: Vec<&str> = NAMESPACES.to_vec();
    namespaces.push(&late);
    let cluster = || pods_by(&bed.sim, &namespaces, |_| true, version);
    let consumer = || consumer_view_by(&events(&memory), version);
    eventually(
        || consumer() == cluster(),
        || "A never relayed the late namespace's pods".into(),
    )
    .await;
    // A leaves while no request reaches the server and its history is dropped: B takes A's
    // shards over from positions the server no longer holds, so it lists them, and only them
    // (its own watch, which has read past the drop, goes on).
    let before = events(&memory).len();
    let lists = b.metrics.fanout_lists.get();
    let expired = |r: &Relay, stream: &str| {
        r.metrics
            .watch_restarts
            .with_label_values(&[stream, "expired"])
            .get()
    };
    let b_streams: Vec<(String, u64)> = b
        .registry
        .phases()
        .into_keys()
        .map(|id| {
            let n = expired(&b, &id);
            (id, n)
        })
        .collect();
    bed.sim
        .fail_next(usize::MAX, watchrelay_sim::Fault::ServerError);
    a.stop().await;
    bed.sim.compact();
    let published_by_b = published(&b.metrics);
    change_p1(&bed, "after-the-drop");
    eventually(
        || published(&b.metrics) > published_by_b,
        || "B's watch never read past the drop".into(),
    )
    .await;
    bed.sim.stop_failing();
    owns(&b, Some(4), "B never took A's shards").await;
    b.wait_up(4).await;
    eventually(
        || consumer() == cluster(),
        || "the consumer's view never came back to the cluster's".into(),
    )
    .await;
    let deleted: Vec<String> = events(&memory)[before..]
        .iter()
        .filter(|r| r.key.starts_with(&format!("{late}/")) && json(r)["type"] == "DELETED")
        .map(|r| r.key.clone())
        .collect();
    assert!(
        deleted.is_empty(),
        "live pods published as deleted: {deleted:?}"
    );
    assert!(
        b.metrics.fanout_lists.get() > lists,
        "B never listed A's shards"
    );
    // The server answered the resuming parts' position with an error event: only they
    // relisted, not B's own parts, whose positions it still held.
    for (id, n) in &b_streams {
        assert_eq!(expired(&b, id), *n, "{id} relisted");
    }
    b.stop().await;
}

/// S16: a part that takes no line (its records unacknowledged, as behind the partition of its
/// keys with its leader stalled) holds up no other part of its replica's shared watch: its
/// lines queue in the hub while the other shards' parts go on publishing. Once its records are
/// acknowledged it takes them, in order: it was not let go, and nothing was read again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_that_takes_no_line_holds_up_no_other() {
    let (a, watches) = a_part_stalls(600, 0).await;
    assert_eq!(a.metrics.fanout_parts_let_go.get(), 0);
    assert_eq!(
        a.metrics.fanout_watches.get(),
        watches,
        "the shared watch was reopened"
    );
    a.stop().await;
}

/// A stalled part whose queue in the hub outgrows its bound is let go: it resumes from its
/// position and publishes every change of its own, and the others were not held up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_that_falls_too_far_behind_is_let_go_and_resumes() {
    // Past what its subscription buffers, some 690 changes of 32 KiB: more than a part may
    // queue.
    let (a, _) = a_part_stalls(1200, 32 << 10).await;
    assert_eq!(a.metrics.fanout_parts_let_go.get(), 1);
    assert_eq!(expired(&a.metrics), 0.0, "a part relisted");
    a.stop().await;
}

/// One part of a fanned-out collection stops reading while its pod changes `changes` times
/// (with an annotation of `pad` bytes), more than its subscription buffers; the other shards'
/// changes are all published meanwhile. Then it reads again, and every change is published.
/// Returns the relay and how many watches it had opened before the part stalled.
async fn a_part_stalls(changes: usize, pad: usize) -> (Relay, u64) {
    let bed = Bed::in_memory_serving(true, &NAMESPACES).await;
    pods_p1(&bed);
    let channel = "  - operationId: watchNamespacedPods\n    allNamespaces: true\n    watchStrategy: clusterWide\n    topic: pods\n";
    let mut cfg = sharded(bed.config(channel, ""), 4);
    // The stalled part stops reading after one record.
    cfg.kafka.max_in_flight_per_stream = 1;
    let memory = Arc::new(Memory::new());
    let a = relaying_every_shard_as(&bed, cfg.clone(), &memory).await;
    let from = bed.sim.current_rv();
    let watches = a.metrics.fanout_watches.get();
    let stalled = NAMESPACES[0];
    memory.hold_keys(Some(&format!("{stalled}/")));
    let padding = "x".repeat(pad);
    for i in 0..changes {
        let patch = serde_json::json!({"metadata": {
            "labels": {"v": i.to_string()},
            "annotations": {"pad": padding},
        }});
        bed.sim
            .merge_patch("pods", Some(stalled), "p1", patch)
            .unwrap();
    }
    change_p1(&bed, "after");
    let elsewhere: Vec<&str> = NAMESPACES
        .iter()
        .copied()
        .filter(|ns| cfg.sharding.shard_of(ns) != cfg.sharding.shard_of(stalled))
        .collect();
    assert!(!elsewhere.is_empty());
    let others: Vec<_> = elsewhere
        .iter()
        .flat_map(|ns| bed.journal_after("pods", Some(ns), from))
        .collect();
    wait_for(
        "the other shards' changes",
        std::time::Duration::from_secs(120),
        || common::view::unpublished(&events(&memory), &others).is_empty(),
    )
    .await;
    memory.hold_keys(None);
    memory.release(Order::Sent);
    eventually(
        || caught_up(&bed, &memory, &NAMESPACES, from),
        || "the stalled part's changes were never all published".into(),
    )
    .await;
    assert_published(&events(&memory), &bed.journal_after("pods", None, from), "");
    (a, watches)
}

/// A simulator that filters by shard (serving `shardSelector` as kube-apiserver with
/// `ShardedListAndWatch` on) holding a pod `p1` in every namespace, and a release over 4
/// shards of `watchAllPods` on it.
async fn filtering_bed() -> (Bed, Config) {
    let sim = SimConfig {
        sharded_list_and_watch: true,
        ..SimConfig::default()
    };
    let bed = Bed::in_memory(sim, &NAMESPACES).await;
    pods_p1(&bed);
    let channel = "  - operationId: watchAllPods\n    topic: pods\n";
    let cfg = sharded(bed.config(channel, ""), 4);
    (bed, cfg)
}

/// One replica of `channel` over 4 shards on `memory`, once it owns every shard and the
/// consumer holds the cluster's pods.
async fn relaying_every_shard(bed: &Bed, channel: &str, memory: &Arc<Memory>) -> Relay {
    relaying_every_shard_as(bed, sharded(bed.config(channel, ""), 4), memory).await
}

/// The same, configured as `cfg`.
async fn relaying_every_shard_as(bed: &Bed, cfg: Config, memory: &Arc<Memory>) -> Relay {
    relaying_every_shard_in(bed, cfg, memory, &MemoryGroup::default()).await
}

/// The same, in shard group `group`.
async fn relaying_every_shard_in(
    bed: &Bed,
    cfg: Config,
    memory: &Arc<Memory>,
    group: &MemoryGroup,
) -> Relay {
    let a = Relay::start_on_lane(bed, cfg, Lane::new(memory.clone()), group);
    owns(&a, Some(4), "A never owned the shards").await;
    a.wait_up(4).await;
    eventually(
        || {
            consumer_view_by(&events(memory), version)
                == pods_by(&bed.sim, &NAMESPACES, |_| true, version)
        },
        || "A never relayed the pods".into(),
    )
    .await;
    a
}

/// Whether the consumer holds the pods of `namespaces` as the cluster does, and every change of
/// a pod after `from` has its record: the view and the history.
fn caught_up(bed: &Bed, memory: &Memory, namespaces: &[&str], from: u64) -> bool {
    let log = events(memory);
    consumer_view_by(&log, version) == pods_by(&bed.sim, namespaces, |_| true, version)
        && common::view::unpublished(&log, &bed.journal_after("pods", None, from)).is_empty()
}

/// Changes pod `p1` of every namespace `rounds` times, then waits until the consumer holds the
/// pods as the cluster does, with a record for every one of those changes.
async fn changes_all_reach_the_consumer(bed: &Bed, memory: &Memory, rounds: usize) {
    let from = bed.sim.current_rv();
    for round in 0..rounds {
        change_p1(bed, &round.to_string());
    }
    eventually(
        || caught_up(bed, memory, &NAMESPACES, from),
        || format!("the {rounds} rounds of changes never all reached the consumer"),
    )
    .await;
}

/// Changes pod `p1` of every namespace, labelling it `v`.
fn change_p1(bed: &Bed, v: &str) {
    for ns in NAMESPACES {
        bed.sim
            .merge_patch(
                "pods",
                Some(ns),
                "p1",
                serde_json::json!({"metadata": {"labels": {"v": v}}}),
            )
            .unwrap();
    }
}

/// From A owning every shard, its first sync done: under churn, B joins, A is killed, C joins
/// and leaves, a pause between each. Returns B, which owns every shard again, the position the
/// churn's changes come after, and how many it made.
async fn handovers_under_churn(
    bed: &Bed,
    a: Relay,
    start: &impl Fn() -> Relay,
) -> (Relay, u64, u64) {
    let pause = || tokio::time::sleep(std::time::Duration::from_millis(400));
    let from = bed.sim.current_rv();
    let churn = bed.sim.start_churn(ChurnSpec {
        rate_per_sec: 300.0,
        namespaces: NAMESPACES.iter().map(|n| n.to_string()).collect(),
        resources: vec!["pods".into()],
        max_objects_per_kind: 3,
        total_events: None,
    });
    pause().await;
    let b = start();
    owns(&b, None, "B never took a shard").await;
    pause().await;
    a.kill().await;
    owns(&b, Some(4), "B never took A's shards").await;
    pause().await;
    let c = start();
    owns(&c, None, "C never took a shard").await;
    pause().await;
    c.stop().await;
    owns(&b, Some(4), "B never took C's shards").await;
    pause().await;
    let made = churn.stop().await;
    (b, from, made)
}

/// A pod `p1` in every namespace.
fn pods_p1(bed: &Bed) {
    for ns in NAMESPACES {
        bed.sim
            .create("pods", Some(ns), objects::pod(ns, "p1"))
            .unwrap();
    }
}

/// Waits until `r` owns `n` shards (some, with `None`).
async fn owns(r: &Relay, n: Option<i64>, what: &str) {
    let owned = || r.metrics.shards_owned.get();
    eventually(
        || n.map_or(owned() > 0, |n| owned() == n),
        || what.to_string(),
    )
    .await;
}

/// How many times a stream restarted because its position was gone (a 410 of the hub's).
fn expired(metrics: &Metrics) -> f64 {
    metrics
        .registry
        .gather()
        .iter()
        .filter(|f| f.name().ends_with("watch_restarts_total"))
        .flat_map(|f| f.get_metric())
        .filter(|m| {
            m.get_label()
                .iter()
                .any(|l| l.name() == "reason" && l.value() == "expired")
        })
        .map(|m| m.get_counter().get_value())
        .sum()
}

fn published(metrics: &Metrics) -> f64 {
    metrics
        .registry
        .gather()
        .iter()
        .filter(|f| f.name().ends_with("events_published_total"))
        .flat_map(|f| f.get_metric())
        .map(|m| m.get_counter().get_value())
        .sum()
}
