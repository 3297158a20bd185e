//! `SimError`: an API error, shaped like the Kubernetes `Status` the API server answers with.

use serde_json::{json, Value};
use thiserror::Error;

/// An API error, shaped like a Kubernetes `Status`.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{code} {reason}: {message}")]
pub struct SimError {
    /// The HTTP status code, e.g. 404 or 410.
    pub code: u16,
    /// The Status's machine-readable `reason`, e.g. `NotFound` or `Expired`.
    pub reason: String,
    /// The Status's human-readable `message`.
    pub message: String,
    /// The Status's `details`: what object the error is about, as the API server says it.
    pub details: Option<Value>,
}

impl SimError {
    /// An error with `code`, `reason` and `message`, about no object in particular.
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
    /// 404 NotFound: object `name` of `resource` does not exist.
    pub fn not_found(resource: &str, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{resource} {name:?} not found")).about(resource, name)
    }
    /// 422 Invalid: the object or the request breaks a rule the API server enforces.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }
    /// 400 BadRequest: a malformed request, body or parameter.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    /// 410 Expired: resourceVersion `rv` is older than the history reaches (`oldest`: compacted).
    pub fn expired(rv: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {rv} ({oldest})"),
        )
    }
    /// The error as the `Status` object the API server answers (or sends in an ERROR event) with.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code,
        });
        // An error the API server answers without a reason (an internal one) has none.
        if self.reason.is_empty() {
            status.as_object_mut().expect("an object").remove("reason");
        }
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}
