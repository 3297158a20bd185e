//! Shared fixtures for the integration tests.
#![allow(dead_code)] // each test binary uses a different part of the fixtures

pub mod kafka;
