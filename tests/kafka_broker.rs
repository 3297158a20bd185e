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

/// How many partitions `topic` has (0 when it does not exist).
fn partitions(bootstrap: &str, topic: &str) -> usize {
    admin(bootstrap)
        .inner()
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap()
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .map_or(0, |t| t.partitions().len())
}

/// The relay creates a missing channel topic as its configuration says (partitions, configs,
/// compacted for tombstones), and relays to it at once. Without `kafka.topics.create`, a
/// missing topic keeps the relay not ready, naming it; so does an existing topic with fewer
/// partitions than configured, or one a channel with tombstones needs compacted that is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_topics_are_created_as_configured_and_existing_ones_checked() {
    let bed = Bed::new(&["a"]).await;
    bed.sim
        .create("pods", Some("a"), objects::pod("a", "p0"))
        .unwrap();
    let topic = kafka::unique("created");
    let channel = |topic: &str, extra: &str| {
        format!("  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: {topic}\n{extra}")
    };
    let cfg = bed.config(
        &channel(
            &topic,
            "    tombstones: true\n    partitions: 4\n    topicConfigs:\n      retention.ms: \"-1\"\n",
        ),
        "",
    );
    let relay = Relay::start(&bed, cfg);
    eventually(
        || partitions(&bed.bootstrap, &topic) > 0,
        || "the relay never created its topic".into(),
    )
    .await;
    let records = kafka::read_until(&bed.bootstrap, &topic, Duration::from_secs(30), |m| {
        !m.is_empty()
    });
    assert_eq!(records.len(), 1, "p0 announced on the new topic");
    relay.stop().await;
    assert_eq!(partitions(&bed.bootstrap, &topic), 4);
    let configs = topic_configs(&bed.bootstrap, &topic).await.unwrap();
    assert_eq!(configs["cleanup.policy"], "compact");
    assert_eq!(configs["retention.ms"], "-1");

    // Not created when the relay may not: not ready, naming the topic.
    let missing = kafka::unique("missing");
    let cfg = bed.config(&channel(&missing, ""), "  topics:\n    create: false\n");
    let relay = Relay::start(&bed, cfg);
    let reason = blocked(&relay).await;
    assert!(
        reason.contains(&format!("missing topics: {missing}")),
        "{reason}"
    );
    relay.stop().await;
    assert_eq!(partitions(&bed.bootstrap, &missing), 0, "it stays missing");

    // An existing topic with fewer partitions than configured, then one not compacted.
    let (few, deleting) = (kafka::unique("few"), kafka::unique("deleting"));
    kafka::create_topics(&[&few, &deleting], 2).await;
    let cfg = bed.config(&channel(&few, "    partitions: 3\n"), "");
    let relay = Relay::start(&bed, cfg);
    let reason = blocked(&relay).await;
    assert!(
        reason.contains("has 2 partitions, fewer than the 3 configured"),
        "{reason}"
    );
    relay.stop().await;
    let cfg = bed.config(&channel(&deleting, "    tombstones: true\n"), "");
    let relay = Relay::start(&bed, cfg);
    let reason = blocked(&relay).await;
    assert!(reason.contains("cleanup.policy=delete"), "{reason}");
    relay.stop().await;
}

/// Why the relay is not ready, once it says.
async fn blocked(relay: &Relay) -> String {
    eventually(
        || relay.registry.readiness().blocked.is_some(),
        || "the relay never said why it is not ready".into(),
    )
    .await;
    relay.registry.readiness().blocked.unwrap()
}

