//! The stream tests, Secrets: whatever the channel, a Secret's data never leaves the relay, not
//! even the copy `kubectl apply` leaves in an annotation. The relay runs in-process against the
//! simulator with a producer in memory; no broker needed.

mod common;

use std::sync::Arc;

use common::bed::eventually;
use common::stream::{bed, start};
use common::view::{events, json};
use watchrelay::testing::Memory;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_applied_with_kubectl_leave_no_data_on_any_channel() {
    let bed = bed(true).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    bed.sim.write_kubeconfig(&kubeconfig).unwrap();
    let manifest = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\n  namespace: a\ntype: Opaque\nstringData:\n  password: hunter2\ndata:\n  token: c2VjcmV0LXRva2Vu\n";
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["apply", "--validate=false", "-f", "-"])
            .output_with_stdin(manifest)
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let secret = bed.sim.get("secrets", Some("a"), "db").unwrap();
    assert!(
        secret["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .as_str()
            .is_some_and(|a| a.contains("hunter2")),
        "kubectl apply leaves the whole Secret in an annotation"
    );
    let producer = Arc::new(Memory::new());
    // A namespaced custom path and a cluster-wide one: Secrets are trimmed on every channel.
    let cfg = bed.config(
        "  - path: /api/v1/namespaces/{namespace}/secrets\n    name: secrets\n    namespaces: [a]\n    watchStrategy: perNamespace\n    topic: secrets\n  - path: /api/v1/secrets\n    name: allsecrets\n    topic: all-secrets\n",
        "",
    );
    let relay = start(&bed, cfg, &producer);
    relay.wait_up(2).await;
    eventually(
        || events(&producer).len() >= 2,
        || "the Secret was not published on both channels".into(),
    )
    .await;
    relay.stop().await;
    for r in events(&producer) {
        let text = String::from_utf8_lossy(&r.value);
        assert!(
            !text.contains("hunter2") && !text.contains("c2VjcmV0LXRva2Vu"),
            "{}: {text}",
            r.topic
        );
        let object = &json(&r)["object"];
        assert!(object.get("data").is_none() && object.get("stringData").is_none());
        assert_eq!(object["type"], "Opaque");
        assert_eq!(object["metadata"]["name"], "db");
    }
}

/// Runs a command with `input` on its standard input.
trait OutputWithStdin {
    fn output_with_stdin(&mut self, input: &str) -> std::process::Output;
}

impl OutputWithStdin for std::process::Command {
    fn output_with_stdin(&mut self, input: &str) -> std::process::Output {
        use std::io::Write;
        let mut child = self
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }
}
