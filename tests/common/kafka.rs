//! Kafka fixtures: the broker address, topic creation, and reading topics back from offset 0.
//!
//! Consumers assign every partition at an explicit offset instead of joining a group, so the
//! same code works against any Kafka-protocol broker.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

/// The broker under test. The test command starts one and exports the address; point it at any
/// Kafka cluster to run the suite there.
pub fn bootstrap() -> String {
    std::env::var("KAFKA_BOOTSTRAP_SERVERS")
        .expect("KAFKA_BOOTSTRAP_SERVERS is not set: run the suite with scripts/test.sh, or export the address of a broker")
}

/// A topic name no other test uses.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    format!(
        "{prefix}-{}-{t}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Creates `<prefix>.<operationId>` for every channel of the catalogue, 3 partitions each.
pub async fn create_catalogue_topics(prefix: &str) {
    let topics: Vec<String> = watchrelay::catalogue::CATALOGUE
        .iter()
        .map(|c| format!("{prefix}.{}", c.operation_id))
        .collect();
    create_topics(&topics.iter().map(String::as_str).collect::<Vec<_>>(), 3).await;
}

/// Has the broker at `bootstrap` create its consumer offsets topic (where group coordinators
/// live) now, on the brokers it has now: a consumer joins a group and is assigned a partition.
pub async fn make_offsets_topic(bootstrap: &str) {
    let topic = unique("offsets-probe");
    create_topics_at(bootstrap, &[&topic], 1).await;
    let bootstrap = bootstrap.to_string();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", unique("offsets-probe"))
            .create()
            .expect("consumer");
        consumer.subscribe(&[&topic]).expect("subscribe");
        let began = Instant::now();
        while consumer.assignment().map_or(0, |a| a.count()) == 0 {
            assert!(
                began.elapsed() < Duration::from_secs(60),
                "never joined a group"
            );
            let _ = consumer.poll(Duration::from_millis(200));
        }
    })
    .await
    .unwrap();
}

pub async fn create_topics(names: &[&str], partitions: i32) {
    create_topics_at(&bootstrap(), names, partitions).await
}

