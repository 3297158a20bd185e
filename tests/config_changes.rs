//! Configuration changes: a `watchStrategy` switch hands the members over to the new shape's
//! streams (with sharding on, within each key's shard, while old and new replicas run side by
//! side), and a replica whose shard count is not the release's refuses to start.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use common::bed::{eventually, shard_of, sharded, Bed, Relay, CHECKPOINT_NAME, CHECKPOINT_NS};
use common::view::{consumer_view, events, pods};
use watchrelay::config::Config;
use watchrelay::testing::{Memory, MemoryGroup, Transactions};
use watchrelay_sim::{objects, SimConfig};

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

/// The pods channel's streams that the checkpoint ConfigMaps hold (the shards', or the single
/// relay's).
fn pods_recorded(bed: &Bed) -> Vec<String> {
    let maps = (0..SHARDS)
        .filter_map(|k| bed.shard_configmap(k))
        .chain(
            bed.sim
                .get("configmaps", Some(CHECKPOINT_NS), CHECKPOINT_NAME),
        );
    maps.flat_map(|cm| {
        cm["data"]
            .as_object()
            .map(|d| d.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
    })
    .filter(|k| k.starts_with(&format!("{CHANNEL}.")))
    .collect()
}

/// The position the checkpoint ConfigMaps hold for `stream`, if any.
fn recorded_rv(bed: &Bed, stream: &str) -> Option<u64> {
    let maps = (0..SHARDS)
        .filter_map(|k| bed.shard_configmap(k))
        .chain(
            bed.sim
                .get("configmaps", Some(CHECKPOINT_NS), CHECKPOINT_NAME),
        );
    maps.filter_map(|cm| {
        let entry = cm["data"][stream].as_str()?.to_string();
        let saved: serde_json::Value = serde_json::from_str(&entry).ok()?;
        saved["rv"].as_str()?.parse().ok()
    })
    .next()
}

/// Whether every recorded pods stream is over the collection (`wide`: the stream `._all`, or a
/// shard's part of it) or a namespace's stream, and there is one.
fn recorded_as(bed: &Bed, wide: bool) -> bool {
    let ids = pods_recorded(bed);
    !ids.is_empty() && ids.iter().all(|id| id.contains("._all") == wide)
}

/// Creates pods `p0`, `p1` and `p2` in each of `namespaces`.
fn three_pods_in(bed: &Bed, namespaces: &[&String]) {
    for ns in namespaces {
        for i in 0..3 {
            bed.sim
                .create("pods", Some(ns), objects::pod(ns, &format!("p{i}")))
                .unwrap();
        }
    }
}

/// A pod of `a` deleted, one of `b` created, and another of `a` changed twice.
fn four_changes(bed: &Bed, a: &str, b: &str) {
    bed.sim.delete("pods", Some(a), "p0").unwrap();
    bed.sim
        .create("pods", Some(b), objects::pod(b, "p9"))
        .unwrap();
    for v in ["1", "2"] {
        let patch = serde_json::json!({"metadata": {"labels": {"v": v}}});
        bed.sim.merge_patch("pods", Some(a), "p1", patch).unwrap();
    }
}

/// The records `memory` holds of the pods topic.
fn pod_records(memory: &Memory) -> Vec<watchrelay::producer::Record> {
    events(memory)
        .into_iter()
        .filter(|r| r.topic == "pods")
        .collect()
}

/// A rollout from per-namespace streams to one watch fanned out to the shards, with the old
/// and the new replicas side by side while pods change, then back: an object lives in its
/// namespace's shard in either shape, so no start is refused and each shard hands its members
/// over to the new shape's streams instead of retracting them. The consumer never sees a live
/// pod DELETED, and ends with the cluster each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_strategy_switch_hands_each_shards_members_over() {
    switch(true, Scope::List, Joins::No, Bookmarks::Often).await;
}

/// The same over a namespace selector (as an `allNamespaces` channel relayed per namespace
/// is): each shard's term lists the namespaces the selector matches now, and as every one had
/// its stream, the part resumes from the lowest of their positions, and back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_strategy_switch_over_a_selector_loses_no_change() {
    switch(true, Scope::Selector, Joins::No, Bookmarks::Often).await;
}

/// The same switch, there and back, of a single relay (sharding off): its stream over the
/// collection takes the per-namespace streams' members, and gives them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_strategy_switch_of_a_single_relay_retracts_nothing() {
    switch(false, Scope::List, Joins::No, Bookmarks::Often).await;
}

