//! Keeping each topic's schema registered: one owner of the topics' tags.
//!
//! # States of a topic
//! - **pending**: its tag has no ids yet; the streams publishing there wait. A topic is pending
//!   from the relay's start (a concrete topic) or from its first stream's start (a selector
//!   channel's per-namespace topic) until the registry takes its schema. While the registry
//!   cannot be reached, or the channel's resource is not served yet (a CRD to come), it stays
//!   pending and is tried again with a backoff.
//! - **registered**: its tag carries the ids of the schema last registered. Every
//!   `schemaRegistry.refreshSeconds` the channels' object schemas are read again; a changed
//!   one is registered as the subject's new version and the tag moves to it.
//! - **refused**: the subject's compatibility rule refuses the schema. [`Schemas::run`] ends with
//!   the error naming the subject and the rule, and the relay stops: no record is published
//!   under a schema its registry does not hold, and no new subject is made on the side.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use thiserror::Error;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::client::{Client, ClientError};
use super::{subject, topic_schema};
use crate::asyncapi::{document, ClusterSchemas};
use crate::config::{Channel, Config, WireFormat};
use crate::envelope::SchemaTag;
use crate::openapi::{cluster_schemas, OpenApiError};

/// Longest wait before a pending topic is tried again.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Why the topics' schemas cannot be kept registered.
#[derive(Debug, Error)]
pub enum RegistryError {
    /// The registry refused a schema, for good.
    #[error(transparent)]
    Refused(#[from] ClientError),
}

struct Entry {
    tag: Arc<SchemaTag>,
    /// The channels publishing to the topic.
    channels: Vec<Arc<Channel>>,
    /// The schema the tag's ids are of; `None` while pending.
    schema: Option<Value>,
}

/// The topics' schema tags, kept registered (see the module's documentation).
pub struct Schemas {
    cfg: Arc<Config>,
    kube: kube::Client,
    client: Client,
    topics: Mutex<BTreeMap<String, Entry>>,
    /// A topic became pending.
    wake: Notify,
    pending: prometheus::IntGauge,
}

impl Schemas {
    /// The schemas of `cfg`'s topics, each concrete topic pending; `None` without a registry.
    pub fn new(
        cfg: Arc<Config>,
        kube: kube::Client,
        pending: prometheus::IntGauge,
    ) -> std::io::Result<Option<Arc<Self>>> {
        let Some(client) = Client::new(&cfg.schema_registry)? else {
            return Ok(None);
        };
        if !client.is_apicurio() && cfg.schema_registry.wire_format == WireFormat::Headers {
            tracing::warn!("the schema registry is not Apicurio's: with wireFormat headers the records carry no schema ids (Confluent's header form needs a schema GUID its API does not give); set wireFormat confluent");
        }
        let schemas = Arc::new(Self {
            cfg,
            kube,
            client,
            topics: Mutex::new(BTreeMap::new()),
            wake: Notify::new(),
            pending,
        });
        for ch in &schemas.cfg.channels {
            if !ch.topic.contains("{namespace}") {
                schemas.tag(&ch.topic_for(&schemas.cfg.cluster_name, None), None);
            }
        }
        Ok(Some(schemas))
    }

    /// The tag of `topic`, which streams over `namespace` (or cluster-wide ones) publish to:
    /// the topic's, or a new pending one.
    pub fn tag(&self, topic: &str, namespace: Option<&str>) -> Arc<SchemaTag> {
        let mut topics = self.topics.lock().expect("not poisoned");
        if let Some(e) = topics.get(topic) {
            return e.tag.clone();
        }
        let cluster = &self.cfg.cluster_name;
        let channels = self
            .cfg
            .channels
            .iter()
            .filter(|c| c.topic_for(cluster, namespace) == topic)
            .cloned()
            .collect();
        let prefix = self.cfg.schema_registry.wire_format == WireFormat::Confluent;
        let tag = Arc::new(SchemaTag::new(prefix));
        topics.insert(
            topic.to_string(),
            Entry {
                tag: tag.clone(),
                channels,
                schema: None,
            },
        );
        self.pending.inc();
        self.wake.notify_one();
        tag
    }

