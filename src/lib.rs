//! watchrelay: Kubernetes watch streams to Kafka topics, at least once.
//!
//! | module | owns |
//! |---|---|
//! | [`asyncapi`] | the AsyncAPI 3.0 document of what a configuration publishes |
//! | [`config`], [`channel`], [`catalogue`] | the configuration file, parsed once into resolved channels |
//! | [`event`] | the watch event types |
//! | [`decode`] | watch line / list item to [`decode::WatchEvent`] (pure) |
//! | `conformance` | the decoder's contract with serde_json, for the fuzz target and the tests |
//! | [`envelope`] | announcement to Kafka record (pure) |
//! | `stream` | one stream's state machine and its driver |
//! | `outbox` | one stream's delivery: ordered acks, backpressure, oversize, drain |
//! | [`producer`] | the Kafka producer, and one in memory for tests |
//! | [`registry`] | live streams, their phases and checkpoints, this replica's role |
//! | [`checkpoint`] | the checkpoint ConfigMap: stream positions; format, store, writer loop |
//! | [`membership`] | which objects each stream announced, in a compacted Kafka topic |
//! | [`relay`] | the facade and the supervisor |
//! | `leader` | leader election over a Lease |
//! | [`rbac`] | the permissions a configuration needs |
//! | [`status`] | what `watchrelay status` reads from the cluster |
//! | [`http`], [`metrics`] | `/metrics`, `/healthz`, `/readyz` |

pub mod asyncapi;
pub mod catalogue;
pub mod channel;
pub mod checkpoint;
pub mod config;
#[doc(hidden)]
pub mod conformance;
pub mod decode;
pub mod envelope;
pub mod event;
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
pub mod status;
mod stream;
mod tracker;

pub use relay::{Relay, RelayError};
/// A resync's bookkeeping, public for the benchmark that measures it at a million members.
pub use stream::Announced;
