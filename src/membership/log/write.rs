//! Writing batches of records to the membership topic and waiting for every acknowledgement.

use super::super::{record, Known, Members, Owner};
use crate::producer::{
    DeliveryError, Inbox, ProduceError, Producer, Receipt, Record, Refused, Sent,
};

/// Why a batch of membership records did not all reach Kafka.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Stopped before Kafka acknowledged every record.
    #[error("stopped before Kafka acknowledged every record")]
    Stopped,
    /// The producer did not take a record.
    #[error("the producer refused a record: {0}")]
    Refused(ProduceError),
    /// The producer refused a record for its size.
    #[error("the producer refused a record for its size")]
    TooLarge,
    /// Kafka did not deliver a record.
    #[error("a record was not delivered: {0:?}")]
    Undelivered(DeliveryError),
    /// Adopting a stream's members failed.
    #[error("adopting {stream}'s members: {source}")]
    Adopting {
        /// The stream.
        stream: String,
        /// Why.
        source: Box<SendError>,
    },
}

/// Sends `records` and waits until Kafka acknowledged every one of them, or `stopped` says to
/// give up (checked while the producer's queue is full and between reports).
pub async fn send_all(
    producer: &dyn Producer,
    records: impl IntoIterator<Item = Record>,
    stop: &tokio_util::sync::CancellationToken,
) -> Result<(), SendError> {
    let inbox = Inbox::new();
    let mut sent = 0usize;
    for record in records {
        let mut receipt = Receipt::new(inbox.clone(), 0, Sent::Unordered);
        // A full queue: offered again after 5 ms, doubling to 100 ms while it stays full.
        let mut wait = std::time::Duration::from_millis(5);
        loop {
            match producer.send(&record, receipt) {
                Ok(()) => break,
                Err(Refused::Full(back)) => {
                    receipt = back;
                    tokio::select! {
                        _ = stop.cancelled() => return Err(SendError::Stopped),
                        _ = tokio::time::sleep(wait) => {}
                    }
                    wait = (wait * 2).min(std::time::Duration::from_millis(100));
                }
                Err(Refused::TooLarge(_)) => return Err(SendError::TooLarge),
                Err(Refused::Failed(e)) => return Err(SendError::Refused(e)),
            }
        }
        sent += 1;
    }
    let mut ready = std::collections::VecDeque::new();
    for _ in 0..sent {
        let report = tokio::select! {
            _ = stop.cancelled() => return Err(SendError::Stopped),
            r = inbox.next(&mut ready) => r,
        };
        report.result.map_err(SendError::Undelivered)?;
    }
    Ok(())
}

/// Records written at a time when adopting members: only a batch of them is held.
const ADOPT_BATCH: usize = 1000;

/// Writes `members` as members of `owner`'s `stream` (an older version's ownerless records, or
/// the sets it kept in the checkpoint ConfigMap) and waits until Kafka acknowledged them all,
/// a batch at a time.
pub async fn adopt(
    producer: &dyn Producer,
    topic: &str,
    owner: &Owner,
    stream: &str,
    mut members: impl Iterator<Item = (String, Known)>,
    stop: &tokio_util::sync::CancellationToken,
) -> Result<Members, SendError> {
    let mut adopted = Members::default();
    loop {
        let mut records = Vec::with_capacity(ADOPT_BATCH);
        for (uid, k) in members.by_ref().take(ADOPT_BATCH) {
            records.push(record(topic, owner, stream, &uid, Some(&k)));
            adopted.insert(&uid, &k);
        }
        if records.is_empty() {
            return Ok(adopted);
        }
        send_all(producer, records, stop)
            .await
            .map_err(|e| SendError::Adopting {
                stream: stream.to_string(),
                source: Box::new(e),
            })?;
    }
}
