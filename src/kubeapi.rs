//! Raw list and watch requests.
//!
//! The relay reads watch responses as bytes and splits lines itself, so objects can be passed
//! through without being decoded into typed structs, and so a malformed line is a countable
//! event rather than the end of a typed stream.

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ListParams, VersionMatch};
use kube::client::Body;
use kube::Api;
use serde::Deserialize;
use serde_json::value::RawValue;
use thiserror::Error;

/// The names of the namespaces whose labels match `selector` (every namespace for an empty
/// one): now, or with `at` as they were at exactly that resourceVersion (a server that no
/// longer holds it answers 410).
pub async fn namespaces(
    client: &kube::Client,
    selector: &str,
    at: Option<&str>,
) -> Result<BTreeSet<String>, kube::Error> {
    let api: Api<Namespace> = Api::all(client.clone());
    let mut params = ListParams::default();
    if !selector.is_empty() {
        params = params.labels(selector);
    }
    if let Some(rv) = at {
        params = params.at(rv).matching(VersionMatch::Exact);
    }
    let list = api.list_metadata(&params).await?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect())
}

/// Largest watch line the relay accepts; Kubernetes objects are limited to about 1.5 MiB in etcd,
/// so anything much larger is a broken stream, not an object.
pub const MAX_LINE: usize = 16 * 1024 * 1024;

/// Largest list page read: `listPageSize` objects of at most about 1.5 MiB each, with room.
pub const MAX_PAGE: usize = 512 * 1024 * 1024;

/// Largest error response body read; the Status message in it is what matters.
const MAX_ERROR_BODY: usize = 64 * 1024;

#[derive(Debug, Error)]
pub enum ApiError {
    /// The requested resourceVersion is no longer available (HTTP 410 or an in-stream ERROR).
    #[error("resource version expired: {0}")]
    Gone(String),
    #[error("HTTP {code} {reason}: {message}")]
    Status {
        code: u16,
        reason: String,
        message: String,
        retry_after: Option<Duration>,
    },
    #[error("request failed: {0}")]
    Transport(#[from] kube::Error),
    #[error("reading the response failed: {0}")]
    Body(String),
    #[error("malformed response: {0}")]
    Decode(#[from] serde_json::Error),
    #[error("a watch line exceeded {MAX_LINE} bytes")]
    LineTooLong,
    #[error("a list page exceeded {MAX_PAGE} bytes; lower kubernetes.listPageSize")]
    PageTooLarge,
}

impl ApiError {
    /// How long the server asked us to wait, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ApiError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            ApiError::Gone(_) => "gone",
            ApiError::Status {
                code: 401 | 403, ..
            } => "unauthorized",
            ApiError::Status { code: 404, .. } => "not_found",
            ApiError::Status { code: 429, .. } => "throttled",
            ApiError::Status { .. } => "status",
            ApiError::Transport(_) | ApiError::Body(_) => "transport",
            ApiError::Decode(_) | ApiError::LineTooLong | ApiError::PageTooLarge => "decode",
        }
    }
}

/// Selectors and options shared by list and watch.
#[derive(Clone, Debug, Default)]
pub struct Query<'a> {
    pub label_selector: Option<&'a str>,
    pub field_selector: Option<&'a str>,
    /// Ranges of the server's hash of a field (`shardSelector`, sharded list and watch): a
    /// server without the feature ignores it and sends everything.
    pub shard_selector: Option<&'a str>,
}

fn url(path: &str, q: &Query<'_>, extra: &[(&str, &str)]) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    if let Some(l) = q.label_selector {
        s.append_pair("labelSelector", l);
    }
    if let Some(f) = q.field_selector {
        s.append_pair("fieldSelector", f);
    }
    if let Some(r) = q.shard_selector {
        s.append_pair("shardSelector", r);
    }
    for (k, v) in extra {
        s.append_pair(k, v);
    }
    format!("{path}?{}", s.finish())
}

async fn get(client: &kube::Client, uri: String) -> Result<http::Response<Body>, ApiError> {
    let req = Request::get(uri)
        .body(Body::empty())
        .expect("a GET with a valid URI builds");
    let res = client.send(req).await?;
    if res.status().is_success() {
        return Ok(res);
    }
    let code = res.status();
    let retry_after = res
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_secs);
    // Only the start of an error body is read: it is the server's Status, or garbage.
    let body = http_body_util::Limited::new(res.into_body(), MAX_ERROR_BODY)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    #[derive(Deserialize, Default)]
    struct Status {
        #[serde(default)]
        reason: String,
        #[serde(default)]
        message: String,
    }
    let st: Status = serde_json::from_slice(&body).unwrap_or_default();
    if code == StatusCode::GONE {
        return Err(ApiError::Gone(st.message));
    }
    let message = if st.message.is_empty() {
        String::from_utf8_lossy(&body).trim().to_string()
    } else {
        st.message
    };
    Err(ApiError::Status {
        code: code.as_u16(),
        reason: st.reason,
        message,
        retry_after,
    })
}

