//! The membership topic's admin: created compacted when missing, and described.

use rdkafka::config::ClientConfig;

use crate::topics::{admin, Role, Spec};
use crate::topics::{TopicError, TopicState};

/// Creates `topic` compacted unless it exists, and says what the broker reports of it.
pub(super) fn ensure_compacted(
    connection: &ClientConfig,
    topic: &str,
    partitions: i32,
    replication: Option<i32>,
) -> Result<TopicState, TopicError> {
    let spec = Spec {
        name: topic.to_string(),
        role: Role::Membership,
        partitions,
        at_least: None,
        replication,
        configs: TopicState::compacted(0).configs,
    };
    let mut states = admin::ensure(connection, &[spec])?;
    Ok(states.remove(0))
}
