//! What a stock Apache Kafka does that a stand-in did not: topics created on a metadata request
//! (`auto.create.topics.enable`, on by default and on in the suite's broker), the log cleaner
//! really compacting the membership topic, and SASL with ACLs refusing a relay that lacks a
//! permission.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use common::bed::{eventually, Bed, Relay};
use common::broker::{Options, OwnBroker};
use common::kafka;
use common::view::{self, kafka_view};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;
use watchrelay::config::Config;
use watchrelay_sim::objects;

fn admin(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("allow.auto.create.topics", "false")
        .create()
        .unwrap()
}

/// `topic`'s configuration as the broker describes it, or None when it does not exist.
async fn topic_configs(bootstrap: &str, topic: &str) -> Option<BTreeMap<String, String>> {
    let admin = admin(bootstrap);
    let md = admin
        .inner()
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let t = md.topics().iter().find(|t| t.name() == topic)?;
    if t.error().is_some() || t.partitions().is_empty() {
        return None;
    }
    let described = admin
        .describe_configs(
            [&ResourceSpecifier::Topic(topic)],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    for r in described {
        for e in r.unwrap().entries {
            if let Some(v) = e.value {
                out.insert(e.name, v);
            }
        }
    }
    Some(out)
}

fn pods_config(bed: &Bed, topic: &str, kafka_extra: &str) -> Config {
    bed.config(
        &format!("  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: {topic}\n"),
        kafka_extra,
    )
}

/// The suite's broker creates a topic on any metadata request that allows it. The relay's
/// clients never allow it: the membership topic is created compacted by the relay, and a
/// missing channel topic stays missing (its stream reports the error) instead of appearing with
/// the broker's defaults. With the client default (allowed), the membership topic would come
/// into being with `cleanup.policy=delete` first, and the relay would refuse it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_topic_is_ever_created_with_the_brokers_defaults() {
    let bed = Bed::new(&["a"]).await;
    bed.sim
        .create("pods", Some("a"), objects::pod("a", "p0"))
        .unwrap();
    let missing = kafka::unique("never-created");
    let relay = Relay::start(&bed, pods_config(&bed, &missing, ""));
    relay
        .wait_counter("delivery_errors_total", "watchNamespacedPods.a", 1)
        .await;
    let membership = topic_configs(&bed.bootstrap, &bed.membership)
        .await
        .expect("the relay created its membership topic");
    assert_eq!(membership["cleanup.policy"], "compact");
    assert!(
        topic_configs(&bed.bootstrap, &missing).await.is_none(),
        "the channel topic was created on demand"
    );
    let problem = relay.registry.readiness().problems["watchNamespacedPods.a"].clone();
    assert!(
        problem.contains(&format!("create topic {missing}")),
        "{problem}"
    );
    relay.stop().await;

    // The same start with the client's default: the broker creates the membership topic with
    // its own defaults before the relay can create it compacted.
    let bed = Bed::new(&["a"]).await;
    let topic = kafka::unique("pods");
    kafka::create_topics(&[&topic], 3).await;
    let mut cfg = pods_config(&bed, &topic, "");
    cfg.kafka.unsafe_producer_overrides = true;
    cfg.kafka
        .properties
        .insert("allow.auto.create.topics".into(), "true".into());
    let relay = Relay::start(&bed, cfg);
    eventually(
        || relay.registry.readiness().blocked.is_some(),
        || "the relay started on a membership topic the broker made".into(),
    )
    .await;
    let reason = relay.registry.readiness().blocked.unwrap();
    assert!(reason.contains("cleanup.policy=delete"), "{reason}");
    relay.stop().await;
}

/// Every stream's member uids.
fn sets(mut restored: watchrelay::membership::Restored) -> BTreeMap<String, BTreeSet<String>> {
    let streams: Vec<String> = restored.streams().map(str::to_string).collect();
    streams
        .into_iter()
        .map(|s| {
            let uids = restored.take(&s).iter().map(|(uid, _)| uid).collect();
            (s, uids)
        })
        .collect()
}

/// Reads the membership topic as stored: every record's key and whether it is a tombstone.
fn membership_records(bootstrap: &str, topic: &str) -> Vec<(String, bool)> {
    kafka::read_raw(bootstrap, topic, Duration::from_secs(2))
        .into_iter()
        .map(|(key, value)| (key, value.is_none()))
        .collect()
}

