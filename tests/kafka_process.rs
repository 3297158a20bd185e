//! The binary: SIGKILL and restart (during churn, and with deletions and compaction while it is
//! down), and a draining SIGTERM.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::bed::{assert_covers, Bed, CHECKPOINT_NS};
use common::kafka;
use common::view;
use watchrelay_sim::ChurnSpec;

const BIN: &str = env!("CARGO_BIN_EXE_watchrelay");
const STREAM: &str = "watchNamespacedPods.a";

fn spawn(config: &std::path::Path, log: &std::path::Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(BIN)
        .args(["run", "--config"])
        .arg(config)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// The relay's configuration and log file for a bed, in `dir`.
fn write_config(
    bed: &Bed,
    dir: &std::path::Path,
    topic: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let kubeconfig = dir.join("kubeconfig");
    bed.sim.write_kubeconfig(&kubeconfig).unwrap();
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "clusterName: test\nkubernetes:\n  kubeconfig: {}\n  backoffInitialMs: 20\n  backoffMaxMs: 300\n\
             kafka:\n  bootstrapServers: {}\n  oversize: trim\n\
             checkpoint:\n  namespace: {CHECKPOINT_NS}\n  intervalMs: 100\n  membership:\n    topic: {}\nhttp:\n  listen: \"127.0.0.1:0\"\n\
             channels:\n  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: {topic}\n",
            kubeconfig.display(),
            bed.bootstrap,
            bed.membership
        ),
    )
    .unwrap();
    (config, dir.join("relay.log"))
}

/// The binary relaying pods of namespace `a` to a new topic, its first list checkpointed (so
/// churn started now arrives through a watch): the topic, configuration, log and process.
async fn started(
    bed: &Bed,
    dir: &std::path::Path,
) -> (String, std::path::PathBuf, std::path::PathBuf, Child) {
    let topic = kafka::unique("proc");
    kafka::create_topics(&[&topic], 3).await;
    let (config, log) = write_config(bed, dir, &topic);
    let child = spawn(&config, &log);
    bed.wait_checkpoint(|c| c.contains_key(STREAM)).await;
    (topic, config, log, child)
}

/// 300 changes a second to the pods of namespace `a`, up to `max` of them at a time.
fn churn(bed: &Bed, max: usize) -> watchrelay_sim::ChurnHandle {
    bed.sim.start_churn(ChurnSpec {
        rate_per_sec: 300.0,
        namespaces: vec!["a".into()],
        resources: vec!["pods".into()],
        max_objects_per_kind: max,
        total_events: None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_and_restart_lose_nothing_and_sigterm_drains() {
    let bed = Bed::new(&["a"]).await;
    let dir = tempfile::tempdir().unwrap();
    let (topic, config, log, mut child) = started(&bed, dir.path()).await;
    let churn = churn(&bed, 30);
    for round in 0..3u64 {
        // Not a wait: the crash instants are the test's, a different one each round, wherever the
        // relay is then (starting, restoring, relaying).
        tokio::time::sleep(Duration::from_millis(1200 + 300 * round)).await;
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        child = spawn(&config, &log);
    }
    // Churn goes on until the last start relays changes made since it began.
    bed.wait_checkpoint_past(STREAM, bed.sim.current_rv()).await;
    churn.stop().await;
    let expected = bed.journal("pods", Some("a"));
    let msgs = bed.read_covering(&topic, &expected).await;
    let relay_log = || std::fs::read_to_string(&log).unwrap_or_default();
    if msgs.len() < expected.len() {
        eprintln!("relay log:\n{}", relay_log());
    }
    assert_covers(&msgs, &expected);

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(
        exit.success(),
        "a drained shutdown exits 0: {exit:?}\n{}",
        relay_log()
    );
    assert!(relay_log().contains("stopped"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_churn_then_deletions_and_compaction_while_down_converge() {
    let bed = Bed::new(&["a"]).await;
    let dir = tempfile::tempdir().unwrap();
    let (topic, config, log, mut child) = started(&bed, dir.path()).await;
    let before = bed.journal("pods", Some("a")).len();
    let churn = churn(&bed, 60);
    // Killed once it announced a good many pods, churn going on.
    bed.wait_pods_relayed(STREAM, "a", before, 300).await;
    child.kill().unwrap(); // SIGKILL, mid-churn
    child.wait().unwrap();
    churn.stop().await;
    // While down: a third of the pods go, some of them announced after the last checkpoint,
    // and history is compacted, so the restart must infer their deletions from its members.
    for p in bed.sim.list("pods", Some("a")).iter().step_by(3) {
        let name = p["metadata"]["name"].as_str().unwrap().to_string();
        bed.sim.delete("pods", Some("a"), &name).unwrap();
    }
    bed.sim.compact();
    let mut child = spawn(&config, &log);
    let sim = bed.sim.clone();
    let msgs = bed
        .read_until(&topic, move |m| {
            view::kafka_view(m) == view::pods(&sim, &["a"], |_| true)
        })
        .await;
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        view::kafka_view(&msgs),
        view::pods(&bed.sim, &["a"], |_| true),
        "relay log:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}