/// One page of a list.
pub struct ListPage {
    /// e.g. `PodList`.
    pub kind: String,
    pub resource_version: String,
    pub continue_token: Option<String>,
    /// The server applied the query's `shardSelector` (its answer says so in
    /// `metadata.shardInfo`; one that ignored it does not).
    pub sharded: bool,
    pub items: Vec<Box<RawValue>>,
}

/// Lists one page. `continue_token` pins the snapshot of the first page; an expired token comes
/// back as [`ApiError::Gone`] and the caller starts over.
pub async fn list_page(
    client: &kube::Client,
    path: &str,
    q: &Query<'_>,
    limit: Option<u32>,
    continue_token: Option<&str>,
) -> Result<ListPage, ApiError> {
    let limit = limit.map(|l| l.to_string());
    let mut extra = Vec::new();
    if let Some(l) = &limit {
        extra.push(("limit", l.as_str()));
    }
    if let Some(c) = continue_token {
        extra.push(("continue", c));
    }
    let res = get(client, url(path, q, &extra)).await?;
    let body = http_body_util::Limited::new(res.into_body(), MAX_PAGE)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                ApiError::PageTooLarge
            } else {
                ApiError::Body(e.to_string())
            }
        })?
        .to_bytes();
    #[derive(Deserialize)]
    struct Md {
        #[serde(rename = "resourceVersion", default)]
        resource_version: String,
        #[serde(rename = "continue", default)]
        continue_token: Option<String>,
        #[serde(rename = "shardInfo", default)]
        shard_info: Option<serde::de::IgnoredAny>,
    }
    #[derive(Deserialize)]
    struct List {
        #[serde(default)]
        kind: String,
        metadata: Md,
        #[serde(default)]
        items: Option<Vec<Box<RawValue>>>,
    }
    let list: List = serde_json::from_slice(&body)?;
    Ok(ListPage {
        kind: list.kind,
        resource_version: list.metadata.resource_version,
        continue_token: list.metadata.continue_token.filter(|c| !c.is_empty()),
        sharded: list.metadata.shard_info.is_some(),
        items: list.items.unwrap_or_default(),
    })
}

/// An open watch response, read line by line.
pub struct Watch {
    body: Body,
    lines: Lines,
    done: bool,
}

/// The lines of a byte stream received in frames. A line inside one frame is a slice of it,
/// not a copy (a watch event is usually one frame: the server flushes each); only a line cut
/// across frames is gathered into a buffer.
#[derive(Default)]
struct Lines {
    /// What remains of the last frame, after the lines taken from it.
    frame: Bytes,
    /// The start of a line whose end has not arrived yet.
    partial: BytesMut,
}

impl Lines {
    /// Adds the next frame; every line of the previous one must have been taken.
    fn push(&mut self, frame: Bytes) {
        debug_assert!(self.frame.is_empty(), "a frame still holds lines");
        self.frame = frame;
    }

    /// The next complete line that is not blank, without its newline.
    fn next(&mut self) -> Option<Bytes> {
        loop {
            let Some(i) = memchr::memchr(b'\n', &self.frame) else {
                // No end of line in what remains: it starts (or continues) a partial line.
                self.partial.extend_from_slice(&self.frame);
                self.frame.clear();
                return None;
            };
            let line = if self.partial.is_empty() {
                let line = self.frame.slice(..i);
                self.frame.advance(i + 1);
                line
            } else {
                self.partial.extend_from_slice(&self.frame[..i]);
                self.frame.advance(i + 1);
                self.partial.split().freeze()
            };
            if !line.iter().all(u8::is_ascii_whitespace) {
                return Some(line);
            }
        }
    }

    /// Bytes of the line not yet complete.
    fn partial(&self) -> &[u8] {
        &self.partial
    }

    /// Drops the line not yet complete; returns its length.
    fn drop_partial(&mut self) -> usize {
        let n = self.partial.len();
        self.partial.clear();
        n
    }
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("buffered", &self.lines.partial().len())
            .field("done", &self.done)
            .finish()
    }
}

