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
//! With `BENCH_SHARDS` (e.g. 64) the topic has one partition per shard, each stream's records in
//! its shard's partition as a sharded release writes them, and the child restores one shard
//! (the one of the first stream): reading its partition alone, to an end marker it wrote.
//!
//! Run with scripts/bench.sh restore (it starts a broker) or set KAFKA_BOOTSTRAP_SERVERS.

mod common;

use common::{env_or, fill_membership_sharded, owner, rss_kib};
use std::process::Command;
use std::time::Instant;

use watchrelay::membership::Log as _;
use watchrelay::membership::Restored;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP_SERVERS")
        .expect("KAFKA_BOOTSTRAP_SERVERS is not set: run scripts/bench.sh restore");
    let shards = env_or("BENCH_SHARDS", 0);
    let sharding = (shards > 0).then(|| watchrelay::config::ShardingConfig {
        enabled: true,
        shards: u32::try_from(shards).expect("a shard count"),
        ..Default::default()
    });
    if args.first().map(String::as_str) == Some("restore") {
        return restore(&bootstrap, &args[1], sharding.as_ref());
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
    let (records, bytes) = fill_membership_sharded(
        &bootstrap,
        &topic,
        members,
        streams,
        history,
        sharding.as_ref(),
    );
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

/// The child: what the relay does at the start of a term (of one shard's, with `sharding`),
/// timed.
fn restore(bootstrap: &str, topic: &str, sharding: Option<&watchrelay::config::ShardingConfig>) {
    let floor = rss_kib("VmRSS");
    let t = Instant::now();
    // BENCH_KAFKA_PROPERTIES="k=v,k=v": consumer settings to try, as kafka.properties would.
    let properties = std::env::var("BENCH_KAFKA_PROPERTIES")
        .unwrap_or_default()
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let kafka = watchrelay::membership::log::Kafka::new(&watchrelay::config::KafkaConfig {
        bootstrap_servers: bootstrap.to_string(),
        properties,
        max_in_flight_per_stream: 10_000,
        max_message_bytes: 1_000_000,
        oversize: watchrelay::config::OversizePolicy::Trim,
        dead_letter_topic: None,
        unsafe_producer_overrides: false,
        topics: Default::default(),
        delivery: Default::default(),
        commit_interval_ms: 100,
    });
    let (kafka, partitions) = match sharding {
        Some(s) => {
            let shard = s.shard_of_stream("watchNamespacedPods.team-0");
            println!("restoring shard {shard} of {}", s.shards);
            (kafka.partition(shard.cast_signed()), s.shards.cast_signed())
        }
        None => (kafka, 1),
    };
    kafka.ensure_compacted(topic, partitions, None).unwrap();
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