/// The same over a namespace selector, of a single relay: the changes made while it was down
/// are published by its stream over the collection, resumed from the namespaces' streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_strategy_switch_of_a_single_relay_over_a_selector_loses_no_change() {
    switch(false, Scope::Selector, Joins::No, Bookmarks::Often).await;
}

/// A namespace created during the switch (here while the single relay is down), with no
/// stream to hand over but no pod yet either: the stream over the collection still resumes
/// from the namespaces' streams, and relays the new namespace's pods from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_created_during_a_switch_does_not_make_it_relist() {
    switch(false, Scope::Selector, Joins::Created, Bookmarks::Often).await;
}

/// The same with sharding on, the old and new replicas side by side (the old one, still
/// running, may start the new namespace's stream itself before it hands its shard over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_created_during_a_sharded_switch_does_not_make_it_relist() {
    switch(true, Scope::Selector, Joins::Created, Bookmarks::Often).await;
}

/// An old namespace, with pods, labelled into the selector during the switch (here
/// while the single relay is down): the stream over the collection resumes from the other
/// namespaces' streams, and lists the new one as a namespace entering its scope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_labelled_into_the_selector_during_a_switch_does_not_make_it_relist() {
    switch(false, Scope::Selector, Joins::Labelled, Bookmarks::Often).await;
}

/// The same with sharding on, the old and new replicas side by side (the old one, still
/// running, may start the namespace's stream itself before it hands its shard over; when it
/// does not, the part resumes over the others and lists it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_labelled_into_the_selector_during_a_sharded_switch_does_not_make_it_relist() {
    switch(true, Scope::Selector, Joins::Labelled, Bookmarks::Often).await;
}

/// Without bookmarks (a real API server sends them about once a minute), a per-namespace
/// stream's position stays at its namespace's last change: the namespaces' streams stop at
/// different positions, and the stream over the collection resumes from the lowest. It
/// publishes none of what the others had published past it: nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_from_streams_at_different_positions_publishes_nothing_twice() {
    switch(false, Scope::List, Joins::No, Bookmarks::Never).await;
}

/// The same with sharding on, the old and new replicas side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_switch_from_streams_at_different_positions_publishes_nothing_twice() {
    switch(true, Scope::List, Joins::No, Bookmarks::Never).await;
}

/// The same from a selector's streams into `allNamespaces`, whose stream over the collection
/// reads every namespace unfiltered: it too publishes nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_of_every_namespace_from_streams_at_different_positions_publishes_nothing_twice() {
    switch(false, Scope::All, Joins::No, Bookmarks::Never).await;
}

/// The same with sharding on: each shard's part of the collection, read unfiltered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_switch_of_every_namespace_from_streams_at_different_positions_publishes_nothing_twice(
) {
    switch(true, Scope::All, Joins::No, Bookmarks::Never).await;
}

/// A namespace created with a pod while a selector's streams switch to `allNamespaces` over
/// the collection (the relay stopped meanwhile): the stream resumes from the gathered position
/// all the same (the pod came after it, so the watch shows it), and nothing collapses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_created_with_a_pod_during_a_switch_to_every_namespace_does_not_make_it_relist()
{
    switch(false, Scope::All, Joins::CreatedWithPod, Bookmarks::Often).await;
}

/// Which namespaces the switched channel holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// `namespaces: [a, b]`.
    List,
    /// A namespace selector matching `a` and `b`.
    Selector,
    /// The selector relayed per namespace, then `allNamespaces` read over the collection (the
    /// other namespaces hold no pod), then the selector again.
    All,
}

/// How often the API server sends bookmarks during a switch.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bookmarks {
    /// Every second (the simulator's default).
    Often,
    /// Never while the test runs.
    Never,
}

/// How a third namespace joins the selector's scope during a switch.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Joins {
    No,
    /// Created, with no pod until after the switch.
    Created,
    /// Created with a pod during the switch.
    CreatedWithPod,
    /// An old namespace with pods, labelled.
    Labelled,
}

