//! The fast tier: namespaces entering and leaving a channel's scope around crashes, failed
//! requests and pending joins. Whatever is interrupted, a consumer ends holding the objects of
//! the namespaces in scope, and nothing else.

mod common;

use std::sync::Arc;

use common::bed::{eventually, Bed, Relay};
use common::view::{consumer_view, consumer_view_by, events, json, pods, pods_by};
use watchrelay::producer::Producer;
use watchrelay::testing::{Memory, Order};
use watchrelay_sim::{objects, SimConfig};

/// The cluster-wide stream of the tests' channel.
const WIDE: &str = "watchNamespacedPods._all";

async fn bed() -> Bed {
    let bed = Bed::in_memory(SimConfig::default(), &["a", "b"]).await;
    for ns in ["a", "b"] {
        for i in 0..10 {
            bed.sim
                .create("pods", Some(ns), objects::pod(ns, &format!("p{i}")))
                .unwrap();
        }
    }
    bed
}

/// Pods of the namespaces labelled `relay=yes`, by one cluster-wide stream (`wide`) or one
/// stream per namespace.
fn start(bed: &Bed, producer: &Arc<Memory>, wide: bool) -> Relay {
    let strategy = if wide {
        "    watchStrategy: clusterWide\n"
    } else {
        ""
    };
    let cfg = bed.config(
        &format!("  - operationId: watchNamespacedPods\n    namespaceSelector: relay=yes\n    topic: pods\n{strategy}"),
        "",
    );
    Relay::start_with(bed, cfg, Some(producer.clone()))
}

/// What the consumer must hold: the pods of the labelled namespaces.
fn in_scope(bed: &Bed) -> std::collections::BTreeMap<String, String> {
    let labelled: Vec<&str> = ["a", "b"]
        .into_iter()
        .filter(|ns| {
            bed.sim
                .get("namespaces", None, ns)
                .is_some_and(|n| n["metadata"]["labels"]["relay"] == "yes")
        })
        .collect();
    pods(&bed.sim, &labelled, |_| true)
}

async fn converged(bed: &Bed, producer: &Memory) {
    eventually(
        || consumer_view(&events(producer)) == in_scope(bed),
        || {
            format!(
                "the consumer holds {:?}\nthe scope {:?}",
                consumer_view(&events(producer)).keys(),
                in_scope(bed).keys()
            )
        },
    )
    .await;
}

