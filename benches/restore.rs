//! Restoring the membership: how long the relay takes, and how much memory it holds, to rebuild
//! every stream's members from the membership topic at the start of a term.
//!
//! 1. A fresh membership topic is filled with the records of `BENCH_MEMBERS` tracked objects
//!    (default 1,000,000, over `BENCH_STREAMS` streams, default 100), as streams joining their
//!    objects write them, with history as a topic holds it between compactions (the worst
//!    case: the cleaner has not run yet): `BENCH_HISTORY` superseded records per object
//!    (default 2), and a quarter as many objects again that joined and left (a record, then its
//!    tombstone). Real-looking
//!    identities (random UUIDs, pod names as a ReplicaSet gives them). Not timed.
//! 2. A child process (so its memory is its own) does what the relay does at the start of a term:
//!    creates its Kafka client, makes sure the topic exists, reads it back to its end and
//!    rebuilds the members. It reports the time from creating the client to the last member, its
//!    peak RSS, and its RSS before reading (the process's own floor).
//!
//! Run with scripts/bench.sh restore (it starts a broker) or set KAFKA_BOOTSTRAP_SERVERS.

mod common;

use common::{env_or, identity, rss_kib};
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseRecord, Producer as _, ThreadedProducer};
use watchrelay::membership::{self, Known, Restored};
use watchrelay::producer::Producer as _;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP_SERVERS")
        .expect("KAFKA_BOOTSTRAP_SERVERS is not set: run scripts/bench.sh restore");
    if args.first().map(String::as_str) == Some("restore") {
        return restore(&bootstrap, &args[1]);
    }
    let members = env_or("BENCH_MEMBERS", 1_000_000);
    let streams = env_or("BENCH_STREAMS", 100).max(1);
    let history = env_or("BENCH_HISTORY", 2);
    let topic = format!(
        "bench.membership.{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    );
    let t = Instant::now();
    let (records, bytes) = fill(&bootstrap, &topic, members, streams, history);
    println!(
        "filled {topic}: {members} members over {streams} streams, {records} records ({history} superseded per member, {} joined and left), {:.1} MB, in {:.1} s",
        members / 4,
        bytes as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["restore", &topic])
        .output()
        .expect("the restore child runs");
    assert!(
        out.status.success(),
        "restore failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    print!("{}", String::from_utf8_lossy(&out.stdout));
}

/// Writes the records of `members` objects over `streams` streams, each object `history` times
/// more before its latest record, and `members / 4` objects that joined and left; returns the
/// records and bytes written.
fn fill(
    bootstrap: &str,
    topic: &str,
    members: usize,
    streams: usize,
    history: usize,
) -> (usize, usize) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let new = NewTopic::new(topic, 1, TopicReplication::Fixed(1)).set("cleanup.policy", "compact");
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
        if live {
            rec = rec.payload(&record.value);
        }
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((_, back)) => {
                    rec = back;
                    std::thread::sleep(Duration::from_millis(1));
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
    producer.flush(Duration::from_secs(600)).unwrap();
    (records, bytes)
}

/// The relay whose members the topic holds.
fn owner() -> membership::Owner {
    membership::Owner::new("watchrelay", "watchrelay-checkpoints")
}

/// The child: what the relay does at the start of a term, timed.
fn restore(bootstrap: &str, topic: &str) {
    let floor = rss_kib("VmRSS");
    let t = Instant::now();
    // BENCH_KAFKA_PROPERTIES="k=v,k=v": consumer settings to try, as kafka.properties would.
    let properties = std::env::var("BENCH_KAFKA_PROPERTIES")
        .unwrap_or_default()
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let kafka = watchrelay::producer::Kafka::new(&watchrelay::config::KafkaConfig {
        bootstrap_servers: bootstrap.to_string(),
        properties,
        max_in_flight_per_stream: 10_000,
        max_message_bytes: 1_000_000,
        oversize: watchrelay::config::OversizePolicy::Trim,
        dead_letter_topic: None,
        unsafe_producer_overrides: false,
    })
    .unwrap();
    kafka.ensure_compacted(topic, 1, None).unwrap();
    let mut restored = Restored::new(owner(), None);
    // BENCH_READ_ONLY=1: records read and dropped, the reader's own share of the peak.
    let read_only = std::env::var_os("BENCH_READ_ONLY").is_some();
    kafka
        .replay(
            topic,
            &mut |k, v| {
                if !read_only {
                    restored.apply(k, v)
                }
            },
            &|| false,
        )
        .unwrap();
    restored.finish();
    let secs = t.elapsed().as_secs_f64();
    drop(kafka);
    println!(
        "restored {} members of {} streams from {} records in {secs:.2} s; peak RSS {:.0} MiB (the process before reading: {:.0} MiB; after, the reader closed: {:.0} MiB, of which the sets {:.0} MiB)",
        restored.members(),
        restored.streams().count(),
        restored.records,
        rss_kib("VmHWM") as f64 / 1024.0,
        floor as f64 / 1024.0,
        rss_kib("VmRSS") as f64 / 1024.0,
        restored.heap_bytes() as f64 / (1024.0 * 1024.0)
    );
}
