//! The binary's command line (no broker needed).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_watchrelay");

/// `watchrelay check-config` of a file holding `yaml`: the file's path and the output.
fn check_config(yaml: &str) -> (tempfile::TempDir, std::path::PathBuf, std::process::Output) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("relay.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new(BIN)
        .arg("check-config")
        .arg(&file)
        .output()
        .unwrap();
    (dir, file, out)
}

#[test]
fn check_config_names_the_offending_field() {
    let (_dir, _, out) = check_config(
        "clusterName: prod\nkafka:\n  bootstrapServers: k:9092\n  oversize: trim\ncheckpoint:\n  namespace: relay\nchannels:\n  - operationId: watchNamespacedPods\n    namespaces: [default]\n  - operationId: watchNamespacedDeployments\n",
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("channels[1].namespaces"), "{err}");

    let (_dir, _, out) = check_config("clusterName: prod\nkafka:\n  bootstrapServers: k:9092\n  oversize: trim\ncheckpoint:\n  namespace: relay\nchannels:\n  - operationId: watchNodes\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("watchNodes"));
}

/// Runs the binary with `args` (blocking, off the runtime's threads) and returns its output.
async fn watchrelay(args: &[&str]) -> std::process::Output {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || Command::new(BIN).args(&args).output().unwrap())
        .await
        .unwrap()
}