/// Inferred DELETEDs of namespace `ns` delivered so far.
fn inferred_deletes(producer: &Memory, ns: &str) -> usize {
    events(producer)
        .iter()
        .filter(|r| !r.tombstone && r.key.starts_with(&format!("{ns}/")))
        .filter(|r| json(r)["watchrelay"]["synthetic"] == true)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_while_a_namespace_leaves_a_cluster_wide_stream_is_reconciled() {
    let bed = bed().await;
    bed.label("a", true);
    bed.label("b", true);
    let producer = Arc::new(Memory::new());
    let relay = start(&bed, &producer, true);
    converged(&bed, &producer).await;
    // Kafka writes some of the leave's DELETEDs, then the relay dies.
    producer.hold(true);
    bed.label("b", false);
    eventually(
        || {
            producer.release_first(1, Order::Sent);
            inferred_deletes(&producer, "b") >= 2
        },
        || "the leave never began".into(),
    )
    .await;
    relay.kill().await;
    producer.purge();
    producer.hold(false);
    // Back in scope at the next start, under the same namespaces as the last checkpoint.
    bed.label("b", true);
    let relay = start(&bed, &producer, true);
    converged(&bed, &producer).await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_leaving_while_its_joins_are_pending_leaves_no_ghost() {
    let bed = bed().await;
    bed.label("a", true);
    let producer = Arc::new(Memory::new());
    let relay = start(&bed, &producer, false);
    converged(&bed, &producer).await;
    // Its stream announces b's pods; Kafka has not acknowledged one join yet.
    producer.hold(true);
    bed.label("b", true);
    let stream = "watchNamespacedPods.b";
    eventually(
        || relay.stream_up(stream),
        || "b's stream never synced".into(),
    )
    .await;
    bed.label("b", false);
    eventually(
        || !relay.stream_up(stream),
        || "b's stream never stopped".into(),
    )
    .await;
    producer.hold(false);
    producer.release(Order::Sent);
    // What the joins announced is deleted, after it.
    eventually(
        || inferred_deletes(&producer, "b") == 10,
        || {
            format!(
                "{} of b's 10 pods deleted",
                inferred_deletes(&producer, "b")
            )
        },
    )
    .await;
    converged(&bed, &producer).await;
    relay.stop().await;
    assert_eq!(consumer_view(&events(&producer)), in_scope(&bed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_namespace_entry_deletes_what_went_meanwhile() {
    let bed = bed().await;
    bed.label("a", true);
    let producer = Arc::new(Memory::new());
    let relay = start(&bed, &producer, true);
    converged(&bed, &producer).await;
    // The entry list's second page fails, again and again: the first page is announced.
    bed.sim.fail_next_pages(usize::MAX);
    bed.label("b", true);
    eventually(
        || consumer_view(&events(&producer)).contains_key("b/p0"),
        || "b's first page was never announced".into(),
    )
    .await;
    // Deleted while the namespace is not yet applied: its watch event is dropped.
    bed.sim.delete("pods", Some("b"), "p0").unwrap();
    bed.sim.fail_next_pages(0);
    converged(&bed, &producer).await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leave_whose_deletes_kafka_refuses_tries_again_in_the_same_run() {
    let bed = bed().await;
    bed.label("a", true);
    bed.label("b", true);
    let producer = Arc::new(Memory::new());
    let relay = start(&bed, &producer, false);
    converged(&bed, &producer).await;
    // The first DELETEDs of the leave are refused: the stream tries again, and is retired
    // only once every one of b's pods has its DELETED, without waiting for a restart.
    producer.fail_next_to("pods", 3);
    bed.label("b", false);
    converged(&bed, &producer).await;
    let versioned = events(&producer)
        .iter()
        .filter(|r| !r.tombstone)
        .all(|r| json(r)["watchrelay"]["version"].is_string());
    assert!(versioned, "every record carries its version");
    relay.stop().await;
}

/// A cluster-wide stream filtered to its namespaces, stopped while one namespace enters its
/// scope and another leaves it, and the pods of the one that stays change twice each: the next
/// start resumes from its position and takes the move in (the entering namespace listed, the
/// leaving one's members deleted). Every change of the namespace that stayed is published once,
/// none collapsed into a list of the whole scope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_that_moved_while_down_resumes_and_takes_the_move_in() {
    let (bed, log, from) = moved_while_down(0).await;
    common::view::assert_published(
        &log,
        &bed.journal_after("pods", Some("a"), from),
        "the changes of a namespace that stayed in scope while the scope moved",
    );
    assert_eq!(
        published_of(&log, "a"),
        15,
        "each pod of a announced once and each of its changes published once"
    );
}

/// As above, but a namespace (`d0`) was in scope at the position without an object, so the
/// members alone cannot tell which namespaces the position covered. While the relay is down,
/// `d0` also gets pods that change: the next start still resumes from the position (the
/// members' namespaces with `d0` match its fingerprint), and takes `c` in from it. Every change
/// of `a` and `d0` after the position is published once, none collapsed into a list, and `c`'s
/// pods are announced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_with_an_empty_namespace_that_moved_while_down_still_resumes() {
    with_empty_namespaces_moved_while_down(1).await;
}

/// As above with twelve namespaces in scope at the position without an object, and `c`
/// entering: past the ten whose every combination the fingerprint alone can be tried with. The
/// set-sum saved beside it tells which namespaces the position covered, so the start still
/// resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_with_twelve_empty_namespaces_that_moved_while_down_still_resumes() {
    with_empty_namespaces_moved_while_down(12).await;
}

async fn with_empty_namespaces_moved_while_down(empty: usize) {
    let (bed, log, from) = moved_while_down(empty).await;
    for ns in ["a", "d0"] {
        common::view::assert_published(
            &log,
            &bed.journal_after("pods", Some(ns), from),
            &format!(
                "the changes of namespace {ns}, in scope at the position, while the scope moved"
            ),
        );
    }
    assert_eq!(
        published_of(&log, "a"),
        15,
        "each pod of a announced once and each of its changes published once"
    );
    assert_eq!(
        published_of(&log, "d0"),
        6,
        "each change of d0's pods published once"
    );
    assert_eq!(published_of(&log, "c"), 5, "each pod of c announced once");
}

/// A crash after a leave was stamped on the checkpoints but before its members' tombstones
/// reached Kafka: the next start finds members of a namespace its position did not cover (a
/// member too many), under a scope that moved meanwhile (`c` entered). The saved set-sum tells
/// that too, so the start still resumes, and the members left behind are deleted again (a
/// superfluous inferred DELETED each). Every change of the namespace that stayed, made while the
/// relay was down, is published once, none collapsed into a list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_too_many_after_a_crash_still_resumes() {
    let bed = Bed::in_memory(SimConfig::default(), &["a", "b", "c"]).await;
    for ns in ["a", "b", "c"] {
        for i in 0..10 {
            bed.sim
                .create("pods", Some(ns), objects::pod(ns, &format!("p{i}")))
                .unwrap();
        }
    }
    bed.label("a", true);
    bed.label("b", true);
    let producer = Arc::new(Memory::new());
    let relay = start(&bed, &producer, true);
    converged(&bed, &producer).await;
    let query = |c: &std::collections::HashMap<String, watchrelay::checkpoint::Saved>| {
        c.values().find_map(|s| s.query.clone())
    };
    let before = query(&bed.checkpoints());
    // b leaves: its DELETEDs are acknowledged, its members' tombstones are not.
    producer.hold_to(Some(&bed.membership));
    bed.label("b", false);
    eventually(
        || inferred_deletes(&producer, "b") == 10,
        || "b's pods were never deleted".into(),
    )
    .await;
    // A change of `a`, acknowledged: a position under the scope without `b`.
    let step = |i: usize, step: &str| {
        let patch = serde_json::json!({"metadata": {"labels": {"step": step}}});
        bed.sim
            .merge_patch("pods", Some("a"), &format!("p{i}"), patch)
            .unwrap();
    };
    step(0, "0");
    let rv = bed.sim.current_rv();
    bed.wait_checkpoint(|c| {
        query(c) != before
            && c.values()
                .any(|s| s.rv.as_deref().and_then(|v| v.parse::<u64>().ok()) >= Some(rv))
    })
    .await;
    relay.kill().await;
    producer.purge();
    producer.hold_to(None);
    let from = bed.sim.current_rv();
    for i in 0..10 {
        step(i, "1");
        step(i, "2");
    }
    // And `c` enters while the relay is down: the start is under other namespaces.
    bed.label("c", true);
    let relay = start(&bed, &producer, true);
    // The change checkpointed before the kill, and the twenty made while down.
    resumed_with_every_change_of_a(&bed, &producer, relay, &["a", "c"], from, 21).await;
}

/// Once the consumer holds the pods of `scope` as they are (the relay then stopped): no
/// position was dropped, every change of `a`'s pods after `from` was published, and the records
/// of `a`'s pods from the first that carries a `step` label are `changes`, each change once.
async fn resumed_with_every_change_of_a(
    bed: &Bed,
    producer: &Memory,
    relay: Relay,
    scope: &[&str],
    from: u64,
    changes: usize,
) {
    let rv = |md: &serde_json::Value| md["resourceVersion"].as_str().unwrap().to_string();
    eventually(
        || consumer_view_by(&events(producer), rv) == pods_by(&bed.sim, scope, |_| true, rv),
        || "the consumer never held the pods in scope as they are".into(),
    )
    .await;
    assert_eq!(relay.counter("positions_dropped_total", WIDE), 0);
    relay.stop().await;
    let log = events(producer);
    assert_eq!(consumer_view(&log), pods(&bed.sim, scope, |_| true));
    common::view::assert_published(
        &log,
        &bed.journal_after("pods", Some("a"), from),
        "the changes of a namespace that stayed in scope, made while the relay was down",
    );
    let after = log
        .iter()
        .skip_while(|r| !json(r)["object"]["metadata"]["labels"]["step"].is_string())
        .filter(|r| !r.tombstone && r.key.starts_with("a/"))
        .count();
    assert_eq!(after, changes, "each change of a's pods published once");
}

/// A namespace in scope at the position without an object, out of scope now (unlabelled, or
/// deleted, while the relay was down), is in neither the members nor the scope: no name tells
/// it. The invertible table saved beside the position reads it back, so the start still
/// resumes: every change of a namespace that stayed, made while the relay was down, is
/// published once, none collapsed into a list, and no position is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_namespace_gone_from_the_scope_while_down_is_read_back_and_resumed() {
    let (bed, producer, from) = gone_while_down(0).await;
    let relay = start(&bed, &producer, true);
    resumed_with_every_change_of_a(&bed, &producer, relay, &["a", "b"], from, 6).await;
}

/// Such namespaces gone (one unlabelled, one deleted) beside more moves than the table reads
/// (sixty entered), so that neither the set-sum nor the table can tell them: the start lists
/// the namespaces in scope at exactly the position, which names them, and resumes. Every change
/// of a namespace that stayed, made while the relay was down, is published once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_namespaces_gone_among_many_moves_are_named_by_the_server_and_resumed() {
    let (bed, producer, from) = gone_while_down(60).await;
    let relay = start(&bed, &producer, true);
    resumed_with_every_change_of_a(&bed, &producer, relay, &["a", "b"], from, 6).await;
}

