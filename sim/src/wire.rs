//! What goes over the wire: the body of an answer, a JSON answer or an error's, and the
//! parameters of a request's query.

use std::convert::Infallible;

use bytes::Bytes;
use http::Response;
use http_body_util::{BodyExt, Full};
use serde_json::Value;

use crate::SimError;

/// The body of every response: whole documents and watch streams alike.
pub(crate) type Body = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

pub(crate) fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

pub(crate) fn json_response(code: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(full(serde_json::to_vec(v).expect("json values serialize")))
        .expect("static parts are valid")
}

pub(crate) fn error(e: &SimError) -> Response<Body> {
    json_response(e.code, &e.status())
}

/// The query string's parameters.
pub(crate) struct Query(pub(crate) Vec<(String, String)>);

impl Query {
    pub(crate) fn get(&self, k: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(qk, _)| qk == k)
            .map(|(_, v)| v.as_str())
    }
}
