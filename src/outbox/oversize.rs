//! A record too large for Kafka: the reference standing in for it, in its place, on the
//! dead-letter topic or the channel's own.

use super::{Failure, Outbox, OutboxError};
use crate::config::OversizePolicy;
use crate::envelope;
use crate::producer::{Receipt, Sent};

impl Outbox {
    /// Sends the reference standing in for a record too large for Kafka (its `key` and
    /// envelope `value`), in its place.
    pub(super) async fn send_reference(
        &mut self,
        receipt: Box<Receipt>,
        key: &[u8],
        value: &[u8],
        more: bool,
    ) -> Result<(), OutboxError> {
        let Sent::Entry { bytes, .. } = receipt.sent else {
            return Err(self.fail(Failure::MembershipTooLarge));
        };
        let announced = std::str::from_utf8(key)
            .ok()
            .and_then(|key| envelope::announced(value, key));
        let Some(announcement) = announced else {
            return Err(self.fail(Failure::NotAnEnvelope));
        };
        let (action, topic) = match (&self.limits.oversize, &self.limits.dead_letter_topic) {
            (OversizePolicy::DeadLetter, Some(dlq)) if *dlq != self.route.topic => {
                self.m.oversize_dead_letter.inc();
                ("dead_letter", dlq.clone())
            }
            _ => {
                self.m.oversize_trim.inc();
                ("trim", self.route.topic.clone())
            }
        };
        let record = envelope::reference(&self.route, &announcement, bytes, &topic);
        tracing::warn!(stream = %self.stream, bytes, key = %record.key, action, "event too large for Kafka; sending a reference");
        // The reference takes the entry's place, and its position with it.
        let position = self.position_record(receipt.seq);
        match self.offer(&record, receipt, position, more).await? {
            None => Ok(()),
            Some(_) => Err(self.fail(Failure::ReferenceTooLarge)),
        }
    }
}