/// The limit: the same, with the history compacted past the position, so that the server can
/// no longer say which namespaces were in scope then (nor replay the changes after it). The
/// start drops the position, reconciles with a list, and counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_namespaces_gone_among_many_moves_past_the_history_drop_the_position() {
    let (bed, producer, _) = gone_while_down(60).await;
    bed.sim.compact();
    let relay = start(&bed, &producer, true);
    relay.wait_counter("positions_dropped_total", WIDE, 1).await;
    converged(&bed, &producer).await;
    relay.stop().await;
}

/// The three tests above: pods in `a` and `b`, in scope with `d` and `e` (without pods);
/// stopped once the consumer holds them; then `a`'s pods change twice each, `d` is unlabelled,
/// `e` deleted and `entering` namespaces without pods labelled in. The bed, the records, and
/// the position the changes came after.
async fn gone_while_down(entering: usize) -> (Bed, Arc<Memory>, u64) {
    let entering: Vec<String> = (0..entering).map(|i| format!("e{i:02}")).collect();
    let mut namespaces = vec!["a", "b", "d", "e"];
    namespaces.extend(entering.iter().map(String::as_str));
    let bed = Bed::in_memory(SimConfig::default(), &namespaces).await;
    for ns in ["a", "b"] {
        for i in 0..3 {
            bed.sim
                .create("pods", Some(ns), objects::pod(ns, &format!("p{i}")))
                .unwrap();
        }
    }
    for ns in ["a", "b", "d", "e"] {
        bed.label(ns, true);
    }
    let producer = Arc::new(Memory::new());
    let relay = start(&bed, &producer, true);
    converged(&bed, &producer).await;
    relay.stop().await;
    let from = bed.sim.current_rv();
    for i in 0..3 {
        for step in ["1", "2"] {
            let patch = serde_json::json!({"metadata": {"labels": {"step": step}}});
            bed.sim
                .merge_patch("pods", Some("a"), &format!("p{i}"), patch)
                .unwrap();
        }
    }
    bed.label("d", false);
    bed.sim.delete("namespaces", None, "e").unwrap();
    for ns in &entering {
        bed.label(ns, true);
    }
    (bed, producer, from)
}

