//! The API server's sharded lists and watches, on the real kube-apiserver and etcd: what each
//! replica of a sharded release is sent, with the `ShardedListAndWatch` gate on and off.
//!
//! For each of the two, a control plane of its own (`scripts/cluster.sh`) holds `BENCH_PODS`
//! small pods (default 20,000) over `BENCH_NAMESPACES` namespaces (default 1,000); three
//! replicas of the real binary (64 shards, one channel `watchAllPods`) start at once with
//! nothing saved. Until the records they published together reach the pods: the time, and per
//! replica the records it published, the objects the API server sent it of its own shards and of
//! other replicas' (`fanout_objects_received_total`), and its peak RSS.
//!
//! Run with `scripts/bench.sh server_shards` (it starts a broker) or set
//! KAFKA_BOOTSTRAP_SERVERS; the control plane is built by `scripts/cluster.sh install`.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    create_topics, env_or, metric, peak_rss_kib, pods_release, run_stamp, small_pod, total,
};
use serde_json::json;

const SHARDS: u32 = 64;
const REPLICAS: usize = 3;

fn main() {
    let n = env_or("BENCH_PODS", 20_000);
    let namespaces = env_or("BENCH_NAMESPACES", 1_000);
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP_SERVERS")
        .expect("KAFKA_BOOTSTRAP_SERVERS is not set: run scripts/bench.sh server_shards");
    let rt = tokio::runtime::Runtime::new().unwrap();
    println!(
        "{:<34} {:>9} {:>10} {:>8} {:>12} {:>12} {:>9}",
        format!("{n} pods, {namespaces} namespaces"),
        "time s",
        "records",
        "share",
        "sent own",
        "sent other",
        "RSS MiB"
    );
    for (gates, label) in [
        ("WatchList=true,ShardedListAndWatch=true", "gate on"),
        ("WatchList=true", "gate off"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let _cluster = Cluster::start(dir.path(), gates);
        let kubeconfig = dir.path().join("kubeconfig");
        let t = Instant::now();
        create_pods(&kubeconfig, n, namespaces);
        eprintln!(
            "{label}: created {n} pods in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let name = format!("bench.servershards.{}", run_stamp());
        rt.block_on(create_topics(&bootstrap, &[&name]));

        let started = Instant::now();
        let release = pods_release(
            dir.path(),
            REPLICAS,
            SHARDS,
            &kubeconfig,
            &bootstrap,
            &name,
            "",
        );
        let ports: Vec<u16> = release.iter().map(|(_, p, _)| *p).collect();
        while total(&ports, "watchrelay_events_published_total") < n as f64 {
            assert!(
                started.elapsed() < Duration::from_secs(1800),
                "the release never published the {n} pods"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let secs = started.elapsed().as_secs_f64();
        let mut line = format!("BENCH server_shards {} pods={n}", label.replace(' ', "_"));
        for (r, (_, port, pid)) in release.iter().enumerate() {
            let records = total(&[*port], "watchrelay_events_published_total");
            let sent = |whose: &str| {
                metric(
                    *port,
                    &format!("watchrelay_fanout_objects_received_total{{whose=\"{whose}\"}}"),
                )
                .unwrap_or(0.0)
            };
            let (own, other) = (sent("own"), sent("other"));
            println!(
                "{:<34} {:>9} {records:>10.0} {:>7.0}% {own:>12.0} {other:>12.0} {:>9.0}",
                format!("{label}: replica {r} of {REPLICAS}"),
                if r == 0 {
                    format!("{secs:.1}")
                } else {
                    String::new()
                },
                records / n as f64 * 100.0,
                peak_rss_kib(*pid) as f64 / 1024.0
            );
            line.push_str(&format!(" r{r}_sent={:.2}", (own + other) / n as f64));
            line.push_str(&format!(" r{r}_other={other:.0}"));
        }
        println!("{line} first_sync_s={secs:.1}");
        drop(release);
    }
}

/// A control plane of the bench's own, stopped when dropped.
struct Cluster(PathBuf);

impl Cluster {
    fn start(dir: &Path, gates: &str) -> Self {
        let out = Command::new("scripts/cluster.sh")
            .arg("start")
            .arg(dir)
            .env("FEATURE_GATES", gates)
            .output()
            .expect("scripts/cluster.sh runs");
        assert!(
            out.status.success(),
            "the control plane did not start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self(dir.to_path_buf())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("scripts/cluster.sh")
            .arg("stop")
            .arg(&self.0)
            .status();
    }
}

/// Creates the namespaces `ns-<i>` and `n` pods over them through kubectl.
fn create_pods(kubeconfig: &Path, n: usize, namespaces: usize) {
    let bin = Command::new("scripts/cluster.sh")
        .arg("bin")
        .output()
        .unwrap();
    let kubectl = PathBuf::from(String::from_utf8(bin.stdout).unwrap().trim()).join("kubectl");
    let create = |items: Vec<serde_json::Value>| {
        let mut child = Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["create", "-f", "-", "-o", "name"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
        child
            .stdin
            .take()
            .unwrap()
            .write_all(list.to_string().as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success(), "kubectl create failed");
    };
    let names = ["watchrelay".to_string()]
        .into_iter()
        .chain((0..namespaces).map(|i| format!("ns-{i}")));
    create(
        names
            .map(|ns| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .collect(),
    );
    let pods: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            let ns = format!("ns-{}", i % namespaces);
            small_pod(&ns, &format!("web-{i:07}"), 0)
        })
        .collect();
    // Eight requests at once: one kubectl creates its objects one after the other.
    let chunks: Vec<&[serde_json::Value]> = pods.chunks(250).collect();
    std::thread::scope(|scope| {
        for lane in chunks.chunks(chunks.len().div_ceil(8)) {
            let create = &create;
            scope.spawn(move || {
                for chunk in lane {
                    create(chunk.to_vec());
                }
            });
        }
    });
}
