//! watchrelay-sim: a Kubernetes API server simulator for tests, benchmarks and demos.
//!
//! It serves the Kubernetes HTTP API on loopback following the API concepts documentation
//! (one resourceVersion counter, history replay, 410 Expired as an in-stream ERROR event,
//! bookmarks, `sendInitialEvents`, pagination with consistent snapshots, optimistic concurrency),
//! so that real clients (`kubectl`, the `kube` crate) work against it. Tests drive it through
//! [`Sim`]: they change objects, inject faults and read the journal of every change.
//!
//! Modules: `sim` (the [`Sim`] handle), `faults` (fault injection) and `churn` (background
//! changes), which add to it; `state` (what the handle shares with the server), `config`
//! ([`SimConfig`]), `error` ([`SimError`]), `store` (objects, history, journal), `server`
//! (HTTP), `wire` (bodies and queries), `tls`, `watch` (watch streams), `openapi`, `requests`
//! (request counters), and the public [`objects`], [`resources`] and [`selector`].

mod churn;
mod config;
mod error;
mod faults;
pub mod objects;
mod openapi;
mod requests;
pub mod resources;
pub mod selector;
mod server;
pub mod shards;
mod sim;
mod state;
mod store;
mod tls;
mod watch;
mod wire;

pub use churn::{ChurnHandle, ChurnSpec};
pub use config::SimConfig;
pub use error::SimError;
pub use requests::RequestCounts;
pub use resources::Resource;
pub use sim::Sim;
pub use state::Fault;
pub use store::{JournalEntry, Snapshot};