fn stdout(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

const SUBCOMMANDS: [&str; 9] = [
    "run",
    "check-config",
    "topics",
    "channels",
    "asyncapi",
    "status",
    "resync",
    "rbac",
    "version",
];

#[tokio::test]
async fn every_subcommand_has_help_and_the_docs_name_them_all() {
    let top = stdout(&watchrelay(&["--help"]).await);
    let docs = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .unwrap();
    for sub in SUBCOMMANDS {
        assert!(top.contains(sub), "--help lacks {sub}");
        let help = stdout(&watchrelay(&[sub, "--help"]).await);
        assert!(help.contains("Usage: watchrelay"), "{sub}: {help}");
        assert!(
            docs.contains(&format!("watchrelay {sub}")),
            "docs/configuration.md lacks `watchrelay {sub}`"
        );
    }
    assert!(stdout(&watchrelay(&["run", "--help"]).await).contains("WATCHRELAY_CONFIG"));
    assert!(stdout(&watchrelay(&["version"]).await).contains(env!("CARGO_PKG_VERSION")));
}

#[tokio::test]
async fn version_names_the_version_and_the_commit() {
    let text = stdout(&watchrelay(&["version"]).await);
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(concat!("watchrelay ", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    let commit = lines
        .next()
        .and_then(|l| l.strip_prefix("commit: "))
        .unwrap_or_else(|| panic!("no commit line: {text}"));
    // A commit id (from the build's environment or git), or `unknown` when neither has one.
    assert!(
        commit == "unknown"
            || (!commit.is_empty() && commit.chars().all(|c| c.is_ascii_alphanumeric())),
        "{commit:?}"
    );
    assert!(stdout(&watchrelay(&["--version"]).await)
        .contains(concat!("watchrelay ", env!("CARGO_PKG_VERSION"))));
    assert!(stdout(&watchrelay(&["--version"]).await).contains(&format!("(commit {commit})")));
}

#[tokio::test]
async fn channels_lists_the_catalogue() {
    let text = stdout(&watchrelay(&["channels"]).await);
    assert!(
        text.contains("watchNamespacedPods")
            && text.contains("/api/v1/namespaces/{namespace}/pods")
    );
    let json: serde_json::Value =
        serde_json::from_str(&stdout(&watchrelay(&["channels", "-o", "json"]).await)).unwrap();
    assert_eq!(
        json.as_array().unwrap().len(),
        watchrelay::catalogue::CATALOGUE.len()
    );
}

mod against_a_cluster {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use watchrelay_sim::{objects, Sim, SimConfig};

    struct Cluster {
        sim: Sim,
        dir: tempfile::TempDir,
    }

    impl Cluster {
        async fn start() -> Self {
            let sim = Sim::start(SimConfig::default()).await.unwrap();
            for ns in ["a", "relay"] {
                sim.create("namespaces", None, objects::namespace(ns))
                    .unwrap();
            }
            let dir = tempfile::tempdir().unwrap();
            sim.write_kubeconfig(&dir.path().join("kubeconfig"))
                .unwrap();
            Self { sim, dir }
        }

        /// A configuration file for this cluster; `extra` goes at the top level.
        fn config(&self, channels: &str, extra: &str) -> String {
            let path = self.dir.path().join("config.yaml");
            std::fs::write(
                &path,
                format!(
                    "clusterName: test\nkubernetes:\n  kubeconfig: {}\nkafka:\n  bootstrapServers: 127.0.0.1:1\n  oversize: trim\ncheckpoint:\n  namespace: relay\nhttp:\n  listen: \"\"\n{extra}channels:\n{channels}",
                    self.dir.path().join("kubeconfig").display()
                ),
            )
            .unwrap();
            path.display().to_string()
        }
    }

    const PODS: &str = "  - operationId: watchNamespacedPods\n    namespaces: [a]\n";

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dry_run_prints_envelopes_and_needs_no_broker() {
        let c = Cluster::start().await;
        for i in 0..3 {
            c.sim
                .create("pods", Some("a"), objects::pod("a", &format!("p{i}")))
                .unwrap();
        }
        let cfg = c.config(PODS, "");
        let mut child = Command::new(BIN)
            .args(["run", "--dry-run", "--config", &cfg])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let lines = tokio::task::spawn_blocking(move || {
            BufReader::new(out)
                .lines()
                .take(3)
                .map(|l| serde_json::from_str::<serde_json::Value>(&l.unwrap()).unwrap())
                .collect::<Vec<_>>()
        })
        .await
        .unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        let mut names: Vec<&str> = lines
            .iter()
            .map(|v| v["object"]["metadata"]["name"].as_str().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["p0", "p1", "p2"]);
        assert!(lines
            .iter()
            .all(|v| v["type"] == "ADDED" && v["watchrelay"]["cluster"] == "test"));
        assert!(
            c.sim
                .get("configmaps", Some("relay"), "watchrelay-checkpoints")
                .is_none(),
            "a dry run writes no checkpoint"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn status_reads_positions_and_the_leader_and_resync_leaves_a_request() {
        let c = Cluster::start().await;
        let mut cm = objects::configmap("relay", "watchrelay-checkpoints");
        cm["data"] = serde_json::json!({
            "watchNamespacedPods.a": "{\"rv\":\"42\",\"at\":\"2026-01-01T00:00:00Z\"}"
        });
        c.sim.create("configmaps", Some("relay"), cm).unwrap();
        let cfg = c.config(PODS, "leaderElection:\n  enabled: true\n");
        let text = stdout(&watchrelay(&["status", "--config", &cfg]).await);
        assert!(
            text.contains("watchNamespacedPods.a") && text.contains("42"),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&stdout(
            &watchrelay(&["status", "--config", &cfg, "-o", "json"]).await,
        ))
        .unwrap();
        assert_eq!(json["streams"][0]["position"], "42");
        assert!(json["streams"][0]["ageSeconds"].as_i64().unwrap() > 0);
        assert_eq!(json["leader"]["lease"], "relay/watchrelay-leader");

        let err = watchrelay(&["resync", "--config", &cfg, "nodes"]).await;
        assert!(!err.status.success());
        assert!(String::from_utf8_lossy(&err.stderr).contains("watchNamespacedPods"));
        stdout(&watchrelay(&["resync", "--config", &cfg, "watchNamespacedPods"]).await);
        let cm = c
            .sim
            .get("configmaps", Some("relay"), "watchrelay-checkpoints")
            .unwrap();
        assert_eq!(
            cm["metadata"]["annotations"]["watchrelay.io/resync"],
            "watchNamespacedPods"
        );
        let text = stdout(&watchrelay(&["status", "--config", &cfg]).await);
        assert!(
            text.contains("resync requested: watchNamespacedPods"),
            "{text}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn asyncapi_with_cluster_gives_a_crd_its_real_schema() {
        let c = Cluster::start().await;
        c.sim.register_resource(watchrelay_sim::Resource::new("example.com", "v1", "widgets", "Widget", true, &[]).with_schema(serde_json::json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}})),
        );
        let cfg = c.config(
            &format!("{PODS}  - path: /apis/example.com/v1/namespaces/{{namespace}}/widgets\n    name: widgets\n    allNamespaces: true\n"),
            "",
        );
        let plain: serde_json::Value =
            serde_json::from_str(&stdout(&watchrelay(&["asyncapi", "--config", &cfg]).await))
                .unwrap();
        assert_eq!(
            plain["components"]["schemas"]["widgets.envelope"]["else"]["properties"]["object"]
                ["$ref"],
            "#/components/schemas/kubernetes.object"
        );
        let doc: serde_json::Value = serde_json::from_str(&stdout(
            &watchrelay(&["asyncapi", "--config", &cfg, "--cluster"]).await,
        ))
        .unwrap();
        let schemas = &doc["components"]["schemas"];
        assert_eq!(
            schemas["widgets.envelope"]["else"]["properties"]["object"]["$ref"],
            "#/components/schemas/com.example.v1.Widget"
        );
        assert_eq!(
            schemas["com.example.v1.Widget"]["properties"]["spec"]["properties"]["size"]["type"],
            "integer"
        );
        assert!(schemas["io.k8s.api.core.v1.Pod"].is_object());
    }
}

#[test]
fn a_misspelt_kafka_property_is_named_and_its_secret_value_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret.yaml");
    std::fs::write(
        &file,
        "clusterName: prod\nkafka:\n  bootstrapServers: 127.0.0.1:9\n  oversize: trim\n  properties:\n    sasl.passwrd: ${SASL_SECRET}\ncheckpoint:\n  namespace: relay\nchannels:\n  - operationId: watchNodes\n",
    )
    .unwrap();
    for args in [
        vec!["check-config", file.to_str().unwrap()],
        vec!["run", "--config", file.to_str().unwrap()],
    ] {
        let out = Command::new(BIN)
            .args(&args)
            .env("SASL_SECRET", "s3cr3t-value-never-printed")
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "{args:?} accepted a misspelt property"
        );
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            all.contains("kafka.properties.sasl.passwrd"),
            "{args:?}: {all}"
        );
        assert!(!all.contains("s3cr3t"), "{args:?} printed the value: {all}");
    }
}

