//! Throughput, latency, CPU and memory of the relay, next to a bare producer baseline.
//!
//! 1. The simulator's history is filled with N modifications of ~4 KB pods (pre-generated, not
//!    measured).
//! 2. Baseline: a child process sends the same records the relay produces (envelopes with
//!    their CloudEvents headers, made before timing starts) with a bare rdkafka producer
//!    configured like the relay's, waiting for every acknowledgement. Like the relay, it hands
//!    each record's headers to rdkafka as it sends it (librdkafka's header list is built per
//!    record, timed) and serves its delivery reports on its sending thread.
//! 3. Pass-through: a child process reads the same watch replay from the simulator and hands
//!    each line to the same producer as is: the floor of any relay on this bed, with the
//!    simulator in the loop as it is for the relay.
//! 4. Relay: the real binary starts from a checkpoint just before those events, so its watch
//!    replays them as fast as it can read, envelope and publish them. Before it, each round, the
//!    same with `kafka.delivery: exactlyOnce` (its records committed in Kafka transactions every
//!    100 ms) into a topic of its own, counted as its records are committed.
//!
//! Steps 2 to 4 alternate for BENCH_ROUNDS rounds (default 3) and each side is reported by its
//! median round. Each first sends a warm-up of W events (connections, producer id, topic
//! metadata); the clock and the CPU count run from the acknowledgement of the warm-up to that of
//! the N events after it, so every figure is a steady-state rate.
//! 5. Latency: the same relay then follows live churn at a fixed rate; the publish latency (watch
//!    arrival to Kafka acknowledgement) comes from its own histogram. Then a relay with
//!    exactly-once delivery follows the same churn: its latency runs to the commit of the
//!    record's transaction (what a `read_committed` consumer waits for). The two alternate for
//!    BENCH_ROUNDS rounds (the at-least-once relay restarted from where the churn is), each side
//!    reported by its round of median p99.
//!
//! The peer: with OTELCOL_BIN set (scripts/bench.sh builds it), each round also runs the
//! OpenTelemetry Collector (k8sobjects receiver watching the same pods from the same
//! resourceVersion, kafka exporter acknowledged by all replicas, lz4, its batch processor) on the
//! same simulator and broker; its rate and CPU are counted from its topic's high watermarks
//! past the warm-up, and what it published (records per change, keyed records) is reported.
//!
//! CPU and peak RSS are read from /proc for each child process, so the simulator's share is not
//! counted. Run with scripts/bench.sh (it starts a broker) or set KAFKA_BOOTSTRAP_SERVERS.

mod common;

