//! Test doubles, behind the `testing` feature: a producer and a membership log in memory, and
//! the decoder's conformance contract with serde_json (for the fuzz target and the tests).

pub mod conformance;
mod memory;

pub use memory::{Memory, Order};
