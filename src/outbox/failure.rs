//! How a hand-over fails: cancelled, or a delivery failed for good with its typed cause.

use thiserror::Error;

use crate::producer::{DeliveryError, ProduceError};

#[derive(Debug, Error, PartialEq, Eq)]
pub enum OutboxError {
    #[error("cancelled")]
    Cancelled,
    /// A record could not be delivered. The outbox rewound: everything unacknowledged is
    /// forgotten, and the stream replays from `checkpoint`.
    #[error("{failure}")]
    Failed {
        failure: Failure,
        checkpoint: Option<String>,
    },
}

/// Why a delivery failed for good.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum Failure {
    /// The producer refused the record, or Kafka did not deliver it.
    #[error("{0}")]
    Produce(ProduceError),
    /// A membership join was not delivered: nothing announcing its object may be sent.
    #[error("membership record: {0:?}")]
    Membership(DeliveryError),
    #[error("a membership record was refused for size")]
    MembershipTooLarge,
    /// Its batch was refused for size: everything from the checkpoint is replayed one record
    /// at a time.
    #[error("a batch was refused for size; replaying one record at a time")]
    BatchTooLarge,
    #[error("a record refused for size is not an envelope the relay wrote")]
    NotAnEnvelope,
    #[error("even the reference envelope is too large")]
    ReferenceTooLarge,
}
