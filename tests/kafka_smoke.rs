//! The broker answers like Kafka: an idempotent acks=all producer's records all read back.

mod common;

use std::time::Duration;

use common::kafka;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

#[tokio::test]
async fn idempotent_producer_records_all_read_back() {
    let topic = kafka::unique("smoke");
    kafka::create_topics(&[&topic], 3).await;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka::bootstrap())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("compression.type", "lz4")
        .create()
        .unwrap();
    let sends = (0..500).map(|i| {
        let producer = producer.clone();
        let topic = topic.clone();
        async move {
            let value = serde_json::json!({ "n": i }).to_string();
            let key = format!("k{}", i % 17);
            producer
                .send(
                    FutureRecord::to(&topic).key(&key).payload(&value),
                    Duration::from_secs(30),
                )
                .await
                .map_err(|(e, _)| e)
        }
    });
    for r in futures::future::join_all(sends).await {
        r.expect("delivered");
    }
    let bootstrap = kafka::bootstrap();
    let msgs = tokio::task::spawn_blocking(move || {
        kafka::read_until(&bootstrap, &topic, Duration::from_secs(60), |m| {
            m.len() >= 500
        })
    })
    .await
    .unwrap();
    let mut seen: Vec<i64> = msgs
        .iter()
        .map(|m| m.value["n"].as_i64().unwrap())
        .collect();
    seen.sort();
    assert_eq!(seen, (0..500).collect::<Vec<_>>());
    // One key, one partition: per-key order is what the relay relies on.
    for k in 0..17 {
        let key = format!("k{k}");
        let parts: std::collections::HashSet<i32> = msgs
            .iter()
            .filter(|m| m.key.as_deref() == Some(&key))
            .map(|m| m.partition)
            .collect();
        assert_eq!(parts.len(), 1, "key {key} spread over {parts:?}");
    }
}