use common::{
    bench_bed, cpu_seconds, create_topics, free_port, metric, peak_rss_kib, scrape, spawn_relay,
    stop, KillOnDrop,
};
use std::io::{BufRead, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::message::{Header, OwnedHeaders, ToBytes};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientContext;
use serde_json::json;
use watchrelay::decode;
use watchrelay::envelope::{self, Announcement};
use watchrelay_sim::objects;

const NS: &str = "bench";
const STREAM: &str = "watchNamespacedPods.bench";

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    match args.first().map(String::as_str) {
        Some("baseline") => {
            return baseline(
                &args[1],
                &args[2],
                Path::new(&args[3]),
                args[4].parse().unwrap(),
            )
        }
        Some("passthrough") => {
            return passthrough(
                &args[1],
                &args[2],
                &args[3],
                args[4].parse().unwrap(),
                args[5].parse().unwrap(),
                args[6].parse().unwrap(),
            )
        }
        _ => {}
    }
    let n: usize = std::env::var("BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let in_flight: usize = std::env::var("BENCH_IN_FLIGHT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let warmup = (n / 10).clamp(1, 5_000);
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let rate: f64 = std::env::var("BENCH_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000.0);
    let (bootstrap, rt, sim, dir) = bench_bed(n + 500_000);
    let _runtime = rt.enter();
    sim.create("namespaces", None, objects::namespace(NS))
        .unwrap();
    sim.create("namespaces", None, objects::namespace("watchrelay"))
        .unwrap();

    // 1. Pre-generate the history and the baseline's input.
    let pods = 500;
    for i in 0..pods {
        sim.create("pods", Some(NS), objects::pod(NS, &format!("pod-{i}")))
            .unwrap();
    }
    let start_rv = sim.current_rv();
    let input = dir.path().join("objects.jsonl");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&input).unwrap());
    let mut bytes = 0usize;
    for i in 0..warmup + n {
        let name = format!("pod-{}", i % pods);
        let obj = sim
            .merge_patch(
                "pods",
                Some(NS),
                &name,
                json!({"metadata": {"annotations": {"bench/seq": i.to_string()}}}),
            )
            .unwrap();
        let line = serde_json::to_string(&obj).unwrap();
        bytes += line.len();
        writeln!(file, "{NS}/{name}\t{line}").unwrap();
    }
    file.flush().unwrap();
    drop(file);
    let avg = bytes / (warmup + n);
    println!("pre-generated {warmup} + {n} pod modifications, {avg} bytes per object on average");

    let topic_base = format!("bench-baseline-{}", std::process::id());
    let topic_relay = format!("bench-relay-{}", std::process::id());
    let topic_pass = format!("bench-passthrough-{}", std::process::id());
    let topic_otel = format!("bench-otel-{}", std::process::id());
    rt.block_on(create_topics(
        &bootstrap,
        &[&topic_base, &topic_relay, &topic_pass, &topic_otel],
    ));
    let otelcol = std::env::var("OTELCOL_BIN")
        .ok()
        .filter(|b| Path::new(b).exists());

    // The ceiling: how fast the simulator serves the same replay to a reader that only counts.
    let sim_rate = n as f64 / sim_replay_secs(&sim.url(), start_rv + warmup as u64, n);
    let (decode_us, serde_us) = decode_costs(&input);

    let saved = json!({ "rv": start_rv.to_string() }).to_string();
    sim.create(
        "configmaps",
        Some("watchrelay"),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "watchrelay-checkpoints", "namespace": "watchrelay"}, "data": {STREAM: saved}}),
    )
    .unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    let port = free_port();
    // A relay's configuration: its checkpoint ConfigMap `name` (made with the position before
    // the warm-up, unless it exists), its topic, its delivery.
    let relay_config = |file: &str, name: &str, topic: &str, delivery: &str| {
        let config = dir.path().join(file);
        std::fs::write(
            &config,
            format!(
                "clusterName: bench\nkubernetes:\n  kubeconfig: {}\nkafka:\n  bootstrapServers: {bootstrap}\n  oversize: trim\n  maxInFlightPerStream: {in_flight}\n  delivery: {delivery}\n\
                 checkpoint:\n  namespace: watchrelay\n  name: {name}\n  membership:\n    topic: {topic}.membership\nhttp:\n  listen: 127.0.0.1:{port}\n\
                 channels:\n  - operationId: watchNamespacedPods\n    namespaces: [{NS}]\n    topic: {topic}\n",
                kubeconfig.display()
            ),
        )
        .unwrap();
        config
    };
    let config = relay_config(
        "config.yaml",
        "watchrelay-checkpoints",
        &topic_relay,
        "atLeastOnce",
    );
    // A relay with exactly-once delivery resuming from `rv`, under a checkpoint and into a
    // topic of its own: its positions live in Kafka, so each run is a new release.
    let mut exact_runs = 0;
    let mut exact_at = |rv: u64| {
        exact_runs += 1;
        let name = format!("watchrelay-exactly-{exact_runs}");
        let topic_exact = format!("bench-exactly-{}-{exact_runs}", std::process::id());
        rt.block_on(create_topics(&bootstrap, &[&topic_exact]));
        let data = json!({ "rv": rv.to_string() }).to_string();
        sim.create(
            "configmaps",
            Some("watchrelay"),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "watchrelay"}, "data": {STREAM: data}}),
        )
        .unwrap();
        relay_config(&format!("{name}.yaml"), &name, &topic_exact, "exactlyOnce")
    };

    // 2 to 4, alternating for several rounds: this machine's noise is larger than the
    // differences measured, so each side is reported by its median round.
    let mut base_rounds = Vec::new();
    let mut pass_rounds = Vec::new();
    let mut relay_rounds = Vec::new();
    let mut otel_rounds = Vec::new();
    let mut exact_rounds = Vec::new();
    let mut relay = None;
    for round in 1..=rounds {
        let b = Round::of_child(
            &[
                "baseline",
                &bootstrap,
                &topic_base,
                &input.display().to_string(),
                &warmup.to_string(),
            ],
            n,
        );
        let p = Round::of_child(
            &[
                "passthrough",
                &bootstrap,
                &topic_pass,
                &sim.url(),
                &start_rv.to_string(),
                &warmup.to_string(),
                &n.to_string(),
            ],
            n,
        );

        // The relay, resuming just before the warm-up and the N events.
        if let Some(previous) = relay.take() {
            stop(previous);
            sim.merge_patch(
                "configmaps",
                Some("watchrelay"),
                "watchrelay-checkpoints",
                json!({"data": {STREAM: saved}}),
            )
            .unwrap();
        }
        // Exactly once, resuming just before the warm-up and the N events.
        let (e, exact) = relay_round(&exact_at(start_rv), port, warmup, n);
        let commits = metric(port, "watchrelay_transaction_commit_seconds_count").unwrap_or(0.0);
        let committing = metric(port, "watchrelay_transaction_commit_seconds_sum").unwrap_or(0.0);
        println!(
            "round {round}: exactly once: {commits:.0} commits, {:.1} ms each on average",
            1e3 * committing / commits.max(1.0)
        );
        stop(exact);
        exact_rounds.push(e);

        let (r, child) = relay_round(&config, port, warmup, n);
        relay = Some(child);
        println!(
            "round {round}: bare producer {:.0} events/s, {:.2} µs/event; pass-through {:.0} events/s, {:.2} µs/event; watchrelay {:.0} events/s, {:.2} µs/event; exactly once {:.0} events/s, {:.2} µs/event",
            b.rate, b.cpu_us, p.rate, p.cpu_us, r.rate, r.cpu_us, exact_rounds[round - 1].rate, exact_rounds[round - 1].cpu_us
        );
        if let Some(bin) = &otelcol {
            let o = otel_round(
                bin,
                &kubeconfig,
                &bootstrap,
                &format!("{topic_otel}-{round}"),
                start_rv,
                warmup,
                n,
                dir.path(),
                &rt,
            );
            println!(
                "round {round}: OpenTelemetry Collector {:.0} events/s, {:.2} µs/event",
                o.rate, o.cpu_us
            );
            otel_rounds.push(o);
        }
        base_rounds.push(b);
        pass_rounds.push(p);
        relay_rounds.push(r);
    }
    let relay = relay.expect("at least one round");
    let pid = relay.0.id();
    let base = Round::median(&base_rounds);
    let rel = Round::median(&relay_rounds);
    let pass = Round::median(&pass_rounds);
    let rss_after_replay = rel.rss_kib;

    // 5. Live churn at a fixed rate: publish latency from the relay's own histogram; then the
    // same churn followed by a relay with exactly-once delivery from where it is now. Both
    // alternate for the rounds, each side reported by its median round by p99: a stall of
    // this machine's (a broker's write-back, say) lands in one round, not in the figure.
    let mut relay = Some(relay);
    let (mut latencies, mut exact_latencies) = (Vec::new(), Vec::new());
    let mut peak_rss = 0;
    for _ in 0..rounds {
        let alo = relay.take().unwrap_or_else(|| {
            // No relay runs: the history so far goes, so the simulator's memory stays that of
            // one round (the relay resumes where the churn is).
            sim.compact();
            let data = json!({ "rv": sim.current_rv().to_string() }).to_string();
            sim.merge_patch(
                "configmaps",
                Some("watchrelay"),
                "watchrelay-checkpoints",
                json!({"data": {STREAM: data}}),
            )
            .unwrap();
            let alo = spawn_relay(&config);
            wait_watching(port);
            alo
        });
        latencies.push(live_latency(&sim, port, rate, pods));
        if peak_rss == 0 {
            peak_rss = peak_rss_kib(pid);
        }
        stop(alo);
        sim.compact();
        let exact = spawn_relay(&exact_at(sim.current_rv()));
        wait_watching(port);
        exact_latencies.push(live_latency(&sim, port, rate, pods));
        stop(exact);
    }
    let (achieved, p50, p99) = median_by_p99(latencies);
    let (exact_achieved, exact_p50, exact_p99) = median_by_p99(exact_latencies);
    let exact_round = Round::median(&exact_rounds);

    println!();
    println!(
        "{:<34} {:>14} {:>14} {:>8}",
        format!("median of {rounds} rounds"),
        "bare producer",
        "watchrelay",
        "ratio"
    );
    println!(
        "{:<34} {:>14.0} {:>14.0} {:>7.0}%",
        "events/s (~4.8 KB pods)",
        base.rate,
        rel.rate,
        100.0 * rel.rate / base.rate
    );
    println!(
        "{:<34} {:>14.0} (the simulator serving the replay to a bare reader)",
        "events/s ceiling", sim_rate
    );
    println!(
        "{:<34} {:>14.0} events/s ({:.0}% of the bare producer), {:.2} µs/event: read the watch, produce each line as is",
        "pass-through", pass.rate, 100.0 * pass.rate / base.rate, pass.cpu_us
    );
    println!(
        "{:<34} {:>14.2} {:>14.2} {:>7.2}x",
        "CPU µs per event (whole process)",
        base.cpu_us,
        rel.cpu_us,
        rel.cpu_us / base.cpu_us
    );
    println!(
        "{:<34} {:>14.2} {:>14.2} (one thread, no contention: serde_json RawValue pass vs the relay's decode)",
        "decode µs per watch line", serde_us, decode_us
    );
    println!(
        "{:<34} {:>14} {:>14}",
        "peak RSS MiB",
        format!("{:.1}", base.rss_kib as f64 / 1024.0),
        format!("{:.1}", peak_rss as f64 / 1024.0)
    );
    println!(
        "{:<34} {:>14} {:>14}",
        "RSS MiB after the replay",
        "",
        format!("{:.1}", rss_after_replay as f64 / 1024.0)
    );
    println!(
        "publish latency at {achieved:.0} events/s (target {rate:.0}): p50 {p50:.2} ms, p99 {p99:.2} ms (watch arrival to Kafka ack)"
    );
    println!(
        "{:<34} {:>14.0} events/s ({:.2}x at least once), {:.2} µs/event ({:.2}x): transactions committed every 100 ms",
        "exactly once",
        exact_round.rate,
        exact_round.rate / rel.rate,
        exact_round.cpu_us,
        exact_round.cpu_us / rel.cpu_us
    );
    println!(
        "exactly-once latency at {exact_achieved:.0} events/s (target {rate:.0}): p50 {exact_p50:.2} ms, p99 {exact_p99:.2} ms (watch arrival to the commit of its transaction)"
    );
    let mut peer = String::new();
    if !otel_rounds.is_empty() {
        let otel = Round::median(&otel_rounds);
        println!(
            "{:<34} {:>14.0} events/s, {:.2} µs/event, peak RSS {:.1} MiB: the OpenTelemetry Collector (k8sobjects -> kafka) on the same replay",
            "peer",
            otel.rate,
            otel.cpu_us,
            otel.rss_kib as f64 / 1024.0
        );
        let published = otel_published(&bootstrap, &format!("{topic_otel}-1"), warmup + n);
        println!("{:<34} {published}", "peer published");
        peer = format!(
            " cpu_vs_otel={:.2} eps_vs_otel={:.2}",
            rel.cpu_us / otel.cpu_us,
            rel.rate / otel.rate
        );
    }
    // One machine-readable line: the ratios, each side's median of the same rounds.
    println!(
        "bench: cpu_vs_bare={:.2} eps_vs_passthrough={:.2} eps_vs_bare={:.2} p99_ms={:.0} rss_mib={:.0} exactly_eps_vs_at_least={:.2} exactly_cpu_vs_at_least={:.2} exactly_p99_ms={:.0}{peer}",
        rel.cpu_us / base.cpu_us,
        rel.rate / pass.rate,
        rel.rate / base.rate,
        p99,
        peak_rss as f64 / 1024.0,
        exact_round.rate / rel.rate,
        exact_round.cpu_us / rel.cpu_us,
        exact_p99
    );
}

