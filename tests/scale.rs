//! The fast tier at scale: what the relay asks of the API server when it follows many
//! namespaces, counted by the simulator.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::bed::{Bed, Relay};
use common::view::{self, consumer_view, events};
use watchrelay::testing::Memory;
use watchrelay_sim::{objects, SimConfig};

const SELECTED: &str =
    "  - operationId: watchNamespacedPods\n    namespaceSelector: relay=yes\n    topic: pods\n";

fn start(bed: &Bed, cfg: watchrelay::config::Config, producer: &Arc<Memory>) -> Relay {
    Relay::start_with(bed, cfg, Some(producer.clone()))
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("ns{i}")).collect()
}

/// A simulator whose lists take a while (no `sendInitialEvents`), with a pod in each of
/// `namespaces`, every one labelled `relay=yes`.
async fn slow_lists(namespaces: &[&str]) -> Bed {
    let bed = Bed::in_memory(
        SimConfig {
            watch_list: false,
            list_delay: Duration::from_millis(40),
            ..SimConfig::default()
        },
        namespaces,
    )
    .await;
    for ns in namespaces {
        bed.label(ns, true);
        bed.sim
            .create("pods", Some(ns), objects::pod(ns, "p"))
            .unwrap();
    }
    bed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_with_many_streams_runs_a_bounded_number_of_lists_at_once() {
    let namespaces = names(30);
    let refs: Vec<&str> = namespaces.iter().map(String::as_str).collect();
    let bed = slow_lists(&refs).await;
    let mut cfg = bed.config(SELECTED, "");
    cfg.kubernetes.max_concurrent_syncs = 3;
    let producer = Arc::new(Memory::new());
    let relay = start(&bed, cfg, &producer);
    relay.wait_up(refs.len()).await;
    let counts = bed.sim.requests();
    relay.stop().await;
    // The streams' lists, three at a time, and the one list of namespaces the selector is
    // followed with.
    assert!(
        counts.peak_lists_in_flight <= 3 + 1,
        "{counts:?}: more lists at once than kubernetes.maxConcurrentSyncs allows"
    );
    assert!(counts.lists >= 30, "{counts:?}");
    let cluster = view::pods(&bed.sim, &refs, |_| true);
    assert_eq!(consumer_view(&events(&producer)), cluster);
}

/// `kubernetes.maxConcurrentSyncs` bounds the process, not each shard: one replica owning 16
/// shards of 30 namespaces runs 3 lists at once at most, as an unsharded relay does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_owning_many_shards_runs_a_bounded_number_of_lists_at_once() {
    let namespaces = names(30);
    let refs: Vec<&str> = namespaces.iter().map(String::as_str).collect();
    let bed = slow_lists(&refs).await;
    let channel = format!(
        "  - operationId: watchNamespacedPods\n    namespaces: [{}]\n    topic: pods\n    watchStrategy: perNamespace\n",
        refs.join(", ")
    );
    let mut cfg = common::bed::sharded(bed.config(&channel, ""), 16);
    cfg.kubernetes.max_concurrent_syncs = 3;
    let producer = Arc::new(Memory::new());
    let group = watchrelay::testing::MemoryGroup::default();
    let relay = Relay::start_in(&bed, cfg, producer.clone(), &group);
    relay.wait_up(refs.len()).await;
    let counts = bed.sim.requests();
    relay.stop().await;
    assert!(
        counts.peak_lists_in_flight <= 3,
        "{counts:?}: more lists at once than kubernetes.maxConcurrentSyncs allows"
    );
    let cluster = view::pods(&bed.sim, &refs, |_| true);
    assert_eq!(consumer_view(&events(&producer)), cluster);
}