/// Where a watch starts.
#[derive(Clone, Copy, Debug)]
pub enum WatchFrom<'a> {
    /// Just after this resourceVersion.
    Version(&'a str),
    /// With the current state as ADDED events, ended by a BOOKMARK annotated
    /// `k8s.io/initial-events-end`.
    InitialEvents,
}

/// Opens a watch with bookmarks on.
///
/// A watch from a version ends after `timeout_seconds`. An initial-events watch carries no
/// timeout of its own: however long the initial state takes to stream, it completes within the
/// server's request limit (30 minutes or more), instead of being cut and restarted forever.
pub async fn watch(
    client: &kube::Client,
    path: &str,
    q: &Query<'_>,
    from: WatchFrom<'_>,
    timeout_seconds: u32,
) -> Result<Watch, ApiError> {
    let timeout = timeout_seconds.to_string();
    let mut extra = vec![("watch", "true"), ("allowWatchBookmarks", "true")];
    match from {
        WatchFrom::Version(rv) => {
            extra.push(("timeoutSeconds", timeout.as_str()));
            extra.push(("resourceVersion", rv));
        }
        WatchFrom::InitialEvents => extra.extend([
            ("sendInitialEvents", "true"),
            ("resourceVersionMatch", "NotOlderThan"),
        ]),
    }
    let res = get(client, url(path, q, &extra)).await?;
    Ok(Watch {
        body: res.into_body(),
        lines: Lines::default(),
        done: false,
    })
}

impl Watch {
    /// The next complete line; `Ok(None)` at a clean end of stream. A trailing partial line at
    /// the end of the stream is an error: the connection was cut mid-event.
    pub async fn next_line(&mut self) -> Result<Option<Bytes>, ApiError> {
        loop {
            if let Some(line) = self.lines.next() {
                return Ok(Some(line));
            }
            if self.lines.partial().len() > MAX_LINE {
                return Err(ApiError::LineTooLong);
            }
            if self.done {
                return if self.lines.partial().iter().all(u8::is_ascii_whitespace) {
                    Ok(None)
                } else {
                    let n = self.lines.drop_partial();
                    Err(ApiError::Body(format!(
                        "stream ended inside a line ({n} bytes)"
                    )))
                };
            }
            match self.body.frame().await {
                None => self.done = true,
                Some(Err(e)) => return Err(ApiError::Body(e.to_string())),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.lines.push(data);
                    }
                }
            }
        }
    }

    /// A complete line already received, without waiting for more input.
    pub fn buffered_line(&mut self) -> Option<Bytes> {
        self.lines.next()
    }
}

/// Whether `group/version` serves `resource`, according to discovery. Custom channels use it
/// to wait for a CRD that does not exist yet.
pub async fn resource_exists(
    client: &kube::Client,
    api_version: &str,
    resource: &str,
) -> Result<bool, ApiError> {
    let res = if api_version.contains('/') {
        client.list_api_group_resources(api_version).await
    } else {
        client.list_core_api_resources(api_version).await
    };
    match res {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == resource)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(ApiError::Transport(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_the_same_however_the_stream_is_cut_into_frames() {
        let text = b"{\"a\":1}\n\n  \n{\"b\":\"two\"}\n{\"c\":3}\n{\"d\":[4]}";
        let whole: Vec<&[u8]> = vec![b"{\"a\":1}", b"{\"b\":\"two\"}", b"{\"c\":3}"];
        // Every way of cutting the stream in three frames.
        for i in 0..=text.len() {
            for j in i..=text.len() {
                let mut lines = Lines::default();
                let mut got = Vec::new();
                for frame in [&text[..i], &text[i..j], &text[j..]] {
                    lines.push(Bytes::copy_from_slice(frame));
                    got.extend(std::iter::from_fn(|| lines.next()));
                }
                assert_eq!(got, whole, "cut at {i} and {j}");
                assert_eq!(lines.partial(), b"{\"d\":[4]}");
            }
        }
    }

    #[test]
    fn a_line_inside_one_frame_is_not_copied() {
        let frame = Bytes::from_static(b"{\"a\":1}\n{\"b\":2}\n");
        let mut lines = Lines::default();
        lines.push(frame.clone());
        let line = lines.next().unwrap();
        assert_eq!(line.as_ptr(), frame.as_ptr());
        assert_eq!(lines.next().unwrap().as_ptr(), frame[8..].as_ptr());
    }
}
