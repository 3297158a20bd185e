//! Parsing and validation: every error names its field.
use super::*;
use crate::config::Scope;

const BASE: &str = "clusterName: prod\nkafka:\n  bootstrapServers: 127.0.0.1:9092\n  oversize: trim\ncheckpoint:\n  namespace: watchrelay\n";

fn with_channels(channels: &str) -> Result<Config, ConfigError> {
    Config::parse(&format!("{BASE}channels:\n{channels}"))
}

fn err_field(r: Result<Config, ConfigError>) -> String {
    match r {
        Err(ConfigError::Invalid { field, .. }) => field,
        other => panic!("expected a validation error, got {other:?}"),
    }
}

#[test]
fn accepts_a_full_channel_list() {
    let cfg = with_channels(
        "  - operationId: watchNamespacedPods\n    namespaces: [default, kube-system]\n  - operationId: watchNodes\n  - operationId: watchNamespacedServices\n    namespaceSelector: team=a\n  - path: /apis/example.com/v1/namespaces/{namespace}/widgets\n    name: widgets\n    allNamespaces: true\n    topic: \"{cluster}.{namespace}.{resource}\"\n",
    )
    .unwrap();
    let ch = &cfg.channels;
    assert_eq!(
        ch[0].scope,
        Scope::Namespaces(vec!["default".into(), "kube-system".into()])
    );
    assert_eq!(ch[1].scope, Scope::Cluster);
    assert_eq!(ch[2].message, "ServiceWatchEvent");
    assert_eq!(
        ch[3].topic_for("prod", None),
        "prod.all.widgets.example.com"
    );
    assert!(!ch[3].builtin);
}

#[test]
fn errors_name_the_field() {
    assert_eq!(
        err_field(with_channels(
            "  - operationId: watchPodz\n    namespaces: [a]\n"
        )),
        "channels[0].operationId"
    );
    assert_eq!(
        err_field(with_channels("  - operationId: watchNamespacedPods\n")),
        "channels[0].namespaces"
    );
    assert_eq!(
        err_field(with_channels("  - operationId: watchNodes\n  - operationId: watchNamespacedPods\n    namespaces: [Bad_NS]\n")),
        "channels[1].namespaces[0]"
    );
    assert_eq!(
        err_field(with_channels(
            "  - operationId: watchNodes\n    topic: \"{nope}\"\n"
        )),
        "channels[0].topic"
    );
    assert_eq!(
        err_field(with_channels("  - path: /api/v1/widgets\n")),
        "channels[0].name"
    );
    assert_eq!(
        err_field(with_channels(
            "  - operationId: watchNodes\n  - operationId: watchNodes\n"
        )),
        "channels[1].name"
    );
    assert_eq!(
        err_field(Config::parse("clusterName: prod\nkafka:\n  bootstrapServers: x:1\ncheckpoint:\n  namespace: w\nchannels:\n  - operationId: watchNodes\n")),
        "kafka.deadLetterTopic"
    );
    assert_eq!(
        err_field(Config::parse("clusterName: prod\nworkerThreads: 0\nkafka:\n  bootstrapServers: x:1\n  oversize: trim\ncheckpoint:\n  namespace: w\nchannels:\n  - operationId: watchNodes\n")),
        "workerThreads"
    );
    let leader = |yaml: &str| {
        Config::parse(&format!(
            "{BASE}leaderElection:\n{yaml}channels:\n  - operationId: watchNodes\n"
        ))
    };
    assert_eq!(
        err_field(leader("  enabled: true\n  leaseDurationSeconds: 10\n")),
        "leaderElection.leaseDurationSeconds"
    );
    assert_eq!(
        err_field(leader("  retryPeriodSeconds: 0\n")),
        "leaderElection.retryPeriodSeconds"
    );
    assert_eq!(
        err_field(leader("  name: Not_A_Name\n")),
        "leaderElection.name"
    );
    assert!(leader("  enabled: true\n  identity: relay-0\n").is_ok());
}

