//! `SimError`: an API error, shaped like the Kubernetes `Status` the API server answers with.

use serde_json::{json, Value};
use thiserror::Error;

/// An API error, shaped like a Kubernetes `Status`.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{code} {reason}: {message}")]
pub struct SimError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    /// The Status's `details`: what object the error is about, as the API server says it.
    pub details: Option<Value>,
}

impl SimError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.into(),
            message: message.into(),
            details: None,
        }
    }
    /// The error concerns object `name` of `resource` (`plural[.group]`): the details the API
    /// server gives NotFound, AlreadyExists and Conflict.
    pub fn about(mut self, resource: &str, name: &str) -> Self {
        let (plural, group) = resource.split_once('.').unwrap_or((resource, ""));
        let mut details = json!({"name": name, "kind": plural});
        if !group.is_empty() {
            details["group"] = group.into();
        }
        self.details = Some(details);
        self
    }
    pub fn not_found(resource: &str, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{resource} {name:?} not found")).about(resource, name)
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    pub fn expired(rv: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {rv} ({oldest})"),
        )
    }
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}