/// The broker's cleaner really compacts the membership topic: superseded records and
/// tombstones are gone once their segment rolled and was cleaned. A restore from what remains
/// gives the same sets, and the relay still infers the right DELETEDs across a 410.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_membership_topic_compacts_and_restores_the_same_sets() {
    let sim_cfg = watchrelay_sim::SimConfig {
        history_limit: 20,
        ..Default::default()
    };
    let bed = Bed::with(sim_cfg, &["a"]).await;
    // Created beforehand with settings that make the cleaner act within a second; the relay
    // uses a compacted topic it finds as it is.
    let new = NewTopic::new(&bed.membership, 1, TopicReplication::Fixed(1))
        .set("cleanup.policy", "compact")
        .set("segment.ms", "100")
        .set("min.cleanable.dirty.ratio", "0.01")
        .set("delete.retention.ms", "100")
        .set("min.compaction.lag.ms", "0");
    admin(&bed.bootstrap)
        .create_topics(
            [&new],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap();
    let topic = kafka::unique("pods");
    kafka::create_topics(&[&topic], 3).await;
    for i in 0..40 {
        bed.sim
            .create("pods", Some("a"), objects::pod("a", &format!("p{i}")))
            .unwrap();
    }
    let relay = Relay::start(&bed, pods_config(&bed, &topic, ""));
    relay.wait_up(1).await;
    // Half of them go: each leaves a tombstone on its member record.
    for i in 0..20 {
        bed.sim.delete("pods", Some("a"), &format!("p{i}")).unwrap();
    }
    let want = view::pods(&bed.sim, &["a"], |_| true);
    bed.read_until(&topic, move |m| kafka_view(m) == want).await;
    bed.wait_checkpoint_current("watchNamespacedPods.a").await;
    let before = sets(bed.members().await);
    assert_eq!(before["watchNamespacedPods.a"].len(), 20);
    relay.stop().await;
    let written = membership_records(&bed.bootstrap, &bed.membership);
    assert!(written.iter().any(|(_, tombstone)| *tombstone));

    // Compaction happens only in rolled segments: let the active one age past segment.ms, then
    // append one record (a member of another stream, written the way the relay writes) so
    // the broker rolls it, and wait for the cleaner.
    let mut compacted = Vec::new();
    eventually(
        || {
            kafka::produce(&bed.bootstrap, &bed.membership, "roll", Some(b"{}"));
            compacted = membership_records(&bed.bootstrap, &bed.membership);
            let mut seen = HashMap::new();
            let duplicates = compacted
                .iter()
                .filter(|(k, _)| seen.insert(k.clone(), ()).is_some() && k != "roll")
                .count();
            duplicates == 0 && !compacted.iter().any(|(k, t)| *t && k != "roll")
        },
        || format!("the cleaner never compacted the membership topic: {written:?}"),
    )
    .await;
    // The records appended to roll segments are not the relay's.
    let kept = compacted.iter().filter(|(k, _)| k != "roll").count();
    assert!(kept < written.len(), "compaction removed records");
    assert_eq!(
        sets(bed.members().await),
        before,
        "a restore from the compacted topic gives the same sets"
    );

    // Deletions while the relay is down, past the simulator's history window: the restart gets
    // a 410 and infers DELETEDs from the restored members.
    for i in 20..30 {
        bed.sim.delete("pods", Some("a"), &format!("p{i}")).unwrap();
    }
    for i in 0..30 {
        bed.sim
            .create("pods", Some("a"), objects::pod("a", &format!("q{i}")))
            .unwrap();
    }
    let relay = Relay::start(&bed, pods_config(&bed, &topic, ""));
    relay.wait_up(1).await;
    let want = view::pods(&bed.sim, &["a"], |_| true);
    bed.read_until(&topic, move |m| kafka_view(m) == want).await;
    relay.stop().await;
}

/// A relay user missing one ACL gets an error naming it, not a silent retry: without Create on
/// the membership topic the relay does not start (its readiness says why); without Write on a
/// channel topic that stream stays down and says why, while the others run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_acl_is_named() {
    let broker = OwnBroker::start(Options {
        sasl: true,
        ..Options::default()
    });
    let mut bed = Bed::new(&["a", "b"]).await;
    bed.bootstrap = broker.bootstrap.clone();
    let (allowed, denied) = (kafka::unique("allowed"), kafka::unique("denied"));
    for t in [&allowed, &denied] {
        broker.tool(
            "org.apache.kafka.tools.TopicCommand",
            &["--create", "--topic", t, "--partitions", "1"],
        );
    }
    let relay_user = "User:relay";
    broker.acl(relay_user, "Describe", &allowed);
    broker.acl(relay_user, "Write", &allowed);
    broker.acl(relay_user, "Describe", &denied);
    for op in ["Describe", "DescribeConfigs", "Read", "Write"] {
        broker.acl(relay_user, op, &bed.membership);
    }
    broker.tool(
        "org.apache.kafka.tools.AclCommand",
        &[
            "--add",
            "--allow-principal",
            relay_user,
            "--operation",
            "Read",
            "--group",
            "watchrelay-membership",
        ],
    );
    let mut cfg = bed.config(
        &format!(
            "  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: {allowed}\n  - operationId: watchNamespacedServices\n    namespaces: [b]\n    topic: {denied}\n"
        ),
        "",
    );
    for (k, v) in [
        ("security.protocol", "SASL_PLAINTEXT"),
        ("sasl.mechanism", "PLAIN"),
        ("sasl.username", "relay"),
        ("sasl.password", "relay"),
    ] {
        cfg.kafka.properties.insert(k.into(), v.into());
    }
    // Without Create on the membership topic (it does not exist yet).
    let relay = Relay::start(&bed, cfg.clone());
    eventually(
        || relay.registry.readiness().blocked.is_some(),
        || "the relay started without a membership topic".into(),
    )
    .await;
    let reason = relay.registry.readiness().blocked.unwrap();
    assert!(
        reason.contains(&format!("the ACL Create on topic {}", bed.membership)),
        "{reason}"
    );
    relay.stop().await;

    // With Create: the pods stream runs; the ConfigMaps stream cannot write and says so.
    broker.acl(relay_user, "Create", &bed.membership);
    bed.sim
        .create("pods", Some("a"), objects::pod("a", "p0"))
        .unwrap();
    bed.sim
        .create("services", Some("b"), objects::service("b", "s0"))
        .unwrap();
    let relay = Relay::start(&bed, cfg);
    eventually(
        || relay.stream_up("watchNamespacedPods.a"),
        || "the permitted stream never came up".into(),
    )
    .await;
    relay
        .wait_problem(
            "watchNamespacedServices.b",
            &format!("Write and Describe on topic {denied}"),
        )
        .await;
    assert!(
        relay.stream_up("watchNamespacedPods.a"),
        "the other stream runs"
    );
    relay.stop().await;
}