/// `topics` prints what the relay would create, as a table and as commands; `check-config`
/// takes the file as `--config` as well.
#[test]
fn topics_prints_every_topic_and_check_config_takes_config() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.yaml");
    std::fs::write(
        &file,
        "clusterName: prod\nkafka:\n  bootstrapServers: k:9092\n  deadLetterTopic: dead\ncheckpoint:\n  namespace: relay\nchannels:\n  - operationId: watchNodes\n    tombstones: true\n    partitions: 3\n",
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let table = run(&["topics", "--config", file]);
    for topic in ["prod.nodes", "dead", "watchrelay.prod.membership"] {
        assert!(table.contains(topic), "{table}");
    }
    let commands = run(&["topics", "--config", file, "-o", "commands"]);
    assert!(
        commands.contains("--topic prod.nodes --partitions 3 --config cleanup.policy=compact"),
        "{commands}"
    );
    assert!(run(&["check-config", "--config", file]).contains("ok (1 channels)"));
}

/// A reader that goes away early (`watchrelay channels | head -1`) ends the command quietly,
/// not with a panic.
#[test]
fn a_closed_output_ends_a_command_quietly() {
    for _ in 0..5 {
        let mut child = Command::new(BIN)
            .args(["channels", "-o", "json"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{:?}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A missing file is said to be missing, its cause once.
#[test]
fn a_missing_file_is_named_once() {
    let out = Command::new(BIN)
        .args(["check-config", "/nonexistent/watchrelay.yaml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot read /nonexistent/watchrelay.yaml"),
        "{err}"
    );
    assert!(!err.contains("is not valid"), "{err}");
    assert_eq!(err.matches("os error 2").count(), 1, "{err}");
}

/// A value of the wrong type is shown in its file, by the file's name, with the type said in
/// words and one `error:` only.
#[test]
fn a_wrong_type_is_said_in_words_in_its_file() {
    let (_dir, file, out) = check_config(
        "clusterName: prod\nkubernetes:\n  watchTimeoutSeconds: -3\nkafka:\n  bootstrapServers: k:9092\nchannels:\n  - operationId: watchNamespacedPods\n    namespaces: [a]\n",
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("--> {}:3:24", file.display())),
        "{err}"
    );
    assert!(err.contains("expected a whole number from 0 to"), "{err}");
    assert_eq!(err.matches("error:").count(), 1, "{err}");
}
