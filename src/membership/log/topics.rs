//! The topic admin: creating the membership topic compacted when missing, and describing it.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::RDKafkaErrorCode;

use super::{TopicError, TopicState};

/// Creates `topic` compacted unless it exists, and says what the broker reports of it.
pub(super) fn ensure_compacted(
    connection: &ClientConfig,
    topic: &str,
    partitions: i32,
    replication: Option<i32>,
) -> Result<TopicState, TopicError> {
    use rdkafka::admin::{
        AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication,
    };
    use rdkafka::types::RDKafkaRespErr;
    let timeout = Duration::from_secs(30);
    let describe = format!("Describe on topic {topic}");
    let create = format!("Create on topic {topic} (or on the cluster)");
    let describe_configs = format!("DescribeConfigs on topic {topic}");
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = connection
        .create()
        .map_err(|e| TopicError::kafka(e, "creating an admin client", ""))?;
    let options = AdminOptions::new().operation_timeout(Some(timeout));
    // Created only when missing: where the relay may not create topics, one made by hand
    // is used as it is (and verified like any other).
    let md = admin
        .inner()
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| {
            TopicError::kafka(e, &format!("reading the metadata of {topic}"), &describe)
        })?;
    let found = md.topics().iter().find(|t| t.name() == topic);
    let mut created = false;
    match found.and_then(|t| t.error()) {
        None if found.is_some_and(|t| !t.partitions().is_empty()) => {}
        Some(e) if e != RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART => {
            return Err(TopicError::of(
                e.into(),
                format!("reading the metadata of {topic}"),
                &describe,
            ));
        }
        _ => {
            let new = NewTopic::new(
                topic,
                partitions,
                TopicReplication::Fixed(replication.unwrap_or(-1)),
            )
            .set("cleanup.policy", "compact");
            let results = futures::executor::block_on(admin.create_topics([&new], &options))
                .map_err(|e| TopicError::kafka(e, &format!("creating {topic}"), &create))?;
            for result in results {
                match result {
                    Ok(_) => {
                        created = true;
                        tracing::info!(%topic, partitions, "created the membership topic (compacted)")
                    }
                    Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                    Err((_, code)) => {
                        return Err(TopicError::of(code, format!("creating {topic}"), &create))
                    }
                }
            }
        }
    }
    let partitions = super::partitions(topic, timeout, || {
        admin
            .inner()
            .fetch_metadata(Some(topic), timeout)
            .map_err(|e| {
                TopicError::kafka(e, &format!("reading the metadata of {topic}"), &describe)
            })
    })?;
    let described = futures::executor::block_on(
        admin.describe_configs([&ResourceSpecifier::Topic(topic)], &options),
    )
    .map_err(|e| TopicError::kafka(e, &format!("describing {topic}"), &describe_configs))?;
    let mut configs = BTreeMap::new();
    for resource in described {
        let resource = resource.map_err(|code| {
            TopicError::of(code, format!("describing {topic}"), &describe_configs)
        })?;
        for entry in resource.entries {
            if let Some(value) = entry.value {
                configs.insert(entry.name, value);
            }
        }
    }
    Ok(TopicState {
        partitions,
        configs,
        created,
    })
}