/// The tests above: pods in `a`, `b` and `c`, `a` and `b` in scope with `empty` namespaces
/// without pods (`d0`, `d1`, ...); stopped once the consumer holds them; then `a`'s pods change
/// twice each (and `d0` gets three pods that change), `c` enters and `b` leaves; started again
/// until the consumer holds the scope. Returns the bed, the records, and the position the
/// changes came after.
async fn moved_while_down(empty: usize) -> (Bed, Vec<watchrelay::producer::Record>, u64) {
    let empties: Vec<String> = (0..empty).map(|i| format!("d{i}")).collect();
    let mut namespaces = vec!["a", "b", "c"];
    namespaces.extend(empties.iter().map(String::as_str));
    let bed = Bed::in_memory(SimConfig::default(), &namespaces).await;
    for ns in ["a", "b", "c"] {
        for i in 0..5 {
            bed.sim
                .create("pods", Some(ns), objects::pod(ns, &format!("p{i}")))
                .unwrap();
        }
    }
    for ns in ["a", "b"]
        .into_iter()
        .chain(empties.iter().map(String::as_str))
    {
        bed.label(ns, true);
    }
    let producer = Arc::new(Memory::new());
    let relay = start(&bed, &producer, true);
    converged(&bed, &producer).await;
    relay.stop().await;
    let from = bed.sim.current_rv();
    let step = |ns: &str, i: usize, step: &str| {
        let patch = serde_json::json!({"metadata": {"labels": {"step": step}}});
        bed.sim
            .merge_patch("pods", Some(ns), &format!("p{i}"), patch)
            .unwrap();
    };
    for i in 0..5 {
        step("a", i, "0");
        step("a", i, "1");
    }
    if empty > 0 {
        for i in 0..3 {
            bed.sim
                .create("pods", Some("d0"), objects::pod("d0", &format!("p{i}")))
                .unwrap();
            step("d0", i, "1");
        }
    }
    bed.label("c", true);
    bed.label("b", false);

    let relay = start(&bed, &producer, true);
    let mut scope = vec!["a", "c"];
    scope.extend(empties.iter().map(String::as_str));
    let want = pods(&bed.sim, &scope, |_| true);
    eventually(
        || consumer_view(&events(&producer)) == want,
        || {
            format!(
                "the consumer holds {:?}",
                consumer_view(&events(&producer)).keys()
            )
        },
    )
    .await;
    relay.stop().await;
    let log = events(&producer);
    (bed, log, from)
}

/// The records of namespace `ns`'s pods in `log`, tombstones left out.
fn published_of(log: &[watchrelay::producer::Record], ns: &str) -> usize {
    log.iter()
        .filter(|r| !r.tombstone && r.key.starts_with(&format!("{ns}/")))
        .count()
}
