//! What the benchmarks share: real-looking object identities and the process's memory.
#![allow(dead_code, reason = "each benchmark uses a different part")]

/// Object `i`'s uid (a random-looking UUID) and name (as a ReplicaSet names pods), the same for
/// the same `i` in every run.
pub fn identity(i: u64) -> (String, String) {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let (a, b) = (mix(2 * i + 1), mix(2 * i + 2));
    let uid = format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | (b >> 48) & 0x3fff,
        b & 0xffff_ffff_ffff
    );
    (uid, format!("web-{:010x}-{:05x}", a >> 24, b & 0xfffff))
}

use std::io::Write as _;
use std::process::Command;

/// The relay binary to measure: this build's, or `BENCH_RELAY_BIN` (another build, to compare
/// in the same sitting).
pub fn relay_bin() -> String {
    std::env::var("BENCH_RELAY_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_watchrelay").to_string())
}

/// A field of `/proc/self/status` in KiB (`VmRSS`, `VmHWM`: the peak).
pub fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// An environment variable as a number, or `default`.
pub fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Stops a relay with SIGTERM (it drains and writes its checkpoint) and waits for it.
pub fn stop(mut relay: KillOnDrop) {
    let _ = Command::new("kill")
        .args(["-TERM", &relay.0.id().to_string()])
        .status();
    let _ = relay.0.wait();
}

/// Kills the relay if the benchmark fails half-way.
pub struct KillOnDrop(pub std::process::Child);

/// Starts the relay binary with `config`, logging at `BENCH_LOG` (warn when unset).
pub fn spawn_relay(config: &std::path::Path) -> KillOnDrop {
    let child = Command::new(relay_bin())
        .args(["run", "--config"])
        .arg(config)
        .env(
            "WATCHRELAY_LOG",
            std::env::var("BENCH_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("relay starts");
    KillOnDrop(child)
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// utime + stime of a process, in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat, counted after the command name.
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

pub fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

pub fn scrape(port: u16) -> String {
    use std::io::Read;
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

pub fn metric(port: u16, series: &str) -> Option<f64> {
    scrape(port)
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The simulator with `cfg`, served by a runtime of its own (one worker thread) in this
/// process; keep the runtime as long as the simulator.
pub fn start_sim(cfg: watchrelay_sim::SimConfig) -> (tokio::runtime::Runtime, watchrelay_sim::Sim) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("sim")
        .enable_all()
        .build()
        .unwrap();
    let sim = rt
        .block_on(watchrelay_sim::Sim::start(cfg))
        .expect("simulator");
    (rt, sim)
}

/// A loopback port free now (for the relay's HTTP listener).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Writes the records of `members` objects over `streams` streams, each object `history` times
/// more before its latest record, and `members / 4` objects that joined and left; returns the
/// records and bytes written.
pub fn fill_membership(
    bootstrap: &str,
    topic: &str,
    members: usize,
    streams: usize,
    history: usize,
) -> (usize, usize) {
    fill_membership_sharded(bootstrap, topic, members, streams, history, None)
}

/// [`fill_membership`] into a topic of one partition per shard of `sharding`, each stream's
/// records in its shard's partition, as a sharded release writes them (`None`: one partition,
/// records placed by key).
pub fn fill_membership_sharded(
    bootstrap: &str,
    topic: &str,
    members: usize,
    streams: usize,
    history: usize,
    sharding: Option<&watchrelay::config::ShardingConfig>,
) -> (usize, usize) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::config::ClientConfig;
    use rdkafka::producer::{BaseRecord, Producer as _, ThreadedProducer};
    use watchrelay::membership::{self, Known};
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let partitions = sharding.map_or(1, |s| s.shards.cast_signed());
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1))
        .set("cleanup.policy", "compact");
    futures::executor::block_on(admin.create_topics([&new], &AdminOptions::new())).unwrap();
    let producer: ThreadedProducer<rdkafka::producer::DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "500000")
        .create()
        .unwrap();
    let (mut records, mut bytes) = (0, 0);
    let mut send = |i: usize, round: usize, live: bool| {
        let (uid, name) = identity(i as u64);
        let team = i % streams;
        let stream = format!("watchNamespacedPods.team-{team}");
        let known = Known {
            key: Some(format!("team-{team}/{name}")),
            name,
            namespace: Some(format!("team-{team}")),
            rv: (1_000_000 + round * members + i).to_string(),
            topic: Some("prod.pods".into()),
        };
        let record = membership::record(topic, &owner(), &stream, &uid, live.then_some(&known));
        records += 1;
        bytes += record.key.len() + record.value.len();
        let mut rec = BaseRecord::<str, [u8]>::to(topic).key(&record.key);
        if let Some(s) = sharding {
            rec = rec.partition(s.shard_of_stream(&stream).cast_signed());
        }
        if live {
            rec = rec.payload(&record.value);
        }
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((_, back)) => {
                    rec = back;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
        }
    };
    let gone = members..members + members / 4;
    for round in 0..=history {
        for i in 0..members {
            send(i, round, true);
        }
        if round == 0 {
            gone.clone().for_each(|i| send(i, round, true));
        }
    }
    gone.for_each(|i| send(i, history, false));
    producer.flush(std::time::Duration::from_secs(600)).unwrap();
    (records, bytes)
}

