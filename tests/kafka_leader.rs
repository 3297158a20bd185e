//! Several replicas: one relays while the others stand by. A crashed leader's Lease is taken
//! over once it expires, a stopped leader releases it, a leader that cannot renew stops
//! relaying, and no change is lost across any of these handovers.

mod common;

use std::time::Duration;

use common::bed::{assert_covers, eventually, Bed, Relay, CHECKPOINT_NS};
use common::kafka;
use watchrelay::config::Config;
use watchrelay::registry::Readiness;
use watchrelay_sim::ChurnSpec;

const LEASE: &str = "watchrelay-leader";
const LEASES: &str = "leases.coordination.k8s.io";

fn replica(cfg: &Config, identity: &str) -> Config {
    let mut cfg = cfg.clone();
    let le = &mut cfg.leader_election;
    le.enabled = true;
    le.identity = Some(identity.into());
    le.lease_duration_seconds = 4;
    le.renew_deadline_seconds = 3;
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
    let lease = bed.sim.get(LEASES, Some(CHECKPOINT_NS), LEASE)?;
    lease["spec"]["holderIdentity"].as_str().map(str::to_string)
}

fn held_by(bed: &Bed, prefix: &str) -> bool {
    holder(bed).is_some_and(|h| h.starts_with(&format!("{prefix}_")))
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

    let a = Relay::start(&bed, replica(&cfg, "relay"));
    wait_leader(&a).await;
    // The same configured identity: the per-process suffix keeps the replicas apart.
    let b = Relay::start(&bed, replica(&cfg, "relay"));
    let churn = bed.sim.start_churn(ChurnSpec {
        rate_per_sec: 150.0,
        namespaces: vec!["a".into()],
        resources: vec!["pods".into()],
        max_objects_per_kind: 30,
        total_events: None,
    });
    let a_name = holder(&bed).expect("a holds the lease");
    // Longer than the lease duration: the leader's renewals keep the standby out. Not a wait: that
    // the standby stays out is seen only once a Lease left unrenewed would have expired.
    tokio::time::sleep(Duration::from_millis(5500)).await;
    assert_eq!(b.metrics.leader.get(), 0, "the standby relays too");
    assert!(b.registry.phases().is_empty());
    assert_eq!(
        b.registry.readiness(),
        Readiness {
            ready: true,
            down: vec![],
            problems: Default::default(),
            blocked: None,
        },
        "a standby is ready"
    );
    assert_eq!(holder(&bed), Some(a_name.clone()));

    // A crash leaves the Lease held: the standby takes it over once it has expired.
    a.kill().await;
    wait_leader(&b).await;
    let b_name = holder(&bed).expect("b holds the lease");
    assert_ne!(b_name, a_name);

    // A clean stop releases the Lease for the next standby.
    let c = Relay::start(&bed, replica(&cfg, "other"));
    // Not a wait: that c stands by while b leads is seen only once c had time (more than its
    // retry period) to try for the Lease.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(c.metrics.leader.get(), 0);
    b.stop().await;
    assert!(
        holder(&bed).is_none() || held_by(&bed, "other"),
        "the stopped leader still holds the Lease"
    );
    wait_leader(&c).await;

    // A leader that cannot renew stops relaying; once it can again, it goes on.
    bed.sim.deny(LEASES);
    eventually(
        || c.metrics.leader.get() == 0 && c.registry.phases().is_empty(),
        || "the leader went on relaying without its Lease".into(),
    )
    .await;
    bed.sim.allow(LEASES);
    wait_leader(&c).await;
    // Churn goes on until c relays changes made since it leads again.
    bed.wait_checkpoint_past("watchNamespacedPods.a", bed.sim.current_rv())
        .await;
    churn.stop().await;

    let expected = bed.journal("pods", Some("a"));
    let msgs = bed.read_covering(&topic, &expected).await;
    assert_covers(&msgs, &expected);
    bed.wait_checkpoint_current("watchNamespacedPods.a").await;
    c.stop().await;
    assert_eq!(holder(&bed), None, "a stopped leader releases the Lease");
}
