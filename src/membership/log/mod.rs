//! The membership log: the compacted Kafka topic the sets are kept in, verified, created when
//! missing and read back. [`Log`] is the seam; [`Kafka`] reads and administers it with the
//! connection settings of `kafka` (the admin client in `topics.rs`, the reader in `replay.rs`).
//! Records are written to it through the [`Producer`](crate::producer::Producer) like any
//! other.

use rdkafka::config::ClientConfig;

use crate::config::KafkaConfig;
use crate::topics::Spec;
pub use crate::topics::{TopicError, TopicState};

mod replay;
mod topics;
mod write;

pub use replay::Apply;
pub use write::{adopt, send_all, SendError};

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

    /// Creates the topics of `specs` that are missing (with `create`), and says what the broker
    /// reports of each, in order, `None` for one missing. Blocks. Without a broker (a dry run,
    /// the test doubles), every topic is as its spec says.
    fn published(
        &self,
        specs: &[Spec],
        _create: bool,
    ) -> Result<Vec<Option<TopicState>>, TopicError> {
        Ok(specs
            .iter()
            .map(|s| {
                Some(TopicState {
                    partitions: usize::try_from(s.partitions).unwrap_or(0),
                    configs: s.configs.clone(),
                    created: false,
                })
            })
            .collect())
    }

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

    fn published(
        &self,
        specs: &[Spec],
        create: bool,
    ) -> Result<Vec<Option<TopicState>>, TopicError> {
        if create {
            let states = crate::topics::admin::ensure(&self.connection, specs)?;
            Ok(states.into_iter().map(Some).collect())
        } else {
            crate::topics::admin::describe(&self.connection, specs)
        }
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
