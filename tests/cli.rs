//! The binary's command line (no broker needed).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_watchrelay");

#[test]
fn check_config_names_the_offending_field() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    std::fs::write(
        &file,
        "clusterName: prod\nkafka:\n  bootstrapServers: k:9092\n  oversize: trim\ncheckpoint:\n  namespace: relay\nchannels:\n  - operationId: watchNamespacedPods\n    namespaces: [default]\n  - operationId: watchNamespacedDeployments\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("check-config")
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("channels[1].namespaces"), "{err}");

    let good = dir.path().join("good.yaml");
    std::fs::write(&good, "clusterName: prod\nkafka:\n  bootstrapServers: k:9092\n  oversize: trim\ncheckpoint:\n  namespace: relay\nchannels:\n  - operationId: watchNodes\n").unwrap();
    let out = Command::new(BIN)
        .arg("check-config")
        .arg(&good)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("watchNodes"));
}