/// A `watchStrategy` switch there and back, with sharding or without, over the two
/// namespaces, listed, matched by a selector or among all; a third namespace may join the
/// selector's scope during the switch (`joins`), and gets a pod after it.
async fn switch(sharding: bool, scope: Scope, joins: Joins, bookmarks: Bookmarks) {
    let (a, b) = namespaces();
    let c = format!("{a}-new");
    let sim = SimConfig {
        bookmark_interval: match bookmarks {
            Bookmarks::Often => Duration::from_secs(1),
            Bookmarks::Never => Duration::from_secs(3600),
        },
        ..SimConfig::default()
    };
    let bed = Bed::in_memory(sim, &[&a, &b]).await;
    for ns in [&a, &b] {
        bed.label(ns, true);
    }
    if joins == Joins::Labelled {
        bed.sim
            .create("namespaces", None, objects::namespace(&c))
            .unwrap();
        three_pods_in(&bed, &[&c]);
    }
    three_pods_in(&bed, &[&a, &b]);
    let channel = |strategy: &str| {
        let scope = match scope {
            Scope::List => format!("namespaces: [{a}, {b}]\n    watchStrategy: {strategy}"),
            Scope::All if strategy == "clusterWide" => {
                "allNamespaces: true\n    watchStrategy: clusterWide".to_string()
            }
            Scope::Selector | Scope::All => {
                format!("namespaceSelector: relay=yes\n    watchStrategy: {strategy}")
            }
        };
        let text = format!("  - operationId: {CHANNEL}\n    {scope}\n    topic: pods\n");
        if sharding {
            config(&bed, &text)
        } else {
            bed.config(&text, "")
        }
    };
    let memory = Arc::new(Memory::new());
    let group = MemoryGroup::default();
    let cluster = || {
        let labelled = |ns: &&String| {
            bed.sim
                .get("namespaces", None, ns)
                .is_some_and(|n| n["metadata"]["labels"]["relay"] == "yes")
        };
        let scope: Vec<&str> = [&a, &b, &c]
            .into_iter()
            .filter(labelled)
            .map(String::as_str)
            .collect();
        pods(&bed.sim, &scope, |_| true)
    };
    let pod_log = || pod_records(&memory);
    let consumer = || consumer_view(&pod_log());
    let (per_ns, wide) = (channel("perNamespace"), channel("clusterWide"));
    // A pod deleted, one created and one changed twice while the switch goes on.
    let change = || {
        if matches!(joins, Joins::Created | Joins::CreatedWithPod) {
            bed.sim
                .create("namespaces", None, objects::namespace(&c))
                .unwrap();
        }
        if joins != Joins::No {
            bed.label(&c, true);
        }
        if joins == Joins::CreatedWithPod {
            bed.sim
                .create("pods", Some(&c), objects::pod(&c, "p8"))
                .unwrap();
        }
        four_changes(&bed, &a, &b);
    };
    // With sharding, the next configuration's replica starts beside the last one (a rolling
    // update) and the last one stops once it took shards over; without, the relay restarts,
    // and what changed while it was down is found by the new streams' relists.
    let roll = |from: Relay, to: Config, changing: bool| {
        let (memory, group, bed, change) = (memory.clone(), group.clone(), &bed, &change);
        async move {
            let from = if sharding {
                Some(from)
            } else {
                from.stop().await;
                if changing {
                    change();
                }
                None
            };
            let next = Relay::start_in(bed, to, memory, &group);
            if let Some(from) = from {
                eventually(
                    || next.ended() || next.metrics.shards_owned.get() > 0,
                    || "the new replica never took a shard".into(),
                )
                .await;
                assert!(!next.ended(), "the switch was refused");
                if changing {
                    change();
                }
                from.stop().await;
            }
            next
        }
    };

    let old = Relay::start_in(&bed, per_ns.clone(), memory.clone(), &group);
    eventually(
        || {
            consumer() == cluster()
                && recorded_as(&bed, false)
                && [&a, &b]
                    .iter()
                    .all(|ns| pods_recorded(&bed).contains(&format!("{CHANNEL}.{ns}")))
        },
        || "the per-namespace streams never relayed and checkpointed".into(),
    )
    .await;
    if bookmarks == Bookmarks::Never {
        // One namespace's stream moves on, the other's stays: their positions differ.
        let patch = serde_json::json!({"metadata": {"labels": {"before": "switch"}}});
        bed.sim.merge_patch("pods", Some(&b), "p2", patch).unwrap();
        let at = bed.sim.current_rv();
        let stream = format!("{CHANNEL}.{b}");
        eventually(
            || recorded_rv(&bed, &stream).is_some_and(|rv| rv >= at),
            || format!("{stream} never checkpointed its last change"),
        )
        .await;
        assert!(
            recorded_rv(&bed, &format!("{CHANNEL}.{a}")).is_some_and(|rv| rv < at),
            "the namespaces' streams stand at the same position"
        );
    }
    let from = bed.sim.current_rv();
    let new = roll(old, wide, true).await;
    eventually(
        || consumer() == cluster() && recorded_as(&bed, true),
        || format!("never read cluster-wide: {:?}", pods_recorded(&bed)),
    )
    .await;
    if joins != Joins::No {
        bed.sim
            .create("pods", Some(&c), objects::pod(&c, "p9"))
            .unwrap();
        eventually(
            || consumer() == cluster(),
            || "the new namespace's pod never reached the consumer".into(),
        )
        .await;
    }

    // And back: the members go back to the namespaces' streams.
    let back = roll(new, per_ns, false).await;
    eventually(
        || consumer() == cluster() && recorded_as(&bed, false),
        || format!("never back per namespace: {:?}", pods_recorded(&bed)),
    )
    .await;
    back.stop().await;
    assert_eq!(consumer(), cluster());
    // A consumer keeping each key's highest version holds the same: no version went back.
    assert_eq!(
        common::view::version_view_by(&pod_log(), |md| md["uid"].as_str().unwrap().to_string()),
        cluster()
    );

    // Nothing was retracted: the one DELETED is the deleted pod's.
    let deleted: BTreeSet<String> = pod_log()
        .iter()
        .filter(|r| !r.tombstone && common::view::json(r)["type"] == "DELETED")
        .map(|r| r.key.clone())
        .collect();
    assert_eq!(deleted, BTreeSet::from([format!("{a}/p0")]));
    // And nothing collapsed: the new streams resumed where the old ones stopped, so every
    // change has its record.
    let changes = bed.journal_after("pods", None, from);
    let joined = usize::from(joins != Joins::No) + usize::from(joins == Joins::CreatedWithPod);
    assert_eq!(changes.len(), 4 + joined);
    common::view::assert_published(&pod_log(), &changes, "");
    // And nothing was published twice: a stream resuming from the lowest of the positions it
    // gathered publishes none of what a namespace's own stream had published past it.
    let twice = common::view::repeated(&pod_log());
    assert!(twice.is_empty(), "published more than once: {twice:?}");
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

/// `allNamespaces` read by one unfiltered stream, narrowed to `namespaces: [a, b]` relayed per
/// namespace across a restart while pods change: the unfiltered position covers every
/// namespace, so each namespace's stream resumes from it, and every change of `a` and `b` made
/// while the relay was down is published; the namespace left out has its pods deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narrowing_every_namespace_to_a_list_resumes_each_namespace_from_the_position() {
    let (a, b) = namespaces();
    let c = format!("{a}-out");
    let bed = Bed::in_memory_serving(true, &[&a, &b, &c]).await;
    three_pods_in(&bed, &[&a, &b, &c]);
    let memory = Arc::new(Memory::new());
    let pod_log = || pod_records(&memory);
    let every = bed.config(
        &format!("  - operationId: {CHANNEL}\n    allNamespaces: true\n    topic: pods\n    watchStrategy: clusterWide\n"),
        "",
    );
    let relay = Relay::start_with(&bed, every, Some(memory.clone()));
    eventually(
        || consumer_view(&pod_log()) == pods(&bed.sim, &[&a, &b, &c], |_| true),
        || "the stream over every namespace never relayed".into(),
    )
    .await;
    relay.stop().await;
    let from = bed.sim.current_rv();
    four_changes(&bed, &a, &b);

    let listed = bed.config(
        &format!("  - operationId: {CHANNEL}\n    namespaces: [{a}, {b}]\n    topic: pods\n    watchStrategy: perNamespace\n"),
        "",
    );
    let relay = Relay::start_with(&bed, listed, Some(memory.clone()));
    eventually(
        || consumer_view(&pod_log()) == pods(&bed.sim, &[&a, &b], |_| true),
        || format!("the consumer holds {:?}", consumer_view(&pod_log()).keys()),
    )
    .await;
    relay.stop().await;
    let changes: Vec<_> = [&a, &b]
        .iter()
        .flat_map(|ns| bed.journal_after("pods", Some(ns), from))
        .collect();
    assert_eq!(changes.len(), 4);
    common::view::assert_published(&pod_log(), &changes, "narrowed to a list");
}

