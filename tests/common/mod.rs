//! Shared fixtures for the integration tests.
#![allow(
    dead_code,
    reason = "each test binary uses a different part of the fixtures"
)]

pub mod bed;
pub mod broker;
pub mod cluster;
pub mod kafka;
pub mod proxy;
pub mod rng;
pub mod schema;
pub mod stream;
pub mod view;

/// Sends the relay's logs (`RUST_LOG`, by default its warnings and its own info lines) to the
/// test's captured output, which a failing test prints: what the relay said is the first thing
/// to read when a test hangs. Threads the test spawns (the relay's runtime) inherit the capture.
pub fn logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,watchrelay=info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}
