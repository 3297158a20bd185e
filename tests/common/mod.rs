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
