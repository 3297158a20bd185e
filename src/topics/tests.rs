use super::*;

fn config(extra: &str, channels: &str) -> Config {
    Config::parse(&format!(
        "clusterName: prod\nkafka:\n  bootstrapServers: k:9092\n  deadLetterTopic: dead\n{extra}checkpoint:\n  namespace: w\nchannels:\n{channels}"
    ))
    .unwrap()
}

fn names(specs: &[Spec]) -> Vec<&str> {
    specs.iter().map(|s| s.name.as_str()).collect()
}

#[test]
fn channels_sharing_a_topic_share_one_entry_compacted_if_any_has_tombstones() {
    let cfg = config(
        "",
        "  - operationId: watchNodes\n    topic: shared\n  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: shared\n    tombstones: true\n    partitions: 12\n",
    );
    let plan = plan(&cfg);
    assert_eq!(names(&plan.published), ["dead", "shared"]);
    let shared = &plan.published[1];
    assert_eq!(
        shared.role,
        Role::Channels(vec!["watchNodes".into(), "watchNamespacedPods".into()])
    );
    assert_eq!(shared.partitions, 12);
    assert!(shared.compacted());
    assert!(!plan.published[0].compacted(), "the dead letter is not");
    assert_eq!(names(&plan.state), ["watchrelay.prod.membership"]);
}

#[test]
fn a_namespace_template_names_a_topic_per_listed_namespace_and_stays_a_template_otherwise() {
    let cfg = config(
        "  oversize: trim\n",
        "  - operationId: watchNamespacedPods\n    namespaces: [a, b]\n    topic: \"{cluster}.{namespace}.pods\"\n  - operationId: watchNamespacedServices\n    namespaceSelector: team=x\n    topic: \"{cluster}.{namespace}.services\"\n  - operationId: watchNodes\n    topic: \"{cluster}.{namespace}.nodes\"\n",
    );
    let plan = plan(&cfg);
    assert_eq!(
        names(&plan.published),
        ["prod.a.pods", "prod.all.nodes", "prod.b.pods"]
    );
    assert_eq!(names(&plan.templates), ["prod.{namespace}.services"]);
}

#[test]
fn defaults_and_channel_settings_reach_the_specs() {
    let cfg = config(
        "  topics:\n    partitions: 3\n    replicationFactor: 2\n    configs:\n      retention.ms: \"-1\"\n",
        "  - operationId: watchNodes\n    topicConfigs:\n      retention.ms: \"86400000\"\n      min.insync.replicas: \"2\"\n",
    );
    let plan = plan(&cfg);
    let nodes = plan
        .published
        .iter()
        .find(|s| s.name == "prod.nodes")
        .unwrap();
    assert_eq!((nodes.partitions, nodes.replication), (3, Some(2)));
    assert_eq!(nodes.configs["retention.ms"], "86400000");
    assert_eq!(nodes.configs["min.insync.replicas"], "2");
}

#[test]
fn sharding_adds_its_topics_with_a_partition_per_shard() {
    let cfg = config(
        "",
        "  - operationId: watchNodes\nsharding:\n  enabled: true\n  shards: 16\n",
    );
    let plan = plan(&cfg);
    assert_eq!(
        names(&plan.state),
        [
            "watchrelay.prod.membership",
            "watchrelay.prod.shards",
            "watchrelay.prod.shards.owners"
        ]
    );
    assert!(plan.state[1..]
        .iter()
        .all(|s| s.partitions == 16 && s.compacted()));
}

#[test]
fn an_existing_topic_must_have_the_partitions_and_the_compaction_it_needs() {
    let spec = Spec {
        name: "t".into(),
        role: Role::Channels(vec!["pods".into()]),
        partitions: 6,
        at_least: Some(6),
        replication: None,
        configs: BTreeMap::from([("cleanup.policy".into(), "compact".into())]),
    };
    let state = |partitions, policy: &str| TopicState {
        partitions,
        configs: BTreeMap::from([("cleanup.policy".into(), policy.into())]),
        created: false,
    };
    assert_eq!(check(&spec, &state(6, "compact")), Ok(()));
    assert_eq!(check(&spec, &state(12, "compact,delete")), Ok(()));
    let fewer = check(&spec, &state(3, "compact")).unwrap_err();
    assert!(
        fewer.contains("has 3 partitions, fewer than the 6"),
        "{fewer}"
    );
    let deleting = check(&spec, &state(6, "delete")).unwrap_err();
    assert!(deleting.contains("cleanup.policy=delete"), "{deleting}");
    let plain = Spec {
        configs: BTreeMap::new(),
        at_least: None,
        ..spec
    };
    assert_eq!(
        check(&plain, &state(1, "delete")),
        Ok(()),
        "no count configured"
    );
}

#[test]
fn the_commands_create_what_the_table_lists() {
    let cfg = config(
        "",
        "  - operationId: watchNamespacedPods\n    namespaces: [a]\n    tombstones: true\n",
    );
    let plan = plan(&cfg);
    let table = table(&plan);
    assert!(table.starts_with("TOPIC"), "{table}");
    assert!(table.contains("prod.pods"), "{table}");
    let commands = commands(&plan, "k:9092");
    assert_eq!(commands.lines().count(), 3, "{commands}");
    assert!(
        commands.contains("kafka-topics.sh --bootstrap-server k:9092 --create --if-not-exists --topic prod.pods --partitions 6 --config cleanup.policy=compact"),
        "{commands}"
    );
}

#[test]
fn a_channel_with_tombstones_refuses_a_deleting_policy() {
    let e = Config::parse(
        "clusterName: prod\nkafka:\n  bootstrapServers: k:9092\n  oversize: trim\ncheckpoint:\n  namespace: w\nchannels:\n  - operationId: watchNodes\n    tombstones: true\n    topicConfigs:\n      cleanup.policy: delete\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("channels[0].topicConfigs.cleanup.policy"), "{e}");
}

#[test]
fn a_missing_topic_is_a_problem_only_where_the_relay_may_not_create_it() {
    let cfg = config(
        "",
        "  - operationId: watchNodes\n    tombstones: true\n    partitions: 3\n",
    );
    let specs = plan(&cfg).published;
    assert_eq!(names(&specs), ["dead", "prod.nodes"]);
    let missing = vec![None, None];
    assert!(problems(&specs, &missing, true).is_empty());
    let refused = problems(&specs, &missing, false);
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0].starts_with("missing topics: dead, prod.nodes;"),
        "{refused:?}"
    );
    let deleting = TopicState {
        partitions: 3,
        configs: BTreeMap::from([("cleanup.policy".into(), "delete".into())]),
        created: false,
    };
    let found = problems(&specs, &[None, Some(deleting)], false);
    assert_eq!(
        found.len(),
        2,
        "the missing one and the uncompacted one: {found:?}"
    );
}
