//! watchrelay: Kubernetes watch streams to Kafka topics, at least once.
#![forbid(unsafe_code)]

pub mod catalogue;
pub mod checkpoint;
pub mod config;
pub mod envelope;
pub mod http;
pub mod json;
pub mod kubeapi;
pub mod leader;
pub mod metrics;
pub mod relay;
pub mod sink;
pub mod stream;
pub mod tracker;
