//! The real control plane (etcd and kube-apiserver, `scripts/cluster.sh`) the test command
//! starts for the real-cluster tier, and the relay's binary run against it.
//!
//! Every test binary shares the one cluster: each test works in namespaces and topics of its
//! own (see [`unique`]), and cluster-scoped objects carry its prefix.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::kafka;

pub const BIN: &str = env!("CARGO_BIN_EXE_watchrelay");

/// A name no other test uses, valid as a namespace (a DNS label).
pub fn unique(prefix: &str) -> String {
    kafka::unique(prefix).to_ascii_lowercase()
}

pub struct Cluster {
    dir: PathBuf,
    /// A cluster of the test's own, stopped when dropped.
    own: Option<tempfile::TempDir>,
}

impl Cluster {
    /// A cluster of the test's own with `feature_gates` for the API server (the suite's has
    /// `WatchList=true`): four seconds or so to start.
    pub fn start_own(feature_gates: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(script())
            .arg("start")
            .arg(dir.path())
            .env("FEATURE_GATES", feature_gates)
            .output()
            .expect("scripts/cluster.sh runs");
        assert!(
            out.status.success(),
            "the cluster did not start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self {
            dir: dir.path().to_path_buf(),
            own: Some(dir),
        }
    }

    /// The cluster the test command started (`WATCHRELAY_TEST_CLUSTER`, the folder
    /// `scripts/cluster.sh start` used). Panics without one: these tests never pass by skipping.
    pub fn from_env() -> Self {
        let dir = std::env::var("WATCHRELAY_TEST_CLUSTER").expect(
            "WATCHRELAY_TEST_CLUSTER is not set: run the suite with scripts/test.sh, or start a cluster with scripts/cluster.sh start DIR and export DIR",
        );
        Self {
            dir: PathBuf::from(dir),
            own: None,
        }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    fn bin(tool: &str) -> PathBuf {
        let out = Command::new(script())
            .arg("bin")
            .output()
            .expect("scripts/cluster.sh runs");
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()).join(tool)
    }

    /// Runs kubectl with the admin's kubeconfig and `stdin`; its output, or its error.
    pub fn try_kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        use std::io::Write;
        let mut child = Command::new(Self::bin("kubectl"))
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl runs");
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).unwrap();
        }
        drop(input);
        let out = child.wait_with_output().unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    pub fn kubectl(&self, args: &[&str]) -> String {
        self.try_kubectl(args, None)
            .unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"))
    }

    /// `kubectl apply` of JSON or YAML objects.
    pub fn apply(&self, manifest: &str) {
        self.try_kubectl(&["apply", "-f", "-"], Some(manifest))
            .unwrap_or_else(|e| panic!("kubectl apply: {e}\n{manifest}"));
    }

    /// Every object of `resource` (in `namespace`, or everywhere).
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> Vec<Value> {
        let mut args = vec!["get", resource, "-o", "json"];
        match namespace {
            Some(ns) => args.extend(["-n", ns]),
            None => args.push("--all-namespaces"),
        }
        let list: Value = serde_json::from_str(&self.kubectl(&args)).unwrap();
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// Compacts etcd's history up to its current revision: a watch from any older
    /// resourceVersion of a resource the API server does not cache then gets 410 Gone.
    pub fn compact(&self) {
        let endpoint = std::fs::read_to_string(self.dir.join("etcd.url")).unwrap();
        let etcdctl = |args: &[&str]| {
            let out = Command::new(Self::bin("etcdctl"))
                .arg(format!("--endpoints={}", endpoint.trim()))
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "etcdctl {args:?}: {out:?}");
            String::from_utf8(out.stdout).unwrap()
        };
        let status: Value =
            serde_json::from_str(&etcdctl(&["endpoint", "status", "-w", "json"])).unwrap();
        let revision = status[0]["Status"]["header"]["revision"].as_u64().unwrap();
        etcdctl(&["compact", &revision.to_string()]);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.own.is_some() {
            let _ = Command::new(script()).arg("stop").arg(&self.dir).status();
        }
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster.sh")
}

/// The relay's binary, run against the cluster with a configuration file of the test's.
pub struct RelayProcess {
    child: Child,
    /// The binary it runs: this version's, or an older one's.
    bin: PathBuf,
    pub log: PathBuf,
    pub config: PathBuf,
    /// `POD_NAME`: the replica's identity in the Lease.
    pod: String,
}

impl RelayProcess {
    /// Writes `config` to `dir` and starts `watchrelay run` on it.
    pub fn start(dir: &Path, config: &str) -> Self {
        Self::replica(dir, config, "relay-0")
    }

    /// [`RelayProcess::start`] as the replica `pod` (its identity in the Lease and the shard
    /// group), its configuration and log in `dir/pod`.
    pub fn replica(dir: &Path, config: &str, pod: &str) -> Self {
        Self::replica_of(Path::new(BIN), dir, config, pod)
    }

    /// [`RelayProcess::replica`] of the relay built as `bin` (another version's).
    pub fn replica_of(bin: &Path, dir: &Path, config: &str, pod: &str) -> Self {
        let dir = dir.join(pod);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.yaml");
        std::fs::write(&path, config).unwrap();
        let log = dir.join("relay.log");
        let mut p = Self {
            child: Command::new("true").spawn().unwrap(),
            bin: bin.to_path_buf(),
            log,
            config: path,
            pod: pod.to_string(),
        };
        p.restart();
        p
    }

    /// Sends `signal` (`-STOP`, `-CONT`, …) to the process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the binary again on the same configuration and log.
    pub fn restart(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        self.child = Command::new(&self.bin)
            .env("POD_NAME", &self.pod)
            .args(["run", "--config"])
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
    }

    /// SIGTERM, and waits for the drained exit; panics if it was not clean.
    pub fn stop(&mut self) {
        self.signal("-TERM");
        let exit = self.child.wait().unwrap();
        assert!(exit.success(), "the relay exited {exit:?}:\n{}", self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `watchrelay split-whole` on this replica's configuration, run to its end.
    pub fn split_whole(&self) -> std::process::Output {
        Command::new(&self.bin)
            .args(["split-whole", "--config"])
            .arg(&self.config)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Waits until the log contains `text` (hang guard: 60 s).
    pub async fn wait_log(&self, text: &str) {
        for _ in 0..600 {
            if self.log().contains(text) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the relay never logged {text:?}:\n{}", self.log());
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