/// A switch of a single relay from `namespaces: [a, b]` per namespace to one stream over the
/// collection, whose handing over fails midway (Kafka refusing a membership record of the
/// second namespace's move, after the first's was made) and is tried again: the stream over
/// the collection still resumes from the namespaces' positions, so every change made while the
/// relay was down is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_whose_hand_over_is_tried_again_still_resumes() {
    let (a, b) = namespaces();
    let bed = Bed::in_memory_serving(true, &[&a, &b]).await;
    three_pods_in(&bed, &[&a, &b]);
    let memory = Arc::new(Memory::new());
    let pod_log = || pod_records(&memory);
    let channel = |strategy: &str| {
        bed.config(
            &format!("  - operationId: {CHANNEL}\n    namespaces: [{a}, {b}]\n    topic: pods\n    watchStrategy: {strategy}\n"),
            "",
        )
    };
    let relay = Relay::start_with(&bed, channel("perNamespace"), Some(memory.clone()));
    eventually(
        || {
            consumer_view(&pod_log()) == pods(&bed.sim, &[&a, &b], |_| true)
                && recorded_as(&bed, false)
        },
        || "the per-namespace streams never relayed and checkpointed".into(),
    )
    .await;
    relay.stop().await;
    let from = bed.sim.current_rv();
    bed.sim.delete("pods", Some(&a), "p0").unwrap();
    for v in ["1", "2"] {
        let patch = serde_json::json!({"metadata": {"labels": {"v": v}}});
        bed.sim.merge_patch("pods", Some(&b), "p1", patch).unwrap();
    }

    // The first namespace's move writes its 3 members under the new stream and tombstones them
    // under the old one; the second's first record fails.
    memory.fail_to_after(&bed.membership, 7, 1);
    let relay = Relay::start_with(&bed, channel("clusterWide"), Some(memory.clone()));
    eventually(
        || {
            consumer_view(&pod_log()) == pods(&bed.sim, &[&a, &b], |_| true)
                && recorded_as(&bed, true)
        },
        || format!("never read cluster-wide: {:?}", pods_recorded(&bed)),
    )
    .await;
    relay.stop().await;
    let changes = bed.journal_after("pods", None, from);
    assert_eq!(changes.len(), 3);
    common::view::assert_published(&pod_log(), &changes, "a hand-over tried again");
}