/// The relay whose members the topic holds.
pub fn owner() -> watchrelay::membership::Owner {
    watchrelay::membership::Owner::new("watchrelay", "watchrelay-checkpoints")
}

/// Creates `names` with 3 partitions each.
pub async fn create_topics(bootstrap: &str, names: &[&str]) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let topics: Vec<NewTopic<'_>> = names
        .iter()
        .map(|n| NewTopic::new(n, 3, TopicReplication::Fixed(1)))
        .collect();
    admin
        .create_topics(&topics, &AdminOptions::new())
        .await
        .unwrap();
}

/// What a benchmark over the simulator starts with: the broker's address, the simulator
/// (keeping `history` changes) on its runtime, and a directory of its own.
pub fn bench_bed(
    history: usize,
) -> (
    String,
    tokio::runtime::Runtime,
    watchrelay_sim::Sim,
    tempfile::TempDir,
) {
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP_SERVERS")
        .expect("KAFKA_BOOTSTRAP_SERVERS (scripts/bench.sh sets it)");
    let (rt, sim) = start_sim(watchrelay_sim::SimConfig {
        history_limit: history,
        ..Default::default()
    });
    (bootstrap, rt, sim, tempfile::tempdir().unwrap())
}

/// The sum of a metric's series over every replica behind `ports` (`name` with a trailing space
/// for a series without labels).
pub fn total(ports: &[u16], name: &str) -> f64 {
    ports
        .iter()
        .flat_map(|p| {
            scrape(*p)
                .lines()
                .filter(|l| l.starts_with(name) && !l.starts_with('#'))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// Waits until the replicas behind `ports` share all `shards`, each owning some, and the split
/// has held for a second.
pub fn wait_shared(ports: &[u16], shards: u32) {
    let shares = || -> Vec<u32> {
        ports
            .iter()
            .map(|p| total(&[*p], "watchrelay_shards_owned ") as u32)
            .collect()
    };
    let began = std::time::Instant::now();
    let mut stable_since: Option<(std::time::Instant, Vec<u32>)> = None;
    loop {
        let now = shares();
        let shared = now.iter().sum::<u32>() == shards && now.iter().all(|&n| n > 0);
        match &stable_since {
            Some((since, was)) if shared && *was == now => {
                if since.elapsed() >= std::time::Duration::from_secs(1) {
                    return;
                }
            }
            _ => stable_since = shared.then(|| (std::time::Instant::now(), now)),
        }
        assert!(
            began.elapsed() < std::time::Duration::from_secs(120),
            "the replicas never shared the shards"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Starts replica `r` of the sharded release `name` (its own checkpoint name, shards' topic and
/// channel topic) over the pods of `namespaces`: the real binary, its metrics on the port
/// returned.
pub fn sharded_replica(
    dir: &std::path::Path,
    kubeconfig: &std::path::Path,
    bootstrap: &str,
    name: &str,
    shards: u32,
    namespaces: &[String],
    r: usize,
) -> (KillOnDrop, u16) {
    let scope = format!("namespaces: [{}]", namespaces.join(", "));
    sharded_replica_over(dir, kubeconfig, bootstrap, name, shards, &scope, r)
}

/// [`sharded_replica`] with the pods channel's scope given whole (`allNamespaces: true`...).
pub fn sharded_replica_over(
    dir: &std::path::Path,
    kubeconfig: &std::path::Path,
    bootstrap: &str,
    name: &str,
    shards: u32,
    scope: &str,
    r: usize,
) -> (KillOnDrop, u16) {
    let port = free_port();
    let config = dir.join(format!("{name}-{r}.yaml"));
    let protocol = group_protocol();
    std::fs::write(
        &config,
        format!(
            "clusterName: bench\nkubernetes:\n  kubeconfig: {}\n  backoffInitialMs: 20\n  backoffMaxMs: 100\nkafka:\n  bootstrapServers: {bootstrap}\n  oversize: trim\n\
             checkpoint:\n  namespace: watchrelay\n  name: {name}\nsharding:\n  enabled: true\n  shards: {shards}\n  topic: {name}.shards\n  groupProtocol: {protocol}\nhttp:\n  listen: 127.0.0.1:{port}\n\
             channels:\n  - operationId: watchNamespacedPods\n    {scope}\n    topic: {name}\n",
            kubeconfig.display(),
        ),
    )
    .unwrap();
    (spawn_replica(&config, r), port)
}

/// The shard group's protocol: `BENCH_GROUP_PROTOCOL`, `classic` by default; `consumer` runs
/// the group on KIP-848 (the broker's `group.consumer.*` settings then set the session and the
/// heartbeat).
fn group_protocol() -> String {
    std::env::var("BENCH_GROUP_PROTOCOL").unwrap_or_else(|_| "classic".into())
}

/// The real binary run as replica `r` (its `POD_NAME`) on the configuration file `config`,
/// logging warnings only.
///
/// With `BENCH_RELAY_LOG` set (a log filter, e.g. `info`), each replica logs at that level to
/// `replica-<r>.log` in `BENCH_RELAY_LOG_DIR` (default: the system's temporary directory).
pub fn spawn_replica(config: &std::path::Path, r: usize) -> KillOnDrop {
    let mut cmd = Command::new(relay_bin());
    cmd.args(["run", "--config"])
        .arg(config)
        .env("WATCHRELAY_LOG", "warn")
        .env("POD_NAME", format!("replica-{r}"))
        .stdin(std::process::Stdio::null());
    if let Ok(filter) = std::env::var("BENCH_RELAY_LOG") {
        let dir = std::env::var("BENCH_RELAY_LOG_DIR")
            .map_or_else(|_| std::env::temp_dir(), std::path::PathBuf::from);
        let log = std::fs::File::create(dir.join(format!("replica-{r}.log"))).expect("log file");
        cmd.env("WATCHRELAY_LOG", filter).stderr(log);
    }
    KillOnDrop(cmd.spawn().expect("relay starts"))
}

/// The route of the pods channel's stream over the benchmark namespace `ns` of cluster `bench`,
/// publishing to `topic`.
pub fn pods_route(topic: &str, ns: &str) -> watchrelay::envelope::Route {
    watchrelay::envelope::Route {
        topic: topic.to_string(),
        key: watchrelay::config::KeyTemplate::default(),
        dataschema: watchrelay::asyncapi::payload_uri("bench", "watchNamespacedPods"),
        source: format!("/clusters/bench/api/v1/namespaces/{ns}/pods"),
        channel: "/api/v1/namespaces/{namespace}/pods".into(),
        operation_id: "watchNamespacedPods".into(),
        message: "WatchEvent".into(),
        cluster: "bench".into(),
        namespace: Some(ns.into()),
        owner: None,
        schema: None,
        rendered: Default::default(),
    }
}

/// A small pod (~700 bytes of JSON) of namespace `ns`; `generation` tells its versions apart.
pub fn small_pod(ns: &str, name: &str, generation: u64) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": ns,
            "labels": {"app": "web", "pod-template-hash": "7d4b9c8f6d"},
            "annotations": {"bench/generation": generation.to_string()},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c8f6d", "uid": "5e1a7f0c-2b7d-4d8e-9a35-0c1f6e2d7b11", "controller": true}]
        },
        "spec": {"containers": [{"name": "app", "image": "registry.example.com/storefront/web:1.27.3"}], "nodeName": "node-3"},
        "status": {"phase": "Running", "podIP": "10.1.2.3", "startTime": "2026-11-01T10:00:00Z"}
    })
}

/// Creates `n` small pods (`web-0000000`, ...), pod `i` in namespace `namespace(i)`, and says
/// how long it took.
pub fn create_small_pods(sim: &watchrelay_sim::Sim, n: usize, namespace: impl Fn(usize) -> String) {
    let t = std::time::Instant::now();
    for i in 0..n {
        let ns = namespace(i);
        sim.create("pods", Some(&ns), small_pod(&ns, &format!("web-{i:07}"), 0))
            .unwrap();
    }
    println!("created {n} pods in {:.1} s", t.elapsed().as_secs_f64());
}

/// Milliseconds since 1970: a suffix that keeps one run's topics apart from another's.
pub fn run_stamp() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// Opens `GET path` on the simulator at `url` over HTTP/1.0, so the body comes without chunk
/// framing and its lines can be handed on as they are; returns the body's reader, past the
/// response's headers.
pub fn open_lines(url: &str, path: &str) -> std::io::BufReader<std::net::TcpStream> {
    use std::io::{BufRead, Write};
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut r = std::io::BufReader::with_capacity(1 << 16, s);
    let mut line = Vec::new();
    loop {
        line.clear();
        r.read_until(b'\n', &mut line).unwrap();
        if line == b"\r\n" {
            return r;
        }
    }
}

/// A producer configured like the relay's for the baselines: idempotent, acknowledged by all
/// replicas, lz4, 5 ms of linger.
pub fn plain_producer(bootstrap: &str) -> rdkafka::producer::BaseProducer {
    rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("compression.type", "lz4")
        .create()
        .unwrap()
}

/// Sends `record`, serving delivery reports and waiting while the producer's queue is full.
pub fn send_when_room<K, P>(
    producer: &rdkafka::producer::BaseProducer,
    mut record: rdkafka::producer::BaseRecord<'_, K, P>,
) where
    K: rdkafka::message::ToBytes + ?Sized,
    P: rdkafka::message::ToBytes + ?Sized,
{
    loop {
        match producer.send(record) {
            Ok(()) => break,
            Err((_, back)) => {
                record = back;
                producer.poll(std::time::Duration::from_millis(1));
            }
        }
    }
    producer.poll(std::time::Duration::ZERO);
}

/// A sharded release of the real binary relaying every pod (`watchAllPods`) to topic `name`:
/// `replicas` replicas of `shards` shards, started at once with nothing saved, their files in
/// `dir`, on the API server of `kubeconfig`; `kafka` adds lines to the `kafka` section. Each
/// replica with its metrics port and pid.
pub fn pods_release(
    dir: &std::path::Path,
    replicas: usize,
    shards: u32,
    kubeconfig: &std::path::Path,
    bootstrap: &str,
    name: &str,
    kafka: &str,
) -> Vec<(KillOnDrop, u16, u32)> {
    let protocol = group_protocol();
    (0..replicas)
        .map(|r| {
            let port = free_port();
            let config = dir.join(format!("replica-{r}.yaml"));
            std::fs::write(
                &config,
                format!(
                    "clusterName: bench\nkubernetes:\n  kubeconfig: {}\nkafka:\n  bootstrapServers: {bootstrap}\n  oversize: trim\n{kafka}\
                     checkpoint:\n  namespace: watchrelay\n  name: {name}\nsharding:\n  enabled: true\n  shards: {shards}\n  topic: {name}.shards\n  groupProtocol: {protocol}\nhttp:\n  listen: 127.0.0.1:{port}\n\
                     channels:\n  - operationId: watchAllPods\n    topic: {name}\n",
                    kubeconfig.display()
                ),
            )
            .unwrap();
            let replica = spawn_replica(&config, r);
            let pid = replica.0.id();
            (replica, port, pid)
        })
        .collect()
}