#[test]
fn kafka_properties_take_secrets_from_the_environment() {
    let text = "clusterName: prod\nkafka:\n  bootstrapServers: x:1\n  oversize: trim\n  properties:\n    sasl.password: \"${KAFKA_PASSWORD}\"\n    sasl.username: \"a$b$${c}\"\ncheckpoint:\n  namespace: w\nchannels:\n  - operationId: watchNodes\n";
    let env = |n: &str| (n == "KAFKA_PASSWORD").then(|| "s3cret".to_string());
    let cfg = Config::parse_with_env(text, env).unwrap();
    assert_eq!(cfg.kafka.properties["sasl.password"], "s3cret");
    assert_eq!(cfg.kafka.properties["sasl.username"], "a$b${c}");
    let err = Config::parse_with_env(text, |_| None).unwrap_err();
    assert!(
        matches!(&err, ConfigError::Invalid { field, message } if field == "kafka.properties.sasl.password" && message.contains("KAFKA_PASSWORD")),
        "{err}"
    );
    let bad = text.replace("${KAFKA_PASSWORD}", "${KAFKA PASSWORD}");
    assert_eq!(
        err_field(Config::parse_with_env(&bad, env)),
        "kafka.properties.sasl.password"
    );
}

#[test]
fn consumer_group_properties_that_break_the_shard_group_are_refused() {
    let with = |props: &str| {
        Config::parse(&format!(
            "clusterName: prod\nkafka:\n  bootstrapServers: x:1\n  oversize: trim\n  unsafeProducerOverrides: true\n  properties:\n{props}checkpoint:\n  namespace: w\nchannels:\n  - operationId: watchNodes\n"
        ))
    };
    for (prop, says) in [
        ("group.instance.id: relay", "fence each other"),
        ("group.remote.assignor: range", "assignor"),
        ("session.timeout.ms: \"45000\"", "sharding.sessionTimeoutMs"),
        (
            "heartbeat.interval.ms: \"3000\"",
            "sharding.sessionTimeoutMs",
        ),
        ("partition.assignment.strategy: range", "assignment"),
        ("group.protocol.type: consumer", "assignment"),
        ("group.protocol: consumer", "sharding.groupProtocol"),
    ] {
        let key = prop.split(':').next().unwrap();
        // Refused even with unsafeProducerOverrides: these are not producer settings.
        let err = with(&format!("    {prop}\n")).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Invalid { field, message } if *field == format!("kafka.properties.{key}") && message.contains(says)),
            "{prop}: {err}"
        );
    }
    // Consumer settings the relay overrides, or that change nothing it reads, stay allowed.
    assert!(with("    group.id: mine\n    enable.auto.commit: \"true\"\n    auto.offset.reset: earliest\n    isolation.level: read_uncommitted\n    max.poll.interval.ms: \"600000\"\n").is_ok());
}