/// An old namespace holding pods, outside the selector, while the selector's streams switch
/// to `allNamespaces` over the collection (the relay stopped meanwhile): its pods are older
/// than the gathered position, so the watch from there would not show them. The stream
/// resumes all the same and lists that namespace alone, announcing its pods: nothing of the
/// other namespaces collapses into a list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_namespace_with_pods_taken_in_by_a_switch_to_every_namespace_does_not_make_it_relist(
) {
    switch(false, Scope::All, Joins::Labelled, Bookmarks::Often).await;
}

/// The same with sharding on, the old and new replicas side by side: each shard's part takes
/// in what its position does not cover through its replica's shared read of the collection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_namespace_with_pods_taken_in_by_a_sharded_switch_to_every_namespace_does_not_make_it_relist(
) {
    switch(true, Scope::All, Joins::Labelled, Bookmarks::Often).await;
}

/// `namespaces: [a, b]` widened to `allNamespaces` read over the collection, while the relay
/// is down and pods change: the stream resumes from the namespaces' streams, and takes in the
/// pods of `c`, which the list had left out (and had retracted when it narrowed), before it
/// watches. Every change is published, nothing collapses into a list, and `c`'s pods come
/// back above their retraction's versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn widening_a_list_to_every_namespace_takes_the_others_in_and_resumes() {
    widen(false, false).await;
}

/// The same under exactly once: what is taken in, and the entry without the covered
/// namespaces, commit together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn widening_a_list_to_every_namespace_takes_the_others_in_exactly_once() {
    widen(false, true).await;
}

/// The same, the take-in cut short by a failed delivery: it is done again, and every pod of
/// `c` is announced (the first attempt's again, at least once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_in_cut_short_is_done_again() {
    widen(true, false).await;
}