/// The suite's broker creates a topic on any metadata request that allows it. The relay's
/// clients never allow it: with the client default (allowed), the membership topic would come
/// into being with `cleanup.policy=delete` first, and the relay would refuse it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_topic_is_ever_created_with_the_brokers_defaults() {
    let bed = Bed::new(&["a"]).await;
    let topic = kafka::unique("pods");
    kafka::create_topics(&[&topic], 3).await;
    let mut cfg = pods_config(&bed, &topic, "");
    cfg.kafka.unsafe_producer_overrides = true;
    cfg.kafka
        .properties
        .insert("allow.auto.create.topics".into(), "true".into());
    let relay = Relay::start(&bed, cfg);
    let reason = blocked(&relay).await;
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
    // The tombstones follow the checkpoint without holding it back: read until they landed.
    let mut before = sets(bed.members().await);
    for _ in 0..50 {
        if before["watchNamespacedPods.a"].len() == 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        before = sets(bed.members().await);
    }
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
/// a missing channel topic, or on the membership topic, the relay does not start (its readiness says why); without Write on a
/// channel topic that stream stays down and says why, while the others run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_acl_is_named() {
    let broker = OwnBroker::start(Options {
        sasl: true,
        ..Options::default()
    });
    let mut bed = Bed::new(&["a", "b"]).await;
    bed.bootstrap = broker.bootstrap.clone();
    let (allowed, denied, created) = (
        kafka::unique("allowed"),
        kafka::unique("denied"),
        kafka::unique("created"),
    );
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
    for op in ["Describe", "Write"] {
        broker.acl(relay_user, op, &created);
    }
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
            "  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: {allowed}\n  - operationId: watchNamespacedServices\n    namespaces: [b]\n    topic: {denied}\n  - operationId: watchNamespacedEvents\n    namespaces: [a]\n    topic: {created}\n"
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
    // Without Create on a channel topic that does not exist: nothing starts, and the
    // reason names the ACL.
    let relay = Relay::start(&bed, cfg.clone());
    let reason = blocked(&relay).await;
    assert!(
        reason.contains(&format!("the ACL Create on topic {created}")),
        "{reason}"
    );
    relay.stop().await;
    broker.acl(relay_user, "Create", &created);

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

/// `check-config --live` judges the topics as the relay does at start, and the release as its
/// checkpoint ConfigMap holds it (a changed membership topic is refused with the relay's own
/// message), and creates and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_live_reports_what_a_start_would_refuse() {
    let bed = Bed::new(&["a"]).await;
    let (few, missing) = (kafka::unique("few"), kafka::unique("missing"));
    kafka::create_topics(&[&few], 2).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    bed.sim.write_kubeconfig(&kubeconfig).unwrap();
    let file = dir.path().join("c.yaml");
    let write_with = |channels: String, membership: &str| {
        std::fs::write(
            &file,
            format!(
                "clusterName: test\nkubernetes:\n  kubeconfig: {}\nkafka:\n  bootstrapServers: {}\n  oversize: trim\ncheckpoint:\n  namespace: {}\n  membership:\n    topic: {membership}\nchannels:\n{channels}",
                kubeconfig.display(),
                bed.bootstrap,
                common::bed::CHECKPOINT_NS,
            ),
        )
        .unwrap();
    };
    let write = |channels: String| write_with(channels, &bed.membership);
    let check = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_watchrelay"))
            .args(["check-config", "--live"])
            .arg(&file)
            .output()
            .unwrap()
    };
    write(format!(
        "  - operationId: watchNodes\n    topic: {few}\n    partitions: 3\n  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: {missing}\n"
    ));
    let out = check();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {stderr}");
    assert!(
        stderr.contains(&format!(
            "topic {few} (channel watchNodes) has 2 partitions"
        )),
        "{stderr}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains(&format!("topic {missing}: missing; created at start")),
        "{out:?}"
    );
    assert_eq!(partitions(&bed.bootstrap, &missing), 0, "nothing created");
    write(format!("  - operationId: watchNodes\n    topic: {few}\n"));
    let out = check();
    assert!(out.status.success(), "{out:?}");

    // Once the release ran, a configuration naming another membership topic (a changed
    // clusterName does that to the default) is refused before any replica runs it.
    let relay = Relay::start(
        &bed,
        bed.config(
            &format!("  - operationId: watchNodes\n    topic: {few}\n"),
            "",
        ),
    );
    relay.wait_up(1).await;
    relay.stop().await;
    write(format!("  - operationId: watchNodes\n    topic: {few}\n"));
    assert!(check().status.success(), "the same release passes");
    write_with(
        format!("  - operationId: watchNodes\n    topic: {few}\n"),
        "renamed.membership",
    );
    let out = check();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {stderr}");
    assert!(
        stderr.contains(&format!(
            "checkpoint.membership.topic is renamed.membership but this relay's members are in {}",
            bed.membership
        )),
        "{stderr}"
    );
}
