//! Deployment shapes through the broker: two releases restarting in turn, a scope-shape change
//! across a restart, a membership topic that would drop members.

mod common;

use std::time::Duration;

use common::bed::{eventually, Bed, Relay};
use common::kafka;
use common::view::{self, kafka_view};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;
use watchrelay::config::Config;
use watchrelay_sim::objects;

fn release(bed: &Bed, name: &str, scope: &str, topic: &str) -> Config {
    let mut cfg = bed.config(
        &format!("  - operationId: watchNamespacedPods\n    {scope}\n    topic: {topic}\n"),
        "",
    );
    cfg.checkpoint.name = name.into();
    cfg
}

fn create(bed: &Bed, ns: &str, names: std::ops::Range<u32>) {
    for i in names {
        bed.sim
            .create("pods", Some(ns), objects::pod(ns, &format!("p{i}")))
            .unwrap();
    }
}

/// Reads `topic` until a consumer holds what the cluster holds in `namespaces`.
async fn converge(bed: &Bed, topic: &str, namespaces: &[&str]) {
    let want = view::pods(&bed.sim, namespaces, |_| true);
    bed.read_until(topic, move |msgs| kafka_view(msgs) == want)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_releases_sharing_cluster_name_and_topics_restart_in_turn() {
    let bed = Bed::new(&["a", "b"]).await;
    let topic = kafka::unique("pods");
    kafka::create_topics(&[&topic], 3).await;
    create(&bed, "a", 0..20);
    create(&bed, "b", 0..20);
    let a_cfg = || release(&bed, "team-a", "namespaces: [a]", &topic);
    let b_cfg = || release(&bed, "team-b", "namespaces: [b]", &topic);
    let a = Relay::start(&bed, a_cfg());
    let b = Relay::start(&bed, b_cfg());
    a.wait_up(1).await;
    b.wait_up(1).await;
    converge(&bed, &topic, &["a", "b"]).await;
    // Each restarts in turn, with changes while down; neither takes the other's streams.
    a.stop().await;
    bed.sim.delete("pods", Some("a"), "p0").unwrap();
    bed.sim.delete("pods", Some("b"), "p1").unwrap();
    let a = Relay::start(&bed, a_cfg());
    a.wait_up(1).await;
    b.stop().await;
    create(&bed, "b", 20..25);
    let b = Relay::start(&bed, b_cfg());
    b.wait_up(1).await;
    converge(&bed, &topic, &["a", "b"]).await;
    for r in [&a, &b] {
        assert_eq!(
            r.registry.phases().len(),
            1,
            "each release runs its own stream only"
        );
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_list_becoming_all_namespaces_never_ends_a_live_object_deleted() {
    let bed = Bed::new(&["a", "b"]).await;
    let topic = kafka::unique("pods");
    kafka::create_topics(&[&topic], 3).await;
    create(&bed, "a", 0..15);
    create(&bed, "b", 0..15);
    let relay = Relay::start(&bed, release(&bed, "relay", "namespaces: [a, b]", &topic));
    relay.wait_up(2).await;
    converge(&bed, &topic, &["a", "b"]).await;
    relay.stop().await;
    bed.sim.delete("pods", Some("b"), "p3").unwrap();
    let relay = Relay::start(&bed, release(&bed, "relay", "allNamespaces: true", &topic));
    relay.wait_up(1).await;
    // Every live object's last record is its announcement by the new stream, after the old
    // streams' retractions.
    converge(&bed, &topic, &["a", "b", common::bed::CHECKPOINT_NS]).await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_membership_topic_with_delete_retention_is_refused_naming_it() {
    let bed = Bed::new(&["a"]).await;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bed.bootstrap)
        .create()
        .unwrap();
    let topic = NewTopic::new(&bed.membership, 1, TopicReplication::Fixed(1))
        .set("cleanup.policy", "delete");
    admin
        .create_topics(
            [&topic],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap();
    let relay = Relay::start(&bed, release(&bed, "relay", "namespaces: [a]", "pods-x"));
    eventually(
        || relay.registry.readiness().blocked.is_some(),
        || "the relay never refused the topic".into(),
    )
    .await;
    let reason = relay.registry.readiness().blocked.unwrap();
    assert!(
        reason.contains(&bed.membership) && reason.contains("cleanup.policy=delete"),
        "{reason}"
    );
    assert!(relay.registry.phases().is_empty(), "no stream starts");
    relay.stop().await;
}