/// The same under exactly once: the aborted attempt shows nothing, and each pod of `c` is
/// announced once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_in_cut_short_is_done_again_exactly_once() {
    widen(true, true).await;
}

/// `namespaces: [a, b, c]`, then `[a, b]`, then `allNamespaces` over the collection with pods
/// changed while the relay is down; with `fail`, the second record of the last start fails;
/// with `once`, under exactly once.
async fn widen(fail: bool, once: bool) {
    let (a, b) = namespaces();
    let c = format!("{a}-out");
    let bed = Bed::in_memory_serving(true, &[&a, &b, &c]).await;
    three_pods_in(&bed, &[&a, &b, &c]);
    let memory = Arc::new(Memory::new());
    let txns = once.then(|| Transactions::new(memory.clone()));
    let start = |mut cfg: Config| {
        if once {
            cfg.kafka.delivery = watchrelay::config::Delivery::ExactlyOnce;
        }
        Relay::start_with_txns(&bed, cfg, memory.clone(), txns.as_ref())
    };
    let pod_log = || pod_records(&memory);
    let by_version =
        || common::view::version_view_by(&pod_log(), |md| md["uid"].as_str().unwrap().to_string());
    let listed = |namespaces: &str| {
        bed.config(
            &format!("  - operationId: {CHANNEL}\n    namespaces: [{namespaces}]\n    topic: pods\n    watchStrategy: perNamespace\n"),
            "",
        )
    };
    // c in the list, then left out: its pods are retracted.
    for (config, scope) in [
        (listed(&format!("{a}, {b}, {c}")), vec![a.as_str(), &b, &c]),
        (listed(&format!("{a}, {b}")), vec![a.as_str(), &b]),
    ] {
        let relay = start(config);
        // Relayed, each namespace's stream checkpointed, and c's retired whole (its entry
        // gone last).
        let streams: BTreeSet<String> = scope.iter().map(|ns| format!("{CHANNEL}.{ns}")).collect();
        eventually(
            || {
                consumer_view(&pod_log()) == pods(&bed.sim, &scope, |_| true)
                    && pods_recorded(&bed).into_iter().collect::<BTreeSet<_>>() == streams
            },
            || format!("the consumer holds {:?}", consumer_view(&pod_log()).keys()),
        )
        .await;
        relay.stop().await;
    }
    let from = bed.sim.current_rv();
    four_changes(&bed, &a, &b);

    let every = bed.config(
        &format!("  - operationId: {CHANNEL}\n    allNamespaces: true\n    topic: pods\n    watchStrategy: clusterWide\n"),
        "",
    );
    let before = pod_log().len();
    if fail {
        memory.fail_to_after("pods", 1, 1);
    }
    let relay = start(every);
    let cluster = || pods(&bed.sim, &[&a, &b, &c], |_| true);
    eventually(
        || consumer_view(&pod_log()) == cluster() && by_version() == cluster(),
        || format!("the consumer holds {:?}", by_version().keys()),
    )
    .await;
    // Once taken in, the entry says so: a restart takes nothing in again.
    let entry = || {
        let cm = bed
            .sim
            .get("configmaps", Some(CHECKPOINT_NS), CHECKPOINT_NAME)?;
        let entry = cm["data"][format!("{CHANNEL}._all")].as_str()?.to_string();
        serde_json::from_str::<serde_json::Value>(&entry).ok()
    };
    eventually(
        || entry().is_some_and(|e| e.get("covered").is_none()),
        || format!("the entry still takes in: {:?}", entry()),
    )
    .await;
    relay.stop().await;
    let changes = bed.journal_after("pods", None, from);
    assert_eq!(changes.len(), 4);
    common::view::assert_published(&pod_log(), &changes, "widened to every namespace");
    // Each of c's pods announced by the take-in; once, unless it was cut short.
    let mut announced: BTreeMap<String, usize> = BTreeMap::new();
    for r in &pod_log()[before..] {
        if !r.tombstone && r.key.starts_with(&format!("{c}/")) {
            *announced.entry(r.key.clone()).or_default() += 1;
        }
    }
    let keys: BTreeSet<String> = (0..3).map(|i| format!("{c}/p{i}")).collect();
    assert_eq!(announced.keys().cloned().collect::<BTreeSet<_>>(), keys);
    if !fail || once {
        assert!(announced.values().all(|n| *n == 1), "{announced:?}");
    }
}