#[test]
fn properties_that_weaken_delivery_and_zero_intervals_are_refused() {
    let with = |props: &str, extra: &str| {
        Config::parse(&format!(
            "clusterName: prod\nkafka:\n  bootstrapServers: x:1\n  oversize: trim\n{extra}  properties:\n{props}checkpoint:\n  namespace: w\nchannels:\n  - operationId: watchNodes\n"
        ))
    };
    for (prop, field) in [
        ("    acks: \"1\"\n", "kafka.properties.acks"),
        (
            "    enable.idempotence: \"false\"\n",
            "kafka.properties.enable.idempotence",
        ),
        (
            "    message.timeout.ms: \"30000\"\n",
            "kafka.properties.message.timeout.ms",
        ),
        (
            "    max.in.flight.requests.per.connection: \"10\"\n",
            "kafka.properties.max.in.flight.requests.per.connection",
        ),
        ("    partitioner: random\n", "kafka.properties.partitioner"),
        (
            "    allow.auto.create.topics: \"true\"\n",
            "kafka.properties.allow.auto.create.topics",
        ),
    ] {
        let err = with(prop, "").unwrap_err();
        assert!(
            matches!(&err, ConfigError::Invalid { field: f, message } if f == field && message.contains("unsafeProducerOverrides")),
            "{err}"
        );
        assert!(with(prop, "  unsafeProducerOverrides: true\n").is_ok());
    }
    assert!(with("    acks: all\n    max.in.flight.requests.per.connection: \"5\"\n    compression.type: zstd\n", "").is_ok());
    assert_eq!(
        err_field(Config::parse(&format!(
            "{BASE}shutdownTimeoutSeconds: 5\nchannels:\n  - operationId: watchNodes\n"
        ))),
        "shutdownTimeoutSeconds"
    );
    assert_eq!(
        err_field(Config::parse(&format!(
            "{BASE}kubernetes:\n  backoffInitialMs: 0\nchannels:\n  - operationId: watchNodes\n"
        ))),
        "kubernetes.backoffInitialMs"
    );
    assert_eq!(
        err_field(Config::parse(&format!("{BASE}kubernetes:\n  backoffInitialMs: 500\n  backoffMaxMs: 100\nchannels:\n  - operationId: watchNodes\n"))),
        "kubernetes.backoffMaxMs"
    );
}

