//! watchrelay: Kubernetes watch streams to Kafka topics, at least once.
//!
//! The modules, from the bottom layer up: each imports only modules of the layers below it (the
//! `layers` test fails when an import circle comes back, or when this table and the imports
//! differ).
//!
//! | layer | module | owns |
//! |---|---|---|
//! | 0 | [`event`], `json`, [`catalogue`], `kubeapi`, `tracker`, [`checkpoint`], [`metrics`] | the watch event's domain types; the JSON scanner; the channel catalogue; raw list and watch; ordered acknowledgements; the checkpoint ConfigMap (format, store); the metrics |
//! | 1 | [`config`], [`decode`] | the configuration file, parsed once into resolved channels, and every setting's validation; watch line / list item to [`event::WatchEvent`] (pure) |
//! | 2 | [`producer`], [`registry`], `leader`, [`group`], [`rbac`], [`status`], [`kubeclient`], `fanout`, [`topics`] | the Kafka producer and its input; live streams, their phases and checkpoints; Lease election; the replicas' group that shares the shards; the permissions a configuration needs; `watchrelay status`; one read of a collection per replica, dealt to its shards' streams; the topics a configuration names, created and checked |
//! | 3 | [`envelope`], [`http`] | announcement to Kafka record (pure); `/metrics`, `/healthz`, `/readyz` |
//! | 4 | [`membership`], [`asyncapi`] | which objects each stream announced, in a compacted Kafka topic; the AsyncAPI 3.0 document |
//! | 5 | `outbox`, [`openapi`], `testing` | one stream's delivery; object schemas; the test doubles (feature `testing`) |
//! | 6 | [`schemas`] | the topics' schemas in a schema registry, and the ids records carry |
//! | 7 | `stream` | one stream's state machine and its driver |
//! | 8 | [`relay`] | the facade, the supervisor, the checkpoint writer, and the shards of a replica |

pub mod asyncapi;
pub mod catalogue;
pub mod checkpoint;
pub mod config;
pub mod decode;
pub mod envelope;
pub mod event;
mod fanout;
pub mod group;
pub mod http;
mod json;
mod kubeapi;
pub mod kubeclient;
mod leader;
pub mod membership;
pub mod metrics;
pub mod openapi;
mod outbox;
pub mod producer;
pub mod rbac;
pub mod registry;
pub mod relay;
pub mod schemas;
pub mod status;
mod stream;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod topics;
mod tracker;

pub use relay::{Relay, RelayError};
/// A resync's bookkeeping, public for the benchmark that measures it at a million members.
pub use stream::Announced;
