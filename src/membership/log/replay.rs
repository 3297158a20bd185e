//! Reading the membership topic back: from its beginning to end markers produced at the start,
//! in partition order, with small fetch buffers (the sets being what must fit in memory).

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::Message as _;

use crate::topics::TopicError;

/// What reading a topic hands each record to: its key, and its value (`None` for a tombstone).
pub type Apply<'a> = dyn FnMut(&[u8], Option<&[u8]>) + 'a;

/// Consumer settings for reading the membership topic, unless kafka.properties sets them: what
/// is fetched ahead stays small (about 5,000 records or 2 MiB, 1 MiB a fetch; librdkafka's
/// defaults hold 100,000 records and 64 MiB), the sets being what must fit in memory; and
/// since the topic is read to a known end, a fetch does not wait for more data (10 ms, not
/// 500) and a full queue is polled again after 1 ms (not 1 s): the waits, not the buffers' size,
/// were what made small buffers slow. See the restore benchmark for the figures.
const REPLAY_SETTINGS: &[(&str, &str)] = &[
    ("queued.min.messages", "5000"),
    ("queued.max.messages.kbytes", "2048"),
    ("fetch.max.bytes", "1048576"),
    ("fetch.wait.max.ms", "10"),
    ("fetch.queue.backoff.ms", "1"),
];

/// The reading consumer's settings: `connection`'s, with [`REPLAY_SETTINGS`] where it sets
/// nothing.
fn consumer_settings(connection: &ClientConfig) -> ClientConfig {
    let mut settings = connection.clone();
    settings
        .set("group.id", GROUP)
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false");
    for (k, v) in REPLAY_SETTINGS {
        if settings.get(k).is_none() {
            settings.set(*k, *v);
        }
    }
    // A fetch holds at least one whole record: librdkafka refuses a fetch.max.bytes below
    // message.max.bytes, so the default one rises to it.
    let number = |k: &str| settings.get(k).and_then(|v| v.parse::<u64>().ok());
    if let (None, Some(message), Some(fetch)) = (
        connection.get("fetch.max.bytes"),
        number("message.max.bytes"),
        number("fetch.max.bytes"),
    ) {
        if message > fetch {
            settings.set("fetch.max.bytes", message.to_string());
        }
    }
    settings
}

/// The consumer group the reading consumer names (it commits nothing; an ACL may still ask
/// for Read on it).
const GROUP: &str = crate::producer::MEMBERSHIP_GROUP;

/// How long the membership topic may go without a record before its reading is given up.
const REPLAY_IDLE: Duration = Duration::from_secs(60);

/// Reads `topic` (only its partition `only`, when given) from its beginning to its end as of
/// the call (see [`super::Log::replay`]), with a consumer of its own on `connection`.
pub(super) fn replay(
    connection: &ClientConfig,
    topic: &str,
    only: Option<i32>,
    apply: &mut Apply<'_>,
    stopped: &(dyn Fn() -> bool + Sync),
) -> Result<(), TopicError> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Offset, TopicPartitionList};
    let timeout = Duration::from_secs(30);
    let other = |e: String| TopicError::Other(e);
    let settings = consumer_settings(connection);
    let consumer: BaseConsumer = settings
        .create()
        .map_err(|e| TopicError::kafka(e, "creating a consumer", ""))?;
    // A topic that does not exist (a single leader's that never ran) reads as empty.
    let md = consumer.fetch_metadata(Some(topic), timeout).map_err(|e| {
        TopicError::kafka(
            e,
            &format!("reading the metadata of {topic}"),
            &format!("Describe on topic {topic}"),
        )
    })?;
    let partitions = crate::topics::admin::partitions_in(&md, topic);
    // Where reading stops: an end marker (a tombstone no stream owns) produced to every
    // partition now; the offset Kafka acknowledged for it is exact on any broker, unlike a
    // high watermark fetched separately.
    let marker: rdkafka::producer::FutureProducer = connection
        .create()
        .map_err(|e| TopicError::kafka(e, "creating a producer", ""))?;
    let mut ends = std::collections::HashMap::new();
    let mut tpl = TopicPartitionList::new();
    let all = 0..i32::try_from(partitions).map_err(|e| other(e.to_string()))?;
    if only.is_some_and(|p| !all.contains(&p)) {
        return Err(other(format!(
            "{topic} has {partitions} partitions, none numbered {}",
            only.unwrap_or_default()
        )));
    }
    for p in all.filter(|p| only.is_none_or(|o| o == *p)) {
        let record = rdkafka::producer::FutureRecord::<str, [u8]>::to(topic)
            .partition(p)
            .key(crate::membership::END_MARKER);
        let end = futures::executor::block_on(marker.send(record, timeout))
            .map_err(|(e, _)| {
                TopicError::kafka(
                    e,
                    &format!("marking the end of {topic}[{p}]"),
                    &format!("Write on topic {topic}"),
                )
            })?
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
                    return Err(TopicError::of(
                        code,
                        format!("reading {topic}"),
                        &format!("Read on topic {topic} and on group {GROUP}"),
                    ));
                }
                tracing::warn!(%topic, error = %e, "reading the membership topic")
            }
            None if idle.elapsed() > REPLAY_IDLE => {
                return Err(other(format!(
                    "reading {topic}: nothing for {REPLAY_IDLE:?} before its end offsets (a transaction open or hanging there holds read_committed readers back: kafka-transactions.sh find-hanging lists those)"
                )))
            }
            None => {}
        }
    }
    crate::topics::admin::drop_later((consumer, marker));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consumer(properties: &[(&str, &str)]) -> Result<(), String> {
        let mut connection = ClientConfig::new();
        connection.set("bootstrap.servers", "127.0.0.1:9");
        for (k, v) in properties {
            connection.set(*k, *v);
        }
        consumer_settings(&connection)
            .create::<rdkafka::consumer::BaseConsumer>()
            .map(drop)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_reading_consumer_takes_its_small_buffers_unless_told_otherwise() {
        let mut connection = ClientConfig::new();
        connection.set("queued.max.messages.kbytes", "65536");
        let settings = consumer_settings(&connection);
        assert_eq!(settings.get("queued.max.messages.kbytes"), Some("65536"));
        assert_eq!(settings.get("queued.min.messages"), Some("5000"));
        assert_eq!(settings.get("fetch.max.bytes"), Some("1048576"));
        consumer(&[]).unwrap();
    }

    #[test]
    fn a_fetch_holds_the_largest_record_allowed() {
        consumer(&[("message.max.bytes", "4000000")]).unwrap();
        let mut connection = ClientConfig::new();
        connection.set("message.max.bytes", "4000000");
        assert_eq!(
            consumer_settings(&connection).get("fetch.max.bytes"),
            Some("4000000")
        );
    }
}
