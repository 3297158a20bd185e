//! The topic admin: creating missing topics as a [`Spec`] says, and describing them. Every call
//! blocks.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::types::RDKafkaRespErr;

use super::Spec;

/// How long one admin request may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// What the broker reports of a topic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicState {
    /// How many partitions the topic has.
    pub partitions: usize,
    /// The topic's configuration entries, as the broker describes them.
    pub configs: BTreeMap<String, String>,
    /// Whether this call created it.
    pub created: bool,
}

impl TopicState {
    /// A compacted topic of `partitions`, as the relay creates its state's topics.
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
    pub(crate) fn of(code: RDKafkaErrorCode, what: String, acl: &str) -> Self {
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

    pub(crate) fn kafka(e: KafkaError, what: &str, acl: &str) -> Self {
        match e.rdkafka_error_code() {
            Some(code) => Self::of(code, what.to_string(), acl),
            None => Self::Other(format!("{what}: {e}")),
        }
    }
}

/// How many partitions `topic` has in `md` (0 when it is not there).
pub(crate) fn partitions_in(md: &rdkafka::metadata::Metadata, topic: &str) -> usize {
    md.topics()
        .iter()
        .find(|t| t.name() == topic)
        .map_or(0, |t| t.partitions().len())
}

/// How many partitions `topic` has, read with `fetch` until the answer names at least one:
/// a broker answers for a topic created a moment ago before it knows its partitions, and a
/// count of 0 recorded then would later read as a changed topic. Gives up with
/// [`TopicError::Other`] after `within`.
pub(crate) fn partitions(
    topic: &str,
    within: Duration,
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
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An admin client on `connection`, and the metadata of one topic through it.
struct Admin {
    client: AdminClient<DefaultClientContext>,
    options: AdminOptions,
}

impl Admin {
    fn new(connection: &ClientConfig) -> Result<Self, TopicError> {
        Ok(Self {
            client: connection
                .create()
                .map_err(|e| TopicError::kafka(e, "creating an admin client", ""))?,
            options: AdminOptions::new().operation_timeout(Some(TIMEOUT)),
        })
    }

    fn metadata(&self, topic: &str) -> Result<rdkafka::metadata::Metadata, TopicError> {
        self.client
            .inner()
            .fetch_metadata(Some(topic), TIMEOUT)
            .map_err(|e| {
                TopicError::kafka(
                    e,
                    &format!("reading the metadata of {topic}"),
                    &format!("Describe on topic {topic}"),
                )
            })
    }

    /// Whether `topic` exists.
    fn exists(&self, topic: &str) -> Result<bool, TopicError> {
        let md = self.metadata(topic)?;
        let found = md.topics().iter().find(|t| t.name() == topic);
        match found.and_then(|t| t.error()) {
            None if found.is_some_and(|t| !t.partitions().is_empty()) => Ok(true),
            Some(e) if e != RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART => {
                Err(TopicError::of(
                    e.into(),
                    format!("reading the metadata of {topic}"),
                    &format!("Describe on topic {topic}"),
                ))
            }
            _ => Ok(false),
        }
    }

    /// Creates `missing`; the names of those this call created.
    fn create(&self, missing: &[&Spec]) -> Result<Vec<String>, TopicError> {
        let new: Vec<NewTopic<'_>> = missing
            .iter()
            .map(|s| {
                let mut t = NewTopic::new(
                    &s.name,
                    s.partitions,
                    TopicReplication::Fixed(s.replication.unwrap_or(-1)),
                );
                for (k, v) in &s.configs {
                    t = t.set(k, v);
                }
                t
            })
            .collect();
        let names: Vec<&str> = missing.iter().map(|s| s.name.as_str()).collect();
        let acl = format!("Create on topics {} (or on the cluster)", names.join(", "));
        let results = futures::executor::block_on(self.client.create_topics(&new, &self.options))
            .map_err(|e| TopicError::kafka(e, "creating topics", &acl))?;
        let mut created = Vec::new();
        for result in results {
            match result {
                Ok(name) => {
                    tracing::info!(topic = %name, "created the topic");
                    created.push(name);
                }
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    return Err(TopicError::of(
                        code,
                        format!("creating {name}"),
                        &format!("Create on topic {name} (or on the cluster)"),
                    ))
                }
            }
        }
        Ok(created)
    }

    /// What the broker reports of the topic of `spec`, which exists: its configurations only
    /// when it must be compacted (reading them needs DescribeConfigs, which a topic published
    /// to needs for nothing else).
    fn state(&self, spec: &Spec) -> Result<TopicState, TopicError> {
        let topic = spec.name.as_str();
        let partitions = partitions(topic, TIMEOUT, || self.metadata(topic))?;
        if !spec.compacted() {
            return Ok(TopicState {
                partitions,
                ..TopicState::default()
            });
        }
        let acl = format!("DescribeConfigs on topic {topic}");
        let described = futures::executor::block_on(
            self.client
                .describe_configs([&ResourceSpecifier::Topic(topic)], &self.options),
        )
        .map_err(|e| TopicError::kafka(e, &format!("describing {topic}"), &acl))?;
        let mut configs = BTreeMap::new();
        for resource in described {
            let resource = resource
                .map_err(|code| TopicError::of(code, format!("describing {topic}"), &acl))?;
            for entry in resource.entries {
                if let Some(value) = entry.value {
                    configs.insert(entry.name, value);
                }
            }
        }
        Ok(TopicState {
            partitions,
            configs,
            created: false,
        })
    }
}

/// Lets `clients` (librdkafka handles done with) go on a thread of their own: destroying one
/// waits for its broker threads to end, 50-100 ms each, which a shard's takeover would
/// otherwise wait out at each restore. Inline when no thread can be had.
pub(crate) fn drop_later<T: Send + 'static>(clients: T) {
    // A spawn that fails drops its closure, and the clients with it, here.
    let spawned = std::thread::Builder::new()
        .name("kafka-drop".into())
        .spawn(move || drop(clients));
    if let Err(e) = spawned {
        tracing::debug!(error = %e, "no thread to close Kafka clients on; closed them inline");
    }
}

/// What the broker reports of each topic of `specs`, in order; `None` for a missing one.
/// Creates nothing.
pub fn describe(
    connection: &ClientConfig,
    specs: &[Spec],
) -> Result<Vec<Option<TopicState>>, TopicError> {
    let admin = Admin::new(connection)?;
    let described = specs
        .iter()
        .map(|s| admin.exists(&s.name)?.then(|| admin.state(s)).transpose())
        .collect();
    drop_later(admin);
    described
}

/// Creates each topic of `specs` that does not exist, as its spec says, and says what the
/// broker reports of each, in order. Topics that exist are left as they are:
/// [`super::check`] judges them.
pub fn ensure(connection: &ClientConfig, specs: &[Spec]) -> Result<Vec<TopicState>, TopicError> {
    let admin = Admin::new(connection)?;
    let mut missing = Vec::new();
    for spec in specs {
        if !admin.exists(&spec.name)? {
            missing.push(spec);
        }
    }
    let created = if missing.is_empty() {
        Vec::new()
    } else {
        admin.create(&missing)?
    };
    let states = specs
        .iter()
        .map(|s| {
            let mut state = admin.state(s)?;
            state.created = created.contains(&s.name);
            Ok(state)
        })
        .collect();
    drop_later(admin);
    states
}