/// What the cluster holds of the namespaces labelled `relay=yes`: key -> uid.
fn labelled_pods(bed: &Bed) -> std::collections::BTreeMap<String, String> {
    let selected: Vec<String> = bed
        .sim
        .list("namespaces", None)
        .into_iter()
        .filter(|n| n["metadata"]["labels"]["relay"] == "yes")
        .map(|n| n["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    let refs: Vec<&str> = selected.iter().map(String::as_str).collect();
    view::pods(&bed.sim, &refs, |_| true)
}

async fn converged(bed: &Bed, producer: &Memory) {
    common::bed::eventually(
        || consumer_view(&events(producer)) == labelled_pods(bed),
        || {
            let view = consumer_view(&events(producer));
            let cluster = labelled_pods(bed);
            let extra: Vec<_> = view.keys().filter(|k| !cluster.contains_key(*k)).collect();
            let missing: Vec<_> = cluster.keys().filter(|k| !view.contains_key(*k)).collect();
            format!("the consumer's view never matched the cluster: extra {extra:?}, missing {missing:?}")
        },
    )
    .await;
}

fn pods(bed: &Bed, ns: &str, names: &[&str]) {
    for n in names {
        bed.sim
            .create("pods", Some(ns), objects::pod(ns, n))
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_over_hundreds_of_namespaces_is_served_by_one_watch() {
    let namespaces = names(260);
    let refs: Vec<&str> = namespaces.iter().map(String::as_str).collect();
    let bed = Bed::in_memory(SimConfig::default(), &refs).await;
    // 250 in scope, 10 not: the default `auto` goes cluster-wide above 100.
    for (i, ns) in refs.iter().enumerate() {
        bed.label(ns, i < 250);
        pods(&bed, ns, &["p", "q"]);
    }
    let mut cfg = bed.config(SELECTED, "");
    cfg.kubernetes.list_page_size = 500;
    let producer = Arc::new(Memory::new());
    bed.sim.reset_requests();
    let relay = start(&bed, cfg, &producer);
    relay.wait_up(1).await;
    converged(&bed, &producer).await;
    let start = bed.sim.requests();
    assert!(
        start.watches_open <= 2,
        "{start:?}: one watch of pods and one of namespaces"
    );
    assert!(
        start.lists <= 6,
        "{start:?}: a few pages, not a list per namespace"
    );

    // Namespaces enter and leave the scope while it runs; objects change in and out of scope.
    for ns in ["ns250", "ns251", "ns252"] {
        bed.label(ns, true);
    }
    for ns in ["ns0", "ns1", "ns2"] {
        bed.label(ns, false);
    }
    pods(&bed, "ns10", &["late"]);
    pods(&bed, "ns255", &["outside"]);
    bed.sim.delete("pods", Some("ns11"), "p").unwrap();
    bed.sim
        .merge_patch(
            "pods",
            Some("ns250"),
            "p",
            serde_json::json!({"metadata": {"labels": {"changed": "yes"}}}),
        )
        .unwrap();
    bed.label("ns1", true);
    converged(&bed, &producer).await;
    let running = bed.sim.requests();
    assert!(running.watches_open <= 2, "{running:?}");
    assert!(
        relay.counter("events_received_total", "watchNamespacedPods._all") > 0,
        "the metrics are the channel's one stream's"
    );
    relay.stop().await;

    // Nothing was ever published about a namespace out of scope.
    let log = events(&producer);
    assert!(
        log.iter()
            .all(|r| !r.key.starts_with("ns255/") && !r.key.starts_with("ns259/")),
        "a record about a namespace that was never in scope"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_of_watch_strategy_across_restarts_loses_nothing_and_leaves_no_ghost() {
    let namespaces = names(6);
    let refs: Vec<&str> = namespaces.iter().map(String::as_str).collect();
    let bed = Bed::in_memory(SimConfig::default(), &refs).await;
    for (i, ns) in refs.iter().enumerate() {
        bed.label(ns, i < 4);
        pods(&bed, ns, &["p", "q"]);
    }
    let producer = Arc::new(Memory::new());
    let strategies = ["perNamespace", "clusterWide", "perNamespace", "clusterWide"];
    for (round, strategy) in strategies.iter().enumerate() {
        let channels = format!("{SELECTED}    watchStrategy: {strategy}\n");
        let relay = start(&bed, bed.config(&channels, ""), &producer);
        converged(&bed, &producer).await;
        // While it runs, and then while it is down: the scope and the objects move.
        let r = round.to_string();
        pods(&bed, "ns0", &[&format!("live{r}")]);
        bed.label(refs[(round + 4) % 6], true);
        converged(&bed, &producer).await;
        relay.stop().await;
        bed.sim.delete("pods", Some(refs[round % 4]), "q").unwrap();
        pods(&bed, refs[(round + 1) % 4], &[&format!("down{r}")]);
        bed.label(refs[(round + 5) % 6], false);
    }
    let relay = start(&bed, bed.config(SELECTED, ""), &producer);
    converged(&bed, &producer).await;
    relay.stop().await;
}

/// A cluster-wide stream filtered to its namespaces whose scope is settled replays its watch
/// from the checkpoint after a failed delivery, as any stream does: every change is published,
/// none collapsed into a list (before, it resynced whole and published only each object's
/// last state).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delivery_of_a_settled_cluster_wide_stream_publishes_every_change() {
    let namespaces = names(3);
    let refs: Vec<&str> = namespaces.iter().map(String::as_str).collect();
    let bed = Bed::in_memory(SimConfig::default(), &refs).await;
    for ns in &refs {
        bed.label(ns, true);
        pods(&bed, ns, &["p"]);
    }
    let channels = format!("{SELECTED}    watchStrategy: clusterWide\n");
    let producer = Arc::new(Memory::new());
    let relay = start(&bed, bed.config(&channels, ""), &producer);
    converged(&bed, &producer).await;
    let from = bed.sim.current_rv();
    producer.fail_next_to("pods", 2);
    for round in 0..4 {
        for ns in &refs {
            bed.sim
                .merge_patch(
                    "pods",
                    Some(ns),
                    "p",
                    serde_json::json!({"metadata": {"labels": {"round": round.to_string()}}}),
                )
                .unwrap();
        }
    }
    relay
        .wait_counter("watch_restarts_total", "watchNamespacedPods._all", 1)
        .await;
    let journal = bed.journal_after("pods", None, from);
    common::bed::eventually(
        || view::unpublished(&events(&producer), &journal).is_empty(),
        || {
            format!(
                "changes never published: {:?}",
                view::unpublished(&events(&producer), &journal)
            )
        },
    )
    .await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delivery_while_a_namespace_enters_a_cluster_wide_stream_loses_nothing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("watchrelay=debug")
        .try_init();
    let namespaces = names(5);
    let refs: Vec<&str> = namespaces.iter().map(String::as_str).collect();
    let bed = Bed::in_memory(SimConfig::default(), &refs).await;
    for (i, ns) in refs.iter().enumerate() {
        bed.label(ns, i < 4);
        pods(&bed, ns, &["p", "q", "r"]);
    }
    let channels = format!("{SELECTED}    watchStrategy: clusterWide\n");
    let producer = Arc::new(Memory::new());
    let run = || start(&bed, bed.config(&channels, ""), &producer);
    let relay = run();
    converged(&bed, &producer).await;
    // The entering namespace's objects come from a list, not the watch: a failed delivery
    // among them must not be replayed from the watch alone.
    producer.fail_next_to("pods", 2);
    bed.label("ns4", true);
    relay
        .wait_counter("watch_restarts_total", "watchNamespacedPods._all", 1)
        .await;
    converged(&bed, &producer).await;
    relay.stop().await;

    // A restart under the same namespaces resumes its watch: no list of the collection.
    bed.sim.reset_requests();
    let relay = run();
    relay.wait_up(1).await;
    pods(&bed, "ns4", &["after"]);
    converged(&bed, &producer).await;
    relay.stop().await;
    let pod_lists = bed.sim.requests().lists;
    assert!(
        pod_lists <= 2,
        "{pod_lists} lists: only the namespace follower's (and the strategy's count)"
    );
}
