//! What a schema registry's ids cost each record: the same records written and produced with and
//! without them, in the same run.
//!
//! 1. N modifications of ~4 KB pods (the throughput benchmark's objects), decoded once.
//! 2. Three ways, alternating for BENCH_ROUNDS rounds (default 5), each reported by its median:
//!    - `plain`: the record as without a registry (envelope and CloudEvents headers);
//!    - `headers`: with a registry, `schemaRegistry.wireFormat: headers` (Apicurio's
//!      `apicurio.value.contentId` and `apicurio.value.globalId`, 8 bytes each);
//!    - `prefix`: `wireFormat: confluent`, the headers and the 5-byte prefix before the value.
//! 3. For each: the time to write a record (envelope, key, headers: [`envelope::record`]), then
//!    the time to produce it to Kafka and have it acknowledged (the relay's producer settings,
//!    headers handed to rdkafka per record as the relay does), and the record's bytes (key,
//!    value, header names and values, before compression).
//!
//! Run with `scripts/bench.sh registry` (it starts a broker) or set KAFKA_BOOTSTRAP_SERVERS.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{create_topics, env_or, plain_producer, send_when_room};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer};
use watchrelay::decode;
use watchrelay::envelope::{self, Announcement, Route, SchemaIds, SchemaTag};
use watchrelay::producer::Record;
use watchrelay_sim::objects;

const NS: &str = "bench";

fn route(tag: Option<Arc<SchemaTag>>) -> Route {
    common::pods_route("", NS).tagged(tag)
}

fn bytes(r: &Record) -> usize {
    r.key.len()
        + r.value.len()
        + r.headers
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let n = env_or("BENCH_RECORDS", 50_000);
    let rounds = env_or("BENCH_ROUNDS", 5);
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP_SERVERS")
        .expect("KAFKA_BOOTSTRAP_SERVERS (scripts/bench.sh registry starts a broker)");
    let trim = decode::Trim {
        drop_managed_fields: true,
        allow_secret_data: false,
    };
    let events: Vec<_> = (0..n)
        .map(|i| {
            let mut pod = objects::pod(NS, &format!("p{}", i % 1000));
            pod["metadata"]["resourceVersion"] = (1000 + i).to_string().into();
            pod["metadata"]["uid"] = format!("u-{}", i % 1000).into();
            let line = serde_json::json!({"type": "MODIFIED", "object": pod}).to_string();
            decode::decode_line(line.as_bytes(), trim).unwrap()
        })
        .collect();
    let ids = SchemaIds {
        id: 12,
        global_id: Some(40),
        content_id: Some(12),
    };
    let tagged = |prefix: bool| {
        let tag = Arc::new(SchemaTag::new(prefix));
        tag.set(ids);
        route(Some(tag))
    };
    let ways = [
        ("plain", route(None)),
        ("headers", tagged(false)),
        ("prefix", tagged(true)),
    ];
    let topic = format!("bench-registry-{}", std::process::id());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(create_topics(&bootstrap, &[&topic]));
    let producer = plain_producer(&bootstrap);

    let mut write = vec![Vec::new(); ways.len()];
    let mut produce = vec![Vec::new(); ways.len()];
    let mut size = vec![0usize; ways.len()];
    for round in 0..=rounds {
        for (w, (_, route)) in ways.iter().enumerate() {
            let t = Instant::now();
            let records: Vec<Record> = events
                .iter()
                .map(|ev| {
                    let a = Announcement::change(ev.event_type, ev.meta.clone(), false);
                    envelope::record(route, &a, &ev.object, Vec::new())
                })
                .collect();
            let wrote = t.elapsed().as_secs_f64();
            size[w] = records.iter().map(bytes).sum::<usize>() / n;
            let t = Instant::now();
            for r in &records {
                let mut headers = OwnedHeaders::new_with_capacity(r.headers.len());
                for (key, value) in r.headers.iter() {
                    headers = headers.insert(Header {
                        key,
                        value: Some(value),
                    });
                }
                send_when_room(
                    &producer,
                    BaseRecord::<str, [u8]>::to(&topic)
                        .key(&r.key)
                        .payload(&r.value)
                        .headers(headers),
                );
            }
            producer.flush(Duration::from_secs(120)).unwrap();
            let produced = t.elapsed().as_secs_f64();
            // Round 0 warms up (connections, producer id, metadata).
            if round > 0 {
                write[w].push(wrote / n as f64 * 1e6);
                produce[w].push(produced / n as f64 * 1e6);
            }
        }
    }
    println!("{n} records of ~4 KB pods, median of {rounds} rounds, ways alternating");
    println!(
        "{:<8} {:>12} {:>14} {:>14} {:>10}",
        "way", "write µs/rec", "produce µs/rec", "bytes/record", "vs plain"
    );
    let base = (median(write[0].clone()), median(produce[0].clone()));
    for (w, (name, _)) in ways.iter().enumerate() {
        let (wr, pr) = (median(write[w].clone()), median(produce[w].clone()));
        println!(
            "{name:<8} {wr:>12.2} {pr:>14.2} {:>14} {:>+9.1}%",
            size[w],
            ((wr + pr) / (base.0 + base.1) - 1.0) * 100.0
        );
    }
    println!(
        "BENCH registry plain_write_us={:.3} headers_write_us={:.3} plain_produce_us={:.3} headers_produce_us={:.3} plain_bytes={} headers_bytes={} prefix_bytes={}",
        base.0,
        median(write[1].clone()),
        base.1,
        median(produce[1].clone()),
        size[0],
        size[1],
        size[2]
    );
}
