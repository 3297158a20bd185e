//! Reading the membership topic back: from its beginning to end markers produced at the start,
//! in partition order, with small fetch buffers (the sets being what must fit in memory).

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::Message as _;

use super::{Apply, TopicError};

/// Consumer buffers for reading the membership topic, unless kafka.properties sets them.
const REPLAY_BUFFERS: &[(&str, &str)] = &[
    ("queued.max.messages.kbytes", "8192"),
    ("fetch.max.bytes", "4194304"),
];

/// How long the membership topic may go without a record before its reading is given up.
const REPLAY_IDLE: Duration = Duration::from_secs(60);

/// Reads `topic` from its beginning to its end as of the call (see [`super::Producer::replay`]),
/// with a consumer of its own on `connection`.
pub(super) fn replay(
    connection: &ClientConfig,
    topic: &str,
    apply: &mut Apply<'_>,
    stopped: &(dyn Fn() -> bool + Sync),
) -> Result<(), TopicError> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Offset, TopicPartitionList};
    let timeout = Duration::from_secs(30);
    let other = |e: String| TopicError::Other(e);
    let mut settings = connection.clone();
    settings
        .set("group.id", "watchrelay-membership")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false");
    // What is fetched ahead stays small, the sets being what must fit in memory; the
    // configuration's kafka.properties may say otherwise.
    for (k, v) in REPLAY_BUFFERS {
        if settings.get(k).is_none() {
            settings.set(*k, *v);
        }
    }
    let consumer: BaseConsumer = settings
        .create()
        .map_err(|e| TopicError::kafka(e, "creating a consumer"))?;
    let md = consumer
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| TopicError::kafka(e, &format!("reading the metadata of {topic}")))?;
    let partitions = super::partitions(&md, topic);
    // Where reading stops: an end marker (a tombstone no stream owns) produced to every
    // partition now; the offset Kafka acknowledged for it is exact on any broker, unlike a
    // high watermark fetched separately.
    let marker: rdkafka::producer::FutureProducer = connection
        .create()
        .map_err(|e| TopicError::kafka(e, "creating a producer"))?;
    let mut ends = std::collections::HashMap::new();
    let mut tpl = TopicPartitionList::new();
    for p in 0..i32::try_from(partitions).map_err(|e| other(e.to_string()))? {
        let record = rdkafka::producer::FutureRecord::<str, [u8]>::to(topic)
            .partition(p)
            .key(crate::membership::END_MARKER);
        let end = futures::executor::block_on(marker.send(record, timeout))
            .map_err(|(e, _)| TopicError::kafka(e, &format!("marking the end of {topic}[{p}]")))?
            .offset;
        ends.insert(p, end);
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .map_err(|e| other(e.to_string()))?;
    }
    consumer.assign(&tpl).map_err(|e| other(e.to_string()))?;
    let mut idle = Instant::now();
    while !ends.is_empty() {
        if stopped() {
            return Err(TopicError::Stopped);
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                idle = Instant::now();
                apply(m.key().unwrap_or_default(), m.payload());
                if ends
                    .get(&m.partition())
                    .is_some_and(|&end| m.offset() + 1 >= end)
                {
                    ends.remove(&m.partition());
                }
            }
            Some(Err(e)) => {
                if let Some(
                    code @ (RDKafkaErrorCode::TopicAuthorizationFailed
                    | RDKafkaErrorCode::GroupAuthorizationFailed),
                ) = e.rdkafka_error_code()
                {
                    return Err(TopicError::of(code, format!("reading {topic}")));
                }
                tracing::warn!(%topic, error = %e, "reading the membership topic")
            }
            None if idle.elapsed() > REPLAY_IDLE => {
                return Err(other(format!(
                    "reading {topic}: nothing for {REPLAY_IDLE:?} before its end offsets"
                )))
            }
            None => {}
        }
    }
    Ok(())
}
