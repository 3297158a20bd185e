//! The fast tier at scale: what the relay asks of the API server when it follows many
//! namespaces, counted by the simulator.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::bed::Bed;
use common::view::{self, consumer_view, events};
use watchrelay::producer::{Memory, Producer};
use watchrelay_sim::{objects, SimConfig};

const SELECTED: &str =
    "  - operationId: watchNamespacedPods\n    namespaceSelector: relay=yes\n    topic: pods\n";

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("ns{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_with_many_streams_runs_a_bounded_number_of_lists_at_once() {
    let namespaces = names(30);
    let refs: Vec<&str> = namespaces.iter().map(String::as_str).collect();
    let bed = Bed::in_memory(
        SimConfig {
            watch_list: false,
            list_delay: Duration::from_millis(40),
            ..SimConfig::default()
        },
        &refs,
    )
    .await;
    for ns in &refs {
        bed.label(ns, true);
        bed.sim
            .create("pods", Some(ns), objects::pod(ns, "p"))
            .unwrap();
    }
    let mut cfg = bed.config(SELECTED, "");
    cfg.kubernetes.max_concurrent_syncs = 3;
    let producer = Arc::new(Memory::new());
    let relay =
        common::bed::Relay::start_with(&bed, cfg, Some(producer.clone() as Arc<dyn Producer>));
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
