//! Prints the envelopes arriving on topics, one line each: a minimal consumer for the demo.
//!
//! usage: cargo run --example tail -- BOOTSTRAP TOPIC [TOPIC..]

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [bootstrap, topics @ ..] = args.as_slice() else {
        eprintln!("usage: tail BOOTSTRAP TOPIC [TOPIC..]");
        std::process::exit(2);
    };
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "watchrelay-tail")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    // Partitions are assigned at explicit offsets rather than through a consumer group.
    let mut tpl = TopicPartitionList::new();
    for topic in topics {
        let md = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("metadata");
        for t in md.topics() {
            for p in t.partitions() {
                tpl.add_partition_offset(t.name(), p.id(), Offset::Offset(0))
                    .expect("partition");
            }
        }
    }
    consumer.assign(&tpl).expect("assign");
    loop {
        let Some(msg) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let msg = match msg {
            Ok(m) => m,
            Err(e) => {
                eprintln!("consumer error: {e}");
                continue;
            }
        };
        let v: serde_json::Value =
            serde_json::from_slice(msg.payload().unwrap_or_default()).unwrap_or_default();
        let w = &v["watchrelay"];
        let flags = [
            ("resync", w["resync"] == true),
            ("synthetic", w["synthetic"] == true),
        ]
        .iter()
        .filter(|(_, on)| *on)
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(",");
        println!(
            "{:<28} {:<9} {:<44} rv={:<8} {:>6}B {}",
            msg.topic(),
            v["type"].as_str().unwrap_or("?"),
            String::from_utf8_lossy(msg.key().unwrap_or_default()),
            w["resourceVersion"].as_str().unwrap_or(""),
            msg.payload_len(),
            flags
        );
    }
}
