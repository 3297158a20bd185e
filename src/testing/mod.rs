//! Test doubles, behind the `testing` feature: a producer and a membership log in memory, Kafka's
//! transactions over them, a group of replicas in memory, and
//! the decoder's conformance contract with serde_json (for the fuzz target and the tests).

pub mod conformance;
mod group;
mod memory;
mod transactions;

pub use group::MemoryGroup;
pub use memory::{Lane, Memory, Order};
pub use transactions::Transactions;
