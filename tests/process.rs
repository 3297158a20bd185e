//! The binary: SIGKILL and restart, and a draining SIGTERM.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::bed::{assert_covers, Bed, CHECKPOINT_NS};
use common::kafka;
use watchrelay_sim::ChurnSpec;

const BIN: &str = env!("CARGO_BIN_EXE_watchrelay");

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_and_restart_lose_nothing_and_sigterm_drains() {
    let bed = Bed::new(&["a"]).await;
    let topic = kafka::unique("proc");
    kafka::create_topics(&[&topic], 3).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    bed.sim.write_kubeconfig(&kubeconfig).unwrap();
    let config = dir.path().join("config.yaml");
    let log = dir.path().join("relay.log");
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
    let mut child = spawn(&config, &log);
    // Churn starts once the first list is checkpointed, so every change arrives through a watch.
    bed.wait_checkpoint(|c| c.contains_key("watchNamespacedPods.a"))
        .await;
    let churn = bed.sim.start_churn(ChurnSpec {
        rate_per_sec: 300.0,
        namespaces: vec!["a".into()],
        resources: vec!["pods".into()],
        max_objects_per_kind: 30,
        total_events: None,
    });
    for round in 0..3u64 {
        tokio::time::sleep(Duration::from_millis(1200 + 300 * round)).await;
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        child = spawn(&config, &log);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
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