/// Microseconds per line to decode the pre-generated watch lines (the relay's decode, trimming
/// managedFields), next to the cheapest serde_json pass that still validates a line and keeps
/// the object raw.
fn decode_costs(input: &Path) -> (f64, f64) {
    let lines: Vec<String> = std::io::BufReader::new(std::fs::File::open(input).unwrap())
        .lines()
        .map(|l| {
            let l = l.unwrap();
            let (_, object) = l.split_once('\t').unwrap();
            format!("{{\"type\":\"MODIFIED\",\"object\":{object}}}")
        })
        .collect();
    let trim = decode::Trim {
        drop_managed_fields: true,
        allow_secret_data: false,
    };
    #[derive(serde::Deserialize)]
    struct Line<'a> {
        #[serde(rename = "type")]
        _type: &'a str,
        #[serde(rename = "object", borrow)]
        _object: &'a serde_json::value::RawValue,
    }
    let per_line = |f: &mut dyn FnMut(&str)| {
        let t = Instant::now();
        for l in &lines {
            f(l);
        }
        t.elapsed().as_secs_f64() * 1e6 / lines.len() as f64
    };
    let mut buf = Vec::new();
    let ours = per_line(&mut |l| {
        let ev = decode::decode_line_into(l.as_bytes(), trim, std::mem::take(&mut buf)).unwrap();
        buf = ev.object;
    });
    let serde = per_line(&mut |l| {
        std::hint::black_box(serde_json::from_str::<Line<'_>>(l).unwrap());
    });
    (ours, serde)
}