pub async fn create_topics_at(bootstrap: &str, names: &[&str], partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let topics: Vec<NewTopic<'_>> = names
        .iter()
        .map(|n| NewTopic::new(n, partitions, TopicReplication::Fixed(1)))
        .collect();
    let results = admin
        .create_topics(
            &topics,
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("create_topics request");
    for r in results {
        if let Err((name, code)) = r {
            assert_eq!(
                code,
                rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists,
                "creating topic {name}"
            );
        }
    }
}

/// One record read back.
#[derive(Debug, Clone)]
pub struct Msg {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<String>,
    pub value: serde_json::Value,
    pub raw_len: usize,
    pub headers: HashMap<String, String>,
}

/// A consumer assigned every partition of `topic` at `from` (no group membership: the same
/// code works against any Kafka-protocol broker). A topic the relay creates at its start may
/// appear a moment after the read begins: it is waited for, up to 30 s.
fn reading(bootstrap: &str, topic: &str, from: Offset) -> BaseConsumer {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "watchrelay-tests")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("allow.auto.create.topics", "false")
        .create()
        .expect("consumer");
    let deadline = Instant::now() + Duration::from_secs(30);
    let partitions = loop {
        let md = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("metadata");
        let partitions = md
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
            .map_or(0, |t| t.partitions().len());
        if partitions > 0 || Instant::now() >= deadline {
            break partitions;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(partitions > 0, "topic {topic} has no partitions");
    let mut tpl = TopicPartitionList::new();
    for p in 0..i32::try_from(partitions).expect("a partition count") {
        tpl.add_partition_offset(topic, p, from).unwrap();
    }
    consumer.assign(&tpl).expect("assign");
    consumer
}

/// Reads every record `topic` holds now (to the high watermark of each partition).
pub fn read_all(bootstrap: &str, topic: &str) -> Vec<Msg> {
    let consumer = reading(bootstrap, topic, Offset::Offset(0));
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let partitions = metadata.topics()[0].partitions().len();
    let total: i64 = (0..i32::try_from(partitions).expect("a partition count"))
        .map(|p| {
            let (low, high) = consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .expect("watermarks");
            high - low
        })
        .sum();
    let total = usize::try_from(total).expect("a record count");
    let msgs = read_until(bootstrap, topic, Duration::from_secs(90), |m| {
        m.len() >= total
    });
    assert!(
        msgs.len() >= total,
        "read {} of {total} records",
        msgs.len()
    );
    msgs
}

/// Reads `topic` from offset 0 of every partition until `done` holds for what was read (or the
/// hang guard expires, returning what arrived so the caller's assertion shows it).
pub fn read_until(
    bootstrap: &str,
    topic: &str,
    guard: Duration,
    done: impl Fn(&[Msg]) -> bool,
) -> Vec<Msg> {
    read_shaped_until(bootstrap, topic, guard, whole, done)
}

/// A record's value with its object cut down to the metadata that identify it (name,
/// namespace, uid, resourceVersion, annotations): what a test reading hundreds of thousands of
/// records needs to hold of each (a whole object takes tens of kilobytes parsed).
pub fn metadata_only(payload: &[u8]) -> serde_json::Value {
    const KEPT: [&str; 5] = ["name", "namespace", "uid", "resourceVersion", "annotations"];
    let mut value = whole(payload);
    if let Some(object) = value
        .get_mut("object")
        .and_then(serde_json::Value::as_object_mut)
    {
        object.retain(|k, _| k == "metadata");
        if let Some(md) = object
            .get_mut("metadata")
            .and_then(serde_json::Value::as_object_mut)
        {
            md.retain(|k, _| KEPT.contains(&k.as_str()));
        }
    }
    value
}

/// The whole of a record's value.
pub fn whole(payload: &[u8]) -> serde_json::Value {
    serde_json::from_slice(payload).unwrap_or(serde_json::Value::Null)
}

/// [`read_until`], each value read by `shape` (see [`whole`] and [`metadata_only`]).
pub fn read_shaped_until(
    bootstrap: &str,
    topic: &str,
    guard: Duration,
    shape: impl Fn(&[u8]) -> serde_json::Value,
    done: impl Fn(&[Msg]) -> bool,
) -> Vec<Msg> {
    let consumer = reading(bootstrap, topic, Offset::Offset(0));
    let start = Instant::now();
    let mut out = Vec::new();
    while start.elapsed() < guard {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let payload = m.payload().unwrap_or_default();
                let mut headers = HashMap::new();
                if let Some(h) = m.headers() {
                    for i in 0..h.count() {
                        let hd = h.get(i);
                        headers.insert(
                            hd.key.to_string(),
                            String::from_utf8_lossy(hd.value.unwrap_or_default()).into_owned(),
                        );
                    }
                }
                out.push(Msg {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                    value: shape(payload),
                    raw_len: payload.len(),
                    headers,
                });
            }
            Some(Err(e)) => eprintln!("consumer error (retrying): {e}"),
            None => {
                if done(&out) {
                    return out;
                }
            }
        }
    }
    out
}

/// Every record of `topic` as stored, in partition order: its key and value (None for a
/// tombstone). Reads until nothing arrived for `quiet`.
pub fn read_raw(bootstrap: &str, topic: &str, quiet: Duration) -> Vec<(String, Option<Vec<u8>>)> {
    let consumer = reading(bootstrap, topic, Offset::Beginning);
    let mut out = Vec::new();
    let mut last = Instant::now();
    while last.elapsed() < quiet {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            out.push((
                m.key()
                    .map(|k| String::from_utf8_lossy(k).into_owned())
                    .unwrap_or_default(),
                m.payload().map(<[u8]>::to_vec),
            ));
            last = Instant::now();
        }
    }
    out
}

/// Produces one record and waits for its acknowledgement.
pub fn produce(bootstrap: &str, topic: &str, key: &str, value: Option<&[u8]>) {
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("allow.auto.create.topics", "false")
        .create()
        .expect("producer");
    let mut record = BaseRecord::<str, [u8]>::to(topic).key(key);
    if let Some(v) = value {
        record = record.payload(v);
    }
    producer.send(record).map_err(|(e, _)| e).expect("send");
    producer.flush(Duration::from_secs(10)).expect("flush");
}