    /// Registers what is pending, and every `refreshSeconds` whatever changed, until `stop`;
    /// ends early only when the registry refuses a schema.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) -> Result<(), RegistryError> {
        let refresh = Duration::from_secs(self.cfg.schema_registry.refresh_seconds);
        let mut retry = Duration::from_millis(self.cfg.kubernetes.backoff_initial_ms.max(100));
        let mut next_refresh = tokio::time::Instant::now() + refresh;
        loop {
            let all = tokio::time::Instant::now() >= next_refresh;
            if all {
                next_refresh = tokio::time::Instant::now() + refresh;
            }
            let left = self.pass(all).await?;
            let wait = if left == 0 {
                retry = Duration::from_millis(self.cfg.kubernetes.backoff_initial_ms.max(100));
                next_refresh.saturating_duration_since(tokio::time::Instant::now())
            } else {
                retry = (retry * 2).min(RETRY_MAX);
                retry
            };
            tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = tokio::time::sleep(wait) => {}
                _ = self.wake.notified() => {}
            }
        }
    }

    /// One pass over the pending topics (`all`: every topic); how many are left pending.
    async fn pass(&self, all: bool) -> Result<usize, RegistryError> {
        let todo: Vec<(String, Vec<Arc<Channel>>)> = self
            .topics
            .lock()
            .expect("not poisoned")
            .iter()
            .filter(|(_, e)| all || e.schema.is_none())
            .map(|(t, e)| (t.clone(), e.channels.clone()))
            .collect();
        let mut objects = ObjectSchemas::default();
        let mut left = 0;
        for (topic, channels) in todo {
            let Some(schema) = objects.topic(self, &topic, &channels).await else {
                left += usize::from(self.is_pending(&topic));
                continue;
            };
            let unchanged = self.topics.lock().expect("not poisoned")[&topic]
                .schema
                .as_ref()
                == Some(&schema);
            if unchanged {
                continue;
            }
            match self.client.register(&subject(&topic), &schema).await {
                Ok(ids) => {
                    let mut topics = self.topics.lock().expect("not poisoned");
                    let entry = topics.get_mut(&topic).expect("topics are never removed");
                    if entry.schema.is_none() {
                        self.pending.dec();
                    } else {
                        tracing::info!(topic, subject = %subject(&topic), id = ids.id, "registered the topic's new schema");
                    }
                    entry.schema = Some(schema);
                    entry.tag.set(ids);
                }
                Err(e) if e.transient() => {
                    tracing::warn!(topic, error = %e, "the schema registry did not take the topic's schema; trying again");
                    left += usize::from(self.is_pending(&topic));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(left)
    }

    fn is_pending(&self, topic: &str) -> bool {
        self.topics.lock().expect("not poisoned")[topic]
            .schema
            .is_none()
    }
}

/// The channels' object schemas read in one pass, each channel once.
#[derive(Default)]
struct ObjectSchemas {
    read: HashMap<String, Option<ClusterSchemas>>,
}

impl ObjectSchemas {
    /// The schema of `topic`'s values, `None` when a channel's object schema cannot be read
    /// now (the API server unreachable, or not serving the resource yet).
    async fn topic(
        &mut self,
        schemas: &Schemas,
        topic: &str,
        channels: &[Arc<Channel>],
    ) -> Option<Value> {
        let mut merged = ClusterSchemas::default();
        for ch in channels {
            if !self.read.contains_key(&ch.name) {
                let read = match cluster_schemas(&schemas.kube, std::slice::from_ref(ch)).await {
                    Ok(s) => Some(s),
                    Err(e @ (OpenApiError::Api { .. } | OpenApiError::Missing(_))) => {
                        tracing::warn!(channel = %ch.name, error = %e, "cannot read the channel's object schema yet; its topic's schema waits");
                        None
                    }
                };
                self.read.insert(ch.name.clone(), read);
            }
            let read = self.read[&ch.name].as_ref()?;
            merged.objects.extend(read.objects.clone());
            merged.components.extend(read.components.clone());
        }
        let doc = document(&schemas.cfg, Some(&merged));
        let names: Vec<&str> = channels.iter().map(|c| c.name.as_str()).collect();
        Some(topic_schema(&doc, topic, &names))
    }
}
