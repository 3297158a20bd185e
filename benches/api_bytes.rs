//! Bytes the relay writes to the Kubernetes API for its checkpoints, per minute, under churn.
//!
//! The simulator holds `BENCH_OBJECTS` pods (default 20,000) in one namespace; the relay binary
//! (`BENCH_RELAY_BIN`, default this build's) syncs them, then follows churn of `BENCH_RATE`
//! changes per second (default 200) for `BENCH_SECONDS` (default 60). A watch on the checkpoint
//! ConfigMap counts every write and its size as the API server stores it, whatever version of the
//! relay wrote it, so two builds can be compared on the same bed.
//!
//! Run with scripts/bench.sh api_bytes (it starts a broker) or set KAFKA_BOOTSTRAP_SERVERS.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use watchrelay_sim::{objects, ChurnSpec, Sim, SimConfig};

mod common;

use common::env_or;

const NS: &str = "churn";

fn main() {
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP_SERVERS")
        .expect("KAFKA_BOOTSTRAP_SERVERS is not set: run scripts/bench.sh api_bytes");
    let objects = env_or("BENCH_OBJECTS", 20_000);
    let rate = env_or("BENCH_RATE", 200);
    let seconds = env_or("BENCH_SECONDS", 60) as u64;
    let bin = common::relay_bin();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let sim = rt.block_on(Sim::start(SimConfig::default())).unwrap();
    for ns in [NS, "watchrelay"] {
        sim.create("namespaces", None, objects::namespace(ns))
            .unwrap();
    }
    for i in 0..objects {
        sim.create("pods", Some(NS), objects::pod(NS, &format!("web-{i}")))
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    let topic = format!("bench.api-bytes.{}", std::process::id());
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "clusterName: bench\nkubernetes:\n  kubeconfig: {}\nkafka:\n  bootstrapServers: {bootstrap}\n  oversize: trim\n\
             checkpoint:\n  namespace: watchrelay\n  membership:\n    topic: {topic}.membership\nhttp:\n  listen: \"\"\n\
             channels:\n  - operationId: watchNamespacedPods\n    namespaces: [{NS}]\n    topic: {topic}\n",
            kubeconfig.display()
        ),
    )
    .unwrap();
    create_topic(&bootstrap, &topic);

    // Every write of the checkpoint ConfigMap, as the API server stores it.
    let (writes, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    {
        let (writes, bytes, url) = (writes.clone(), bytes.clone(), sim.url());
        std::thread::spawn(move || count_writes(&url, &writes, &bytes));
    }
    let mut relay = Command::new(&bin)
        .args(["run", "--config"])
        .arg(&config)
        .env("WATCHRELAY_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .expect("the relay starts");
    // The first sync: until the position covers every object.
    let synced = sim.current_rv();
    let t = Instant::now();
    while checkpoint_rv(&sim) < synced {
        assert!(
            t.elapsed() < Duration::from_secs(600),
            "the relay never synced"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "{bin}: synced {objects} pods in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let (w0, b0) = (writes.load(Ordering::SeqCst), bytes.load(Ordering::SeqCst));
    let churn = sim.start_churn(ChurnSpec {
        rate_per_sec: rate as f64,
        namespaces: vec![NS.into()],
        resources: vec!["pods".into()],
        max_objects_per_kind: objects,
        total_events: None,
    });
    std::thread::sleep(Duration::from_secs(seconds));
    let (w1, b1) = (writes.load(Ordering::SeqCst), bytes.load(Ordering::SeqCst));
    let changes = rt.block_on(churn.stop());
    let _ = relay.kill();
    let _ = relay.wait();
    let per_minute = |x: u64| x as f64 * 60.0 / seconds as f64;
    println!(
        "under churn ({changes} changes in {seconds} s): {:.0} checkpoint writes/min, {:.0} KB/min written to the API, {:.1} KB per write; ConfigMap now {} bytes",
        per_minute(w1 - w0),
        per_minute(b1 - b0) / 1e3,
        (b1 - b0) as f64 / (w1 - w0).max(1) as f64 / 1e3,
        configmap_bytes(&sim)
    );
}

fn create_topic(bootstrap: &str, topic: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> =
        rdkafka::config::ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .create()
            .unwrap();
    let new = NewTopic::new(topic, 3, TopicReplication::Fixed(1));
    futures::executor::block_on(admin.create_topics([&new], &AdminOptions::new())).unwrap();
}

fn checkpoint_rv(sim: &Sim) -> u64 {
    sim.get("configmaps", Some("watchrelay"), "watchrelay-checkpoints")
        .and_then(|cm| {
            let entry = cm["data"]["watchNamespacedPods.churn"]
                .as_str()?
                .to_string();
            let v: serde_json::Value = serde_json::from_str(&entry).ok()?;
            v["rv"].as_str()?.parse().ok()
        })
        .unwrap_or(0)
}

fn configmap_bytes(sim: &Sim) -> usize {
    sim.get("configmaps", Some("watchrelay"), "watchrelay-checkpoints")
        .map(|cm| serde_json::to_vec(&cm).unwrap().len())
        .unwrap_or(0)
}

/// Watches the checkpoint ConfigMap's namespace and counts each ADDED or MODIFIED and its size.
fn count_writes(url: &str, writes: &AtomicU64, bytes: &AtomicU64) {
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /api/v1/namespaces/watchrelay/configmaps?watch=true&resourceVersion=0 HTTP/1.0\r\nHost: {addr}\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut buf = String::new();
    loop {
        buf.clear();
        if r.read_line(&mut buf).unwrap_or(0) == 0 {
            return;
        }
        let line = &buf;
        let line = line.trim_end();
        if line.starts_with("{\"type\":\"ADDED\"") || line.starts_with("{\"type\":\"MODIFIED\"") {
            writes.fetch_add(1, Ordering::SeqCst);
            bytes.fetch_add(line.len() as u64, Ordering::SeqCst);
        }
    }
}
