//! Test doubles, behind the `testing` feature: a producer and a membership log in memory, a
//! group of replicas in memory, and
//! the decoder's conformance contract with serde_json (for the fuzz target and the tests).

pub mod conformance;
mod group;
mod memory;

pub use group::MemoryGroup;
pub use memory::{Lane, Memory, Order};