/// One side's figures in one round.
#[derive(Clone, Copy)]
struct Round {
    rate: f64,
    cpu_us: f64,
    rss_kib: u64,
}

impl Round {
    /// Runs this benchmark's binary as a child with `args` (a baseline) and reads its report
    /// (`secs`, `cpu`, `rss_kib` for `n` events): a process of its own, so its CPU and RSS are
    /// its alone.
    fn of_child(args: &[&str], n: usize) -> Round {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(args)
            .output()
            .expect("the child runs");
        assert!(
            out.status.success(),
            "{} failed: {}",
            args[0],
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
        Round {
            rate: n as f64 / report["secs"].as_f64().unwrap(),
            cpu_us: report["cpu"].as_f64().unwrap() * 1e6 / n as f64,
            rss_kib: report["rss_kib"].as_u64().unwrap(),
        }
    }

    /// Each figure's median over the rounds.
    fn median(rounds: &[Round]) -> Round {
        let mid = |f: fn(&Round) -> f64| {
            let mut v: Vec<f64> = rounds.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        Round {
            rate: mid(|r| r.rate),
            cpu_us: mid(|r| r.cpu_us),
            rss_kib: rounds.iter().map(|r| r.rss_kib).max().unwrap_or(0),
        }
    }
}

/// Seconds for a plain HTTP reader to receive `n` watch events from `rv`.
fn sim_replay_secs(url: &str, rv: u64, n: usize) -> f64 {
    use std::io::Read;
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let t = Instant::now();
    write!(s, "GET /api/v1/namespaces/{NS}/pods?watch=true&resourceVersion={rv} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let (mut seen, mut last) = (0usize, 0u8);
    while seen < n {
        let k = s.read(&mut buf).unwrap();
        assert!(k > 0, "watch ended after {seen} events");
        // Every event line ends with "}\n"; chunk framing never does.
        for &b in &buf[..k] {
            if b == b'\n' && last == b'}' {
                seen += 1;
            }
            last = b;
        }
    }
    t.elapsed().as_secs_f64()
}

/// The baseline child: sends every object of `input` and waits for all acknowledgements.
/// The floor of any relay on this bed: read the same watch replay from the simulator and hand
/// each line to a producer configured like the relay's, as is (no decoding, envelope, headers
/// or acknowledgement tracking). Timed like the other sides, after a warm-up.
fn passthrough(bootstrap: &str, topic: &str, url: &str, rv: u64, warmup: u64, n: u64) {
    let producer: BaseProducer<Ctx> = kafka_config(bootstrap)
        .client_config()
        .create_with_context(Ctx::default())
        .unwrap();
    let mut r = common::open_lines(
        url,
        &format!("/api/v1/namespaces/{NS}/pods?watch=true&resourceVersion={rv}"),
    );
    let mut line = Vec::new();
    let (mut cpu0, mut t0) = (0.0, Instant::now());
    for i in 0..warmup + n {
        if i == warmup {
            producer.flush(Duration::from_secs(300)).unwrap();
            cpu0 = cpu_seconds(std::process::id());
            t0 = Instant::now();
        }
        line.clear();
        let k = r.read_until(b'\n', &mut line).unwrap();
        assert!(k > 0, "watch ended after {i} events");
        send_waiting(
            &producer,
            BaseRecord::<(), [u8]>::to(topic).payload(&line[..k - 1]),
        );
    }
    producer.flush(Duration::from_secs(300)).unwrap();
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds(std::process::id()) - cpu0;
    println!(
        "{}",
        json!({"secs": secs, "cpu": cpu, "rss_kib": peak_rss_kib(std::process::id())})
    );
}

/// A producer context for the baselines: counts deliveries; a failed one fails the benchmark.
#[derive(Default)]
struct Ctx {
    delivered: std::sync::atomic::AtomicU64,
}
impl ClientContext for Ctx {}
impl ProducerContext for Ctx {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        self.delivered
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Err((e, _)) = r {
            panic!("baseline delivery failed: {e}");
        }
    }
}

/// Sends `rec`, waiting while the producer's queue is full. Delivery reports are served on the
/// sending thread, as the relay serves them on its own: every [`SERVE_EVERY`] records and while
/// the queue is full.
fn send_waiting<K: ToBytes + ?Sized, P: ToBytes + ?Sized>(
    producer: &BaseProducer<Ctx>,
    mut rec: BaseRecord<'_, K, P>,
) {
    thread_local! {
        static SENT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }
    let sent = SENT.with(|n| {
        n.set(n.get() + 1);
        n.get()
    });
    if sent.is_multiple_of(SERVE_EVERY) {
        serve(producer);
    }
    loop {
        match producer.send(rec) {
            Ok(()) => return,
            Err((_, back)) => {
                rec = back;
                serve(producer);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// How many records a baseline sends between two servings of its delivery reports.
const SERVE_EVERY: u64 = 256;

/// Serves the delivery reports librdkafka has ready (one event holds many), without waiting.
fn serve(producer: &BaseProducer<Ctx>) {
    let delivered = || {
        producer
            .context()
            .delivered
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    for _ in 0..64 {
        let before = delivered();
        producer.poll(Duration::ZERO);
        if delivered() == before {
            break;
        }
    }
}

/// The producer settings of the relay's benchmark configuration.
fn kafka_config(bootstrap: &str) -> watchrelay::config::KafkaConfig {
    watchrelay::config::KafkaConfig {
        bootstrap_servers: bootstrap.to_string(),
        properties: Default::default(),
        max_in_flight_per_stream: 10_000,
        max_message_bytes: 1_000_000,
        oversize: watchrelay::config::OversizePolicy::Trim,
        dead_letter_topic: None,
        unsafe_producer_overrides: false,
        topics: Default::default(),
        delivery: Default::default(),
        commit_interval_ms: 100,
    }
}

fn baseline(bootstrap: &str, topic: &str, input: &Path, warmup: usize) {
    let cfg = kafka_config(bootstrap);
    // The exact records the relay produces (envelope and CloudEvents headers), made up front so
    // the baseline measures the producer alone: sending them, rdkafka's headers included.
    type Records = Vec<(String, Vec<u8>, Vec<(&'static str, Vec<u8>)>)>;
    let records: Records = std::io::BufReader::new(std::fs::File::open(input).unwrap())
        .lines()
        .map(|l| {
            let l = l.unwrap();
            let (key, object) = l.split_once('\t').unwrap();
            let line = format!("{{\"type\":\"MODIFIED\",\"object\":{object}}}");
            let trim = decode::Trim {
                drop_managed_fields: true,
                allow_secret_data: false,
            };
            let ev = decode::decode_line(line.as_bytes(), trim).unwrap();
            let route = common::pods_route(topic, NS);
            let a = Announcement::change(ev.event_type, ev.meta, false);
            let rec = envelope::record(&route, &a, &ev.object, Vec::new());
            assert_eq!(rec.key, key);
            let value = rec.value;
            let headers = rec.headers.iter().map(|(k, v)| (k, v.to_vec())).collect();
            (key.to_string(), value, headers)
        })
        .collect();
    let producer: BaseProducer<Ctx> = cfg
        .client_config()
        .create_with_context(Ctx::default())
        .unwrap();
    let send_all = |records: Records| {
        for (k, v, h) in records {
            // As the relay's producer does for every record.
            let headers = h.iter().fold(
                OwnedHeaders::new_with_capacity(h.len()),
                |headers, (key, value)| {
                    headers.insert(Header {
                        key,
                        value: Some(value.as_slice()),
                    })
                },
            );
            send_waiting(
                &producer,
                BaseRecord::to(topic)
                    .key(k.as_bytes())
                    .payload(&v)
                    .headers(headers),
            );
        }
        producer.flush(Duration::from_secs(300)).unwrap();
    };
    let mut records = records;
    let measured = records.split_off(warmup);
    send_all(records);
    let cpu0 = cpu_seconds(std::process::id());
    let t = Instant::now();
    send_all(measured);
    let secs = t.elapsed().as_secs_f64();
    let cpu = cpu_seconds(std::process::id()) - cpu0;
    println!(
        "{}",
        json!({"secs": secs, "cpu": cpu, "rss_kib": peak_rss_kib(std::process::id())})
    );
}

/// The OpenTelemetry Collector replaying the pods' watch from `rv` into `topic` (a fresh one
/// per round): events/s and CPU per event from the acknowledgement of the warm-up's records to
/// that of the `n` after them, read from the topic's high watermarks every 10 ms.
#[allow(
    clippy::too_many_arguments,
    reason = "one call site; the round's whole setting"
)]
fn otel_round(
    bin: &str,
    kubeconfig: &Path,
    bootstrap: &str,
    topic: &str,
    rv: u64,
    warmup: usize,
    n: usize,
    dir: &Path,
    rt: &tokio::runtime::Runtime,
) -> Round {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    rt.block_on(create_topics(bootstrap, &[topic]));
    let config = dir.join("otelcol.yaml");
    std::fs::write(
        &config,
        format!(
            "receivers:\n  k8sobjects:\n    auth_type: kubeConfig\n    objects:\n      - name: pods\n        mode: watch\n        namespaces: [{NS}]\n        resource_version: \"{rv}\"\n\
             processors:\n  batch: {{}}\n\
             exporters:\n  kafka:\n    brokers: [\"{bootstrap}\"]\n    topic: {topic}\n    encoding: raw\n    producer:\n      required_acks: -1\n      compression: lz4\n\
             service:\n  telemetry:\n    metrics:\n      level: none\n    logs:\n      level: warn\n\
             \x20 pipelines:\n    logs:\n      receivers: [k8sobjects]\n      processors: [batch]\n      exporters: [kafka]\n"
        ),
    )
    .unwrap();
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "bench-otel")
        .create()
        .unwrap();
    let published = || -> usize {
        (0..3)
            .map(|p| {
                consumer
                    .fetch_watermarks(topic, p, Duration::from_secs(5))
                    .map_or(0, |(_, high)| high as usize)
            })
            .sum()
    };
    let spawned = Instant::now();
    let log = dir.join("otelcol.log");
    let child = Command::new(bin)
        .arg(format!("--config={}", config.display()))
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("the collector starts");
    let pid = child.id();
    let mut child = KillOnDrop(child);
    let mut reached = |count: usize| loop {
        if published() >= count {
            return (Instant::now(), cpu_seconds(pid));
        }
        let exited = child.0.try_wait().unwrap();
        assert!(
            exited.is_none() && spawned.elapsed() < Duration::from_secs(600),
            "the collector did not publish {count} records ({exited:?}): {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let (t0, cpu0) = reached(warmup);
    let (t1, cpu1) = reached(warmup + n);
    let round = Round {
        rate: n as f64 / (t1 - t0).as_secs_f64(),
        cpu_us: (cpu1 - cpu0) * 1e6 / n as f64,
        rss_kib: peak_rss_kib(pid),
    };
    stop(child);
    round
}

/// What the collector published for `changes` changes: records per change, how many carry a
/// key, and what a record's value holds.
fn otel_published(bootstrap: &str, topic: &str, changes: usize) -> String {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::Message;
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "bench-otel-read")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    let mut total = 0;
    for p in 0..3 {
        total += consumer
            .fetch_watermarks(topic, p, Duration::from_secs(5))
            .map_or(0, |(_, high)| high as usize);
    }
    consumer.subscribe(&[topic]).unwrap();
    let (mut sampled, mut keyed, mut value) = (0, 0, String::new());
    let started = Instant::now();
    while sampled < 1000 && started.elapsed() < Duration::from_secs(30) {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            sampled += 1;
            keyed += usize::from(m.key().is_some_and(|k| !k.is_empty()));
            if value.is_empty() {
                let v: serde_json::Value =
                    serde_json::from_slice(m.payload().unwrap_or_default()).unwrap_or_default();
                let mut keys: Vec<&str> = v
                    .as_object()
                    .map(|o| o.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                keys.sort_unstable();
                value = keys.join(",");
            }
        }
    }
    format!(
        "{:.2} records per change ({total} for {changes}); {keyed} of {sampled} sampled records keyed; a value's keys: {value}",
        total as f64 / changes as f64
    )
}

/// Cumulative (le, count) pairs of the stream's publish latency histogram.
fn histogram(port: u16) -> Vec<(f64, f64)> {
    scrape(port)
        .lines()
        .filter(|l| {
            l.starts_with("watchrelay_publish_latency_seconds_bucket") && l.contains(STREAM)
        })
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
}

/// Quantile by linear interpolation inside the bucket, as Prometheus' histogram_quantile does.
fn quantile(buckets: &[(f64, f64)], q: f64) -> f64 {
    let total = buckets.last().map(|b| b.1).unwrap_or(0.0);
    if total == 0.0 {
        return f64::NAN;
    }
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return prev.0;
            }
            return prev.0 + (le - prev.0) * (rank - prev.1) / (count - prev.1).max(1.0);
        }
        prev = (le, count);
    }
    prev.0
}

/// Waits until the relay serving metrics on `port` watches its stream.
fn wait_watching(port: u16) {
    let series = format!("watchrelay_stream_up{{stream=\"{STREAM}\"}}");
    let since = Instant::now();
    while metric(port, &series).unwrap_or(0.0) < 1.0 {
        assert!(
            since.elapsed() < Duration::from_secs(120),
            "relay never watched"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A round of the relay with `config` (resuming just before the warm-up): its rate and CPU
/// from the warm-up's last record published to the N events' last, counted by its own
/// metric, and the relay, still running.
fn relay_round(config: &Path, port: u16, warmup: usize, n: usize) -> (Round, KillOnDrop) {
    let spawned = Instant::now();
    let relay = spawn_relay(config);
    let pid = relay.0.id();
    let published = |count: usize| loop {
        let series = format!("watchrelay_events_published_total{{stream=\"{STREAM}\"}}");
        if metric(port, &series).unwrap_or(0.0) as usize >= count {
            return (Instant::now(), cpu_seconds(pid));
        }
        assert!(
            spawned.elapsed() < Duration::from_secs(600),
            "relay did not publish {count} events"
        );
        // Coarse enough that scraping costs the relay next to nothing.
        std::thread::sleep(Duration::from_millis(10));
    };
    let (t0, cpu0) = published(warmup);
    let (t1, cpu1) = published(warmup + n);
    let round = Round {
        rate: n as f64 / (t1 - t0).as_secs_f64(),
        cpu_us: (cpu1 - cpu0) * 1e6 / n as f64,
        rss_kib: peak_rss_kib(pid),
    };
    (round, relay)
}

/// The round whose p99 is the median of `rounds` (rate, p50, p99).
fn median_by_p99(mut rounds: Vec<(f64, f64, f64)>) -> (f64, f64, f64) {
    rounds.sort_by(|a, b| a.2.total_cmp(&b.2));
    rounds[rounds.len() / 2]
}

/// Live churn at `rate` a second for 5 s over `pods` pods, followed by the relay serving
/// metrics on `port`: the rate achieved, and the p50 and p99 of its publish latency (ms).
fn live_latency(sim: &watchrelay_sim::Sim, port: u16, rate: f64, pods: usize) -> (f64, f64, f64) {
    let before = histogram(port);
    let churn_secs = 5.0;
    let rv0 = sim.current_rv();
    // Paced replacements of pre-built objects: the simulator's cheapest write path, so it can
    // keep up with the target rate on a small machine.
    let total = (rate * churn_secs) as usize;
    let objs: Vec<serde_json::Value> = (0..total)
        .map(|i| {
            let mut o = objects::pod(NS, &format!("pod-{}", i % pods));
            o["metadata"]["annotations"]["bench/live"] = json!(i.to_string());
            o
        })
        .collect();
    let paced = Instant::now();
    for (i, o) in objs.into_iter().enumerate() {
        let due = Duration::from_secs_f64(i as f64 / rate);
        if let Some(wait) = due.checked_sub(paced.elapsed()) {
            if wait > Duration::from_micros(500) {
                std::thread::sleep(wait);
            }
        }
        sim.update("pods", Some(NS), o).unwrap();
    }
    let churn_secs = paced.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(1000));
    let achieved = (sim.current_rv() - rv0) as f64 / churn_secs;
    let after = histogram(port);
    let delta: Vec<(f64, f64)> = after
        .iter()
        .zip(&before)
        .map(|((le, a), (_, b))| (*le, a - b))
        .collect();
    let (p50, p99) = (quantile(&delta, 0.50) * 1e3, quantile(&delta, 0.99) * 1e3);
    (achieved, p50, p99)
}
