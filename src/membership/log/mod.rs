//! The membership log: the compacted Kafka topic the sets are kept in, verified, created when
//! missing and read back. [`Log`] is the seam; [`Kafka`] reads and administers it with the
//! connection settings of `kafka` (the admin client in `topics.rs`, the reader in `replay.rs`).
//! Records are written to it through the [`Producer`](crate::producer::Producer) like any
//! other.

use std::collections::BTreeMap;

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::config::KafkaConfig;

mod replay;
mod topics;
mod write;

pub use write::{adopt, send_all, SendError};

/// How many partitions `topic` has in `md` (0 when it is not there).
fn partitions_in(md: &rdkafka::metadata::Metadata, topic: &str) -> usize {
    md.topics()
        .iter()
        .find(|t| t.name() == topic)
        .map_or(0, |t| t.partitions().len())
}

/// How many partitions `topic` has, read with `fetch` until the answer names at least one:
/// a broker answers for a topic created a moment ago before it knows its partitions, and a
/// count of 0 recorded then would later read as a changed topic. Gives up with
/// [`TopicError::Other`] after `within`.
fn partitions(
    topic: &str,
    within: std::time::Duration,
    fetch: impl Fn() -> Result<rdkafka::metadata::Metadata, TopicError>,
) -> Result<usize, TopicError> {
    let deadline = std::time::Instant::now() + within;
    loop {
        let n = partitions_in(&fetch()?, topic);
        if n > 0 {
            return Ok(n);
        }
        if std::time::Instant::now() >= deadline {
            return Err(TopicError::Other(format!(
                "the brokers name no partition of {topic} after {within:?}"
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// What reading a topic hands each record to: its key, and its value (`None` for a tombstone).
pub type Apply<'a> = dyn FnMut(&[u8], Option<&[u8]>) + 'a;

/// Administers and reads the membership topic. Every call blocks.
pub trait Log: Send + Sync {
    /// Creates `topic` compacted (`cleanup.policy=compact`) unless it exists, and says what the
    /// broker reports of it. Blocks.
    fn ensure_compacted(
        &self,
        topic: &str,
        partitions: i32,
        replication: Option<i32>,
    ) -> Result<TopicState, TopicError>;

    /// Reads `topic` from its beginning to its end as of the call, handing each record's key
    /// and value (`None` for a tombstone) to `apply`, in partition order, until `stopped` says
    /// to give up. Blocks.
    fn replay(
        &self,
        topic: &str,
        apply: &mut Apply<'_>,
        stopped: &(dyn Fn() -> bool + Sync),
    ) -> Result<(), TopicError>;
}

/// No membership topic: for a run that keeps no state (a dry run).
pub struct Empty;

impl Log for Empty {
    fn ensure_compacted(
        &self,
        _topic: &str,
        _partitions: i32,
        _replication: Option<i32>,
    ) -> Result<TopicState, TopicError> {
        Ok(TopicState::compacted(1))
    }

    fn replay(
        &self,
        _topic: &str,
        _apply: &mut Apply<'_>,
        _stopped: &(dyn Fn() -> bool + Sync),
    ) -> Result<(), TopicError> {
        Ok(())
    }
}

/// The membership topic on Kafka.
pub struct Kafka {
    /// The connection settings (`bootstrap.servers`, security), without the producer's own.
    connection: ClientConfig,
    /// The one partition read back (a shard's), or all of them.
    only: Option<i32>,
}

impl Kafka {
    /// The log reached with `cfg`'s connection settings.
    pub fn new(cfg: &KafkaConfig) -> Self {
        Self {
            connection: cfg.connection_config(),
            only: None,
        }
    }

    /// The log of one shard: [`Log::replay`] reads partition `partition` alone, where the
    /// shard's records are written.
    pub fn partition(mut self, partition: i32) -> Self {
        self.only = Some(partition);
        self
    }
}

impl Log for Kafka {
    fn ensure_compacted(
        &self,
        topic: &str,
        partitions: i32,
        replication: Option<i32>,
    ) -> Result<TopicState, TopicError> {
        topics::ensure_compacted(&self.connection, topic, partitions, replication)
    }

    fn replay(
        &self,
        topic: &str,
        apply: &mut Apply<'_>,
        stopped: &(dyn Fn() -> bool + Sync),
    ) -> Result<(), TopicError> {
        replay::replay(&self.connection, topic, self.only, apply, stopped)
    }
}

/// What the broker reports of a topic the relay keeps its state in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicState {
    /// How many partitions the topic has: the count the membership mark records.
    pub partitions: usize,
    /// The topic's configuration entries, as the broker describes them.
    pub configs: BTreeMap<String, String>,
    /// Whether this call created it.
    pub created: bool,
}

impl TopicState {
    /// A compacted topic of `partitions`, as the relay creates it.
    pub fn compacted(partitions: usize) -> Self {
        Self {
            partitions,
            configs: BTreeMap::from([("cleanup.policy".to_string(), "compact".to_string())]),
            created: false,
        }
    }
}

/// Why a topic could not be created, described or read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    /// The broker refused for lack of permission: retrying does not help until an ACL changes.
    #[error("not authorized: {0}")]
    Unauthorized(String),
    /// The relay began to stop while the topic was being read.
    #[error("stopped")]
    Stopped,
    /// Anything else the broker or the client reported; the message says what was being done.
    #[error("{0}")]
    Other(String),
}

impl TopicError {
    /// `code` from doing `what`; `acl` names the ACL the relay's principal needs for it (an
    /// operation and a resource, e.g. `Create on topic T`), said when the broker refused.
    fn of(code: RDKafkaErrorCode, what: String, acl: &str) -> Self {
        match code {
            RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed
            | RDKafkaErrorCode::GroupAuthorizationFailed => Self::Unauthorized(format!(
                "{what}: {code}; grant the relay's principal the ACL {acl}"
            )),
            RDKafkaErrorCode::SaslAuthenticationFailed => {
                Self::Unauthorized(format!("{what}: {code}; check the SASL credentials"))
            }
            _ => Self::Other(format!("{what}: {code}")),
        }
    }

    fn kafka(e: KafkaError, what: &str, acl: &str) -> Self {
        match e.rdkafka_error_code() {
            Some(code) => Self::of(code, what.to_string(), acl),
            None => Self::Other(format!("{what}: {e}")),
        }
    }
}