#[test]
fn unknown_fields_are_rejected_by_name() {
    let err = with_channels("  - operationId: watchNodes\n    topik: x\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("topik"), "{err}");
}

#[test]
fn channels_that_could_retract_each_others_objects_are_refused_naming_both() {
    let overlap = with_channels(
        "  - operationId: watchNamespacedPods\n    name: team-a\n    namespaceSelector: team=a\n  - operationId: watchNamespacedPods\n    name: team-b\n    namespaceSelector: team=b\n",
    );
    let err = overlap.unwrap_err().to_string();
    assert!(
        err.starts_with("channels[1]:") && err.contains("\"team-b\"") && err.contains("\"team-a\""),
        "{err}"
    );
    assert_eq!(
        err_field(with_channels(
            "  - operationId: watchAllPods\n  - operationId: watchNamespacedPods\n    namespaces: [a]\n"
        )),
        "channels[1]",
        "the cluster-wide pods channel covers namespace a"
    );
    // Disjoint lists, other topics or other resources are fine.
    with_channels(
        "  - operationId: watchNamespacedPods\n    name: x\n    namespaces: [a]\n  - operationId: watchNamespacedPods\n    name: y\n    namespaces: [b]\n  - operationId: watchNamespacedPods\n    name: z\n    allNamespaces: true\n    topic: other\n  - operationId: watchNamespacedServices\n    allNamespaces: true\n",
    )
    .unwrap();
}

#[test]
fn unknown_kafka_properties_are_refused_offline_without_their_value() {
    let text = format!("{BASE}channels:\n  - operationId: watchNodes\n").replace(
        "  oversize: trim\n",
        "  oversize: trim\n  properties:\n    sasl.passwrd: ${SECRET}\n",
    );
    let err = Config::parse_with_env(&text, |_| Some("hunter2-very-secret".into())).unwrap_err();
    let shown = err.to_string();
    assert!(
        shown.starts_with("kafka.properties.sasl.passwrd:"),
        "{shown}"
    );
    assert!(
        !shown.contains("hunter2"),
        "the value is never shown: {shown}"
    );
    let bad_value = text.replace("sasl.passwrd: ${SECRET}", "linger.ms: ${SECRET}");
    let shown = Config::parse_with_env(&bad_value, |_| Some("hunter2-very-secret".into()))
        .unwrap_err()
        .to_string();
    assert!(shown.starts_with("kafka.properties.linger.ms:"), "{shown}");
    assert!(
        !shown.contains("hunter2"),
        "the value is never shown: {shown}"
    );
}

#[test]
fn a_sensitive_resource_needs_its_watch_strategy_chosen() {
    let secrets = "  - path: /api/v1/namespaces/{namespace}/secrets\n    name: secrets\n";
    let widgets =
        "  - path: /apis/example.com/v1/namespaces/{namespace}/widgets\n    name: widgets\n    sensitive: true\n";
    for channel in [secrets, widgets] {
        for scope in ["    namespaces: [a]\n", "    namespaceSelector: team=a\n"] {
            for strategy in ["", "    watchStrategy: auto\n"] {
                assert_eq!(
                    err_field(with_channels(&format!("{channel}{scope}{strategy}"))),
                    "channels[0].watchStrategy",
                    "{channel}{scope}{strategy}"
                );
            }
            for strategy in ["perNamespace", "clusterWide"] {
                with_channels(&format!("{channel}{scope}    watchStrategy: {strategy}\n")).unwrap();
            }
        }
        // One collection across the cluster: nothing for a count to widen.
        with_channels(&format!("{channel}    allNamespaces: true\n")).unwrap();
    }
    // Not sensitive: auto stays the default.
    with_channels("  - operationId: watchNamespacedPods\n    namespaces: [a]\n").unwrap();
}

#[test]
fn auto_decides_a_first_shape_by_the_count_then_keeps_it() {
    use crate::config::Shape;
    let cfg =
        with_channels("  - operationId: watchNamespacedPods\n    namespaceSelector: team=a\n")
            .unwrap();
    let ch = &cfg.channels[0];
    assert_eq!(ch.shape(500, None, 100), Some(Shape::ClusterWide));
    assert_eq!(ch.shape(5, None, 100), Some(Shape::PerNamespace));
    assert_eq!(
        ch.shape(500, Some(Shape::PerNamespace), 100),
        Some(Shape::PerNamespace),
        "no switch by a count at a restart"
    );
    assert_eq!(
        ch.shape(5, Some(Shape::ClusterWide), 100),
        Some(Shape::ClusterWide)
    );
}

#[test]
fn sharding_is_checked_where_it_cannot_keep_one_writer_per_key() {
    let sharded = |extra: &str, channels: &str| {
        Config::parse(&format!(
            "{BASE}sharding:\n  enabled: true\n{extra}channels:\n{channels}"
        ))
    };
    let pods = "  - operationId: watchNamespacedPods\n    namespaces: [a, b]\n";
    let cfg = sharded("", pods).unwrap();
    assert_eq!(cfg.sharding.shards, 64);
    assert_eq!(cfg.sharding.topic("prod"), "watchrelay.prod.shards");
    // Two namespaces in two shards would write one key.
    assert_eq!(
        err_field(sharded("", &format!("{pods}    key: \"{{name}}\"\n"))),
        "channels[0].key"
    );
    sharded("", &format!("{pods}    key: \"{{uid}}\"\n")).unwrap();
    // Every namespace: read cluster-wide and fanned out over the shards by namespace, so the
    // key too must name the namespace.
    let all = "  - operationId: watchNamespacedPods\n    allNamespaces: true\n";
    let cfg = sharded("", all).unwrap();
    assert_eq!(cfg.channels[0].scope, Scope::Cluster);
    assert_eq!(cfg.channels[0].strategy, WatchStrategy::Auto);
    // Left to auto, a release that relayed it per namespace keeps doing so; a new one fans
    // it out.
    let none = std::collections::HashMap::new();
    let kept = cfg.settled(&["watchNamespacedPods.a".into()], &none);
    assert_eq!(kept.channels[0].scope, Scope::Selector(String::new()));
    assert_eq!(kept.channels[0].strategy, WatchStrategy::PerNamespace);
    let fresh = cfg.settled(&[], &none);
    assert_eq!(fresh.channels[0].scope, Scope::Cluster);
    assert_eq!(fresh.channels[0].strategy, WatchStrategy::ClusterWide);
    // A topic per namespace needs a stream per namespace.
    let per_topic = sharded("", &format!("{all}    topic: \"{{namespace}}.pods\"\n")).unwrap();
    assert_eq!(per_topic.channels[0].scope, Scope::Selector(String::new()));
    // A selector: kept as it ran, else decided by the count of namespaces it matches.
    let team = "  - operationId: watchNamespacedPods\n    namespaceSelector: team=x\n";
    let cfg = sharded("", team).unwrap();
    let counted = |n: usize| {
        let counts = std::collections::HashMap::from([("watchNamespacedPods".to_string(), n)]);
        cfg.settled(&[], &counts).channels[0].strategy
    };
    assert_eq!(counted(3), WatchStrategy::PerNamespace);
    assert_eq!(counted(100_000), WatchStrategy::ClusterWide);
    let parts = ["watchNamespacedPods._all-s3".to_string()];
    assert_eq!(
        cfg.settled(&parts, &none).channels[0].strategy,
        WatchStrategy::ClusterWide
    );
    assert_eq!(
        cfg.settled(&[], &none).channels[0].strategy,
        WatchStrategy::PerNamespace
    );
    // A topic per namespace needs a stream per namespace, whatever the count.
    let per_topic = sharded("", &format!("{team}    topic: \"{{namespace}}.pods\"\n")).unwrap();
    let counts = std::collections::HashMap::from([("watchNamespacedPods".to_string(), 100_000)]);
    assert_eq!(
        per_topic.settled(&[], &counts).channels[0].strategy,
        WatchStrategy::PerNamespace
    );
    assert_eq!(
        err_field(sharded("", &format!("{all}    key: \"{{name}}\"\n"))),
        "channels[0].key"
    );
    // A cluster-scoped resource: one stream, on one shard.
    let nodes = sharded("", "  - operationId: watchNodes\n    key: \"{name}\"\n").unwrap();
    assert_eq!(nodes.channels[0].scope, Scope::Cluster);
    assert_eq!(
        err_field(sharded("  shards: 12\n", pods)),
        "sharding.shards"
    );
    assert_eq!(
        err_field(Config::parse(&format!(
            "{BASE}leaderElection:\n  enabled: true\nsharding:\n  enabled: true\nchannels:\n{pods}"
        ))),
        "sharding.enabled"
    );
}

#[test]
fn a_checkpoint_name_too_long_for_its_shards_configmaps_is_refused() {
    // 61-character labels: `<name>-s63` makes the last one 65, past a label's 63.
    let name = ["c".repeat(61), "d".repeat(61)].join(".");
    let base = BASE.replace(
        "checkpoint:\n  namespace: watchrelay\n",
        &format!("checkpoint:\n  namespace: watchrelay\n  name: {name}\n"),
    );
    let channels = "channels:\n  - operationId: watchNodes\n";
    // Without sharding the name is fine; with 64 shards `<name>-s63` is not a name.
    Config::parse(&format!("{base}{channels}")).unwrap();
    assert_eq!(
        err_field(Config::parse(&format!(
            "{base}sharding:\n  enabled: true\n{channels}"
        ))),
        "checkpoint.name"
    );
}

#[test]
fn a_sharded_producer_expires_records_within_the_sessions_margin() {
    let channels = "channels:\n  - operationId: watchNodes\n";
    let plain = Config::parse(&format!("{BASE}{channels}")).unwrap();
    assert_eq!(
        plain.producer_kafka().properties.get("message.timeout.ms"),
        None
    );
    let sharded = Config::parse(&format!(
        "{BASE}sharding:\n  enabled: true\n  sessionTimeoutMs: 12000\n  ownershipDeadlineMs: 4000\n{channels}"
    ))
    .unwrap();
    assert_eq!(
        sharded
            .producer_kafka()
            .properties
            .get("message.timeout.ms")
            .map(String::as_str),
        Some("8000")
    );
    // The relay's own default is later overridden by the producer's settings: the shard's
    // timeout comes after it.
    let client = sharded.producer_kafka().client_config();
    assert_eq!(client.get("message.timeout.ms"), Some("8000"));
    // Set by hand (an unsafe override), it may not outlast the margin, nor turn it off.
    for (value, refused) in [
        ("0", true),
        ("9000", true),
        ("8000", false),
        ("2000", false),
    ] {
        let set = Config::parse(&format!(
            "clusterName: prod\nkafka:\n  bootstrapServers: 127.0.0.1:9092\n  oversize: trim\n  unsafeProducerOverrides: true\n  properties:\n    message.timeout.ms: \"{value}\"\ncheckpoint:\n  namespace: watchrelay\nsharding:\n  enabled: true\n  sessionTimeoutMs: 12000\n  ownershipDeadlineMs: 4000\n{channels}"
        ));
        let field = set.as_ref().err().map(ToString::to_string);
        assert_eq!(
            field
                .as_deref()
                .is_some_and(|e| e.starts_with("kafka.properties.message.timeout.ms")),
            refused,
            "{value}: {field:?}"
        );
    }
}

#[test]
fn a_malformed_selector_names_its_field() {
    for (field, line) in [
        (
            "namespaceSelector",
            "    namespaceSelector: \"team in (a\"\n",
        ),
        (
            "labelSelector",
            "    namespaces: [a]\n    labelSelector: \"app==,=x\"\n",
        ),
        (
            "fieldSelector",
            "    namespaces: [a]\n    fieldSelector: status.phase\n",
        ),
    ] {
        let e = Config::parse(&format!(
            "clusterName: c\nkafka:\n  bootstrapServers: k:9092\n  oversize: trim\ncheckpoint:\n  namespace: w\nchannels:\n  - operationId: watchNamespacedPods\n{line}"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains(&format!("channels[0].{field}")), "{e}");
    }
}

#[test]
fn exactly_once_is_refused_where_it_cannot_hold_and_names_the_field() {
    let with = |kafka: &str, top: &str| {
        Config::parse(&format!(
            "clusterName: prod\nkafka:\n  bootstrapServers: x:1\n  oversize: trim\n{kafka}checkpoint:\n  namespace: w\n{top}channels:\n  - operationId: watchNodes\n"
        ))
    };
    let eo = "  delivery: exactlyOnce\n";
    let ok = with(eo, "").expect("exactly once");
    with(eo, "sharding:\n  enabled: true\n").expect("exactly once, sharded");
    assert_eq!(ok.kafka.delivery, Delivery::ExactlyOnce);
    assert_eq!(ok.kafka.commit_interval_ms, 100);
    assert_eq!(
        with("", "").unwrap().kafka.delivery,
        Delivery::AtLeastOnce,
        "at least once by default"
    );
    // (kafka section, top-level sections, the field named, what the message says)
    let rows = [
        (
            format!("{eo}  commitIntervalMs: 5\n"),
            "",
            "kafka.commitIntervalMs",
            "between",
        ),
        (
            format!("{eo}  commitIntervalMs: 600000\n"),
            "",
            "kafka.commitIntervalMs",
            "between",
        ),
        (
            format!("{eo}  properties:\n    isolation.level: read_uncommitted\n"),
            "",
            "kafka.properties.isolation.level",
            "read_committed",
        ),
        (
            "  properties:\n    transactional.id: mine\n".to_string(),
            "",
            "kafka.properties.transactional.id",
            "the relay sets it itself",
        ),
    ];
    for (kafka, top, expected, says) in rows {
        let err = with(&kafka, top).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Invalid { field, message } if *field == expected && message.contains(says)),
            "{kafka}{top}: {err}"
        );
    }
    assert!(with("  delivery: sometimes\n", "").is_err());
}
