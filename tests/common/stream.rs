//! The stream tests' bed (`tests/stream_*.rs`): the whole relay in-process against the
//! simulator, relaying the pods of namespace `a` (stream [`STREAM`]) to topic `pods` through a
//! producer in memory.

use std::collections::BTreeMap;
use std::sync::Arc;

use watchrelay::config::Config;
use watchrelay::testing::Memory;
use watchrelay_sim::objects;

use super::bed::{eventually, Bed, Relay};
use super::view::{self, consumer_view, events};

/// The stream of the pods channel over namespace `a`.
pub const STREAM: &str = "watchNamespacedPods.a";

/// The pods channel over namespace `a`, with `kafka_extra` lines under `kafka:`.
pub fn config(bed: &Bed, kafka_extra: &str) -> Config {
    bed.config(
        "  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: pods\n",
        kafka_extra,
    )
}

/// A simulator with namespace `a`, serving `sendInitialEvents` watches or not.
pub async fn bed(watch_list: bool) -> Bed {
    Bed::in_memory_serving(watch_list, &["a"]).await
}

pub fn start(bed: &Bed, cfg: Config, producer: &Arc<Memory>) -> Relay {
    Relay::start_with(bed, cfg, Some(producer.clone()))
}

/// A bed with a relay of the pods channel running and watching, its records in memory.
pub async fn running() -> (Bed, Arc<Memory>, Relay) {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_up(1).await;
    (bed, producer, relay)
}

/// What the cluster holds: key -> uid.
pub fn cluster_view(bed: &Bed) -> BTreeMap<String, String> {
    view::pods(&bed.sim, &["a"], |_| true)
}

/// What a consumer holds after applying every delivered record is what the cluster holds.
pub fn assert_converged(bed: &Bed, producer: &Memory) {
    assert_eq!(consumer_view(&events(producer)), cluster_view(bed));
}

/// Creates a pod of each name in namespace `a`.
pub fn create(bed: &Bed, names: impl IntoIterator<Item = String>) {
    for n in names {
        bed.sim
            .create("pods", Some("a"), objects::pod("a", &n))
            .unwrap();
    }
}

/// The resourceVersion of the last change to the pods of `a`.
pub fn last_pod_rv(bed: &Bed) -> u64 {
    bed.journal("pods", Some("a")).last().map(|e| e.rv).unwrap()
}

/// The resourceVersion of the first change to the pods of `a` after `rv`.
pub fn first_pod_rv_after(bed: &Bed, rv: u64) -> u64 {
    let journal = bed.journal("pods", Some("a"));
    journal.iter().find(|e| e.rv > rv).map(|e| e.rv).unwrap()
}

/// Asserts that the stream's checkpoint is below `first`: none of the changes from it on was
/// checkpointed. (An idle stream's checkpoint moves with the server's bookmarks, so its value
/// before them is no fixed point.)
pub fn assert_checkpoint_before(bed: &Bed, first: u64) {
    let at = bed.checkpoint_rv(STREAM).unwrap_or_default();
    assert!(at < first, "checkpointed at {at}, past {first}");
}

/// Waits until the stream's checkpoint covers every change made to its pods so far.
pub async fn wait_covered(bed: &Bed) {
    bed.wait_pods_covered(STREAM, "a").await;
}

/// Waits until the producer holds `n` records.
pub async fn wait_held(producer: &Memory, n: usize) {
    eventually(
        || producer.held() == n,
        || format!("held {}", producer.held()),
    )
    .await;
}

/// Waits until the stream saved a first checkpoint.
pub async fn wait_until_saved(bed: &Bed) {
    bed.wait_checkpoint(|c| c.get(STREAM).is_some_and(|s| s.rv.is_some()))
        .await;
}
