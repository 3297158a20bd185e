//! Shared fixture: a simulator with namespace `shop` and a kube client for it.

use std::time::Duration;

use watchrelay_sim::{objects, Sim, SimConfig};

/// Bookmarks come every 300 ms so tests see them quickly.
pub async fn setup() -> (Sim, kube::Client) {
    let sim = Sim::start(SimConfig {
        bookmark_interval: Duration::from_millis(300),
        ..Default::default()
    })
    .await
    .unwrap();
    sim.create("namespaces", None, objects::namespace("shop"))
        .unwrap();
    let client = kube::Client::try_from(kube::Config::new(sim.url().parse().unwrap())).unwrap();
    (sim, client)
}
