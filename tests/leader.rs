//! Several replicas: one relays while the others stand by; a crashed leader's Lease is taken
//! over once it expires, a stopped leader's at once, and no change is lost across handovers.

mod common;

use std::time::Duration;

use common::bed::{assert_covers, eventually, Bed, Relay, CHECKPOINT_NS};
use common::kafka;
use watchrelay::config::Config;
use watchrelay_sim::ChurnSpec;

const LEASE: &str = "watchrelay-leader";

fn replica(cfg: &Config, identity: &str) -> Config {
    let mut cfg = cfg.clone();
    let le = &mut cfg.leader_election;
    le.enabled = true;
    le.identity = Some(identity.into());
    le.lease_duration_seconds = 3;
    le.renew_deadline_seconds = 2;
    le.retry_period_seconds = 1;
    cfg
}

async fn wait_leader(relay: &Relay) {
    eventually(
        || relay.metrics.leader.get() == 1,
        || "the replica never became leader".into(),
    )
    .await;
    relay.wait_up(1).await;
}

fn holder(bed: &Bed) -> Option<String> {
    let lease = bed
        .sim
        .get("leases.coordination.k8s.io", Some(CHECKPOINT_NS), LEASE)?;
    lease["spec"]["holderIdentity"].as_str().map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_relays_and_handovers_lose_nothing() {
    let bed = Bed::new(&["a"]).await;
    let topic = kafka::unique("leader");
    kafka::create_topics(&[&topic], 3).await;
    let cfg = bed.config(
        &format!("  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: {topic}\n"),
        "",
    );

    let a = Relay::start(&bed, replica(&cfg, "relay-a"));
    wait_leader(&a).await;
    let b = Relay::start(&bed, replica(&cfg, "relay-b"));
    let churn = bed.sim.start_churn(ChurnSpec {
        rate_per_sec: 150.0,
        namespaces: vec!["a".into()],
        resources: vec!["pods".into()],
        max_objects_per_kind: 30,
        total_events: None,
    });
    // Longer than the lease duration: the leader's renewals keep the standby out.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert_eq!(b.metrics.leader.get(), 0, "the standby relays too");
    assert!(b.streams.lock().unwrap().live.is_empty());
    assert_eq!(
        watchrelay::http::ready(&b.streams),
        (true, vec![]),
        "a standby is ready"
    );
    assert_eq!(holder(&bed).as_deref(), Some("relay-a"));

    // A crash leaves the Lease held: the standby takes it over once it has expired.
    a.kill().await;
    wait_leader(&b).await;
    assert_eq!(holder(&bed).as_deref(), Some("relay-b"));

    // A clean stop releases the Lease for the next standby.
    let c = Relay::start(&bed, replica(&cfg, "relay-c"));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(c.metrics.leader.get(), 0);
    b.stop().await;
    wait_leader(&c).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    churn.stop().await;

    let expected = bed.journal("pods", Some("a"));
    let msgs = bed.read_covering(&topic, &expected).await;
    assert_covers(&msgs, &expected);
    bed.wait_checkpoint_current("watchNamespacedPods.a").await;
    c.stop().await;
    assert_eq!(holder(&bed), None, "a stopped leader releases the Lease");
}
