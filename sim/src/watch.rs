//! Watch streams.
//!
//! A watch subscribes to the change broadcast while holding the store lock, so the replay (or
//! the initial state) and the live changes meet without a gap or an overlap. Each change's line
//! was serialized once when it happened; watchers without selectors pass it on untouched.
//!
//! A watcher that falls more than the broadcast capacity behind is disconnected (the client
//! resumes from its last resourceVersion), as kube-apiserver does with slow watchers.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Frame;
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc};

use crate::selector::Selector;
use crate::state::Inner;
use crate::store::{watch_line, Change};
use crate::wire::Body;

pub enum Start {
    /// resourceVersion unset or "0": synthetic ADDED for the current state first.
    Current,
    /// Replay every change after this resourceVersion.
    Exact(u64),
}

pub struct Params {
    pub resource: String,
    pub kind: String,
    pub api_version: String,
    pub namespace: Option<String>,
    pub labels: Selector,
    pub fields: Selector,
    /// The objects' shards asked for (`shardSelector`), where the gate is on.
    pub shards: Option<crate::shards::ShardSelector>,
    pub start: Start,
    pub bookmarks: bool,
    pub initial_events_end: bool,
    pub timeout: Option<Duration>,
}

impl Params {
    fn in_scope(&self, c: &Change) -> bool {
        c.resource == self.resource
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| c.namespace.as_ref() == Some(ns))
    }

    fn selects(&self, obj: &Value) -> bool {
        self.labels.matches_labels(obj)
            && self.fields.matches_fields(obj)
            && self.shards.as_ref().is_none_or(|s| s.matches(obj))
    }

    /// The line this watcher sends for a change, if any. With selectors, an object that starts
    /// matching arrives as ADDED and one that stops matching as DELETED.
    fn translate(&self, c: &Change) -> Option<Bytes> {
        if !self.in_scope(c) {
            return None;
        }
        if self.labels.is_empty() && self.fields.is_empty() && self.shards.is_none() {
            return Some(c.line.clone());
        }
        let object = c.object();
        let now = self.selects(&object);
        let before = c.prev().is_some_and(|p| self.selects(&p));
        match (c.event_type, before, now) {
            ("ADDED", _, true) | ("MODIFIED", true, true) => Some(c.line.clone()),
            ("DELETED", true, _) => Some(c.line.clone()),
            ("MODIFIED", false, true) => Some(watch_line("ADDED", &object)),
            ("MODIFIED", true, false) => Some(watch_line("DELETED", &object)),
            _ => None,
        }
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut md = json!({ "resourceVersion": rv.to_string() });
        if initial_end {
            md["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
        }
        watch_line(
            "BOOKMARK",
            &json!({ "kind": self.kind, "apiVersion": self.api_version, "metadata": md }),
        )
    }
}

type Tx = mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>;

/// Starts a watch and returns its response body. An expired start position is answered, as the
/// API server does, with HTTP 200 and a single ERROR event.
pub fn start(inner: Arc<Inner>, p: Params) -> Body {
    // A few frames of buffer: like the API server, a watch is paced by its reader, so a slow
    // reader of a large initial state can see the request's timeout end it midway.
    let (tx, rx) = mpsc::channel(4);
    // timeoutSeconds bounds the whole request, the initial state included.
    let deadline = p.timeout.map(|t| tokio::time::Instant::now() + t);
    let begun = {
        let store = inner.store.lock().expect("store lock poisoned");
        let sub = store.tx.subscribe();
        let first = match p.start {
            Start::Current => store
                .state_at(&p.resource, p.namespace.as_deref(), None)
                .map(First::State),
            Start::Exact(rv) => store.since(rv).map(First::Replay),
        };
        first.map(|f| (f, sub, store.rv))
    };
    let cancel = inner.watches.lock().expect("watches lock poisoned").clone();
    let stalled = inner.faults.stall_watch.swap(false, Ordering::SeqCst)
        || inner
            .faults
            .stall_watch_of
            .lock()
            .expect("faults lock poisoned")
            .take_if(|r| *r == p.resource)
            .is_some();
    tokio::spawn(async move {
        let _open = inner.requests.watch(matches!(p.start, Start::Current));
        if stalled {
            // Headers went out; nothing else will until the client hangs up.
            tokio::select! {
                _ = tx.closed() => {}
                _ = inner.shutdown.cancelled() => {}
            }
            return;
        }
        match begun {
            Err(e) => {
                let _ = tx
                    .send(Ok(Frame::data(watch_line("ERROR", &e.status()))))
                    .await;
            }
            Ok((first, sub, rv)) => {
                tokio::select! {
                    _ = run(&inner, &p, &tx, first, sub, rv) => {}
                    _ = async { tokio::time::sleep_until(deadline.expect("guarded")).await }, if deadline.is_some() => {}
                    _ = cancel.cancelled() => {}
                    _ = inner.shutdown.cancelled() => {}
                }
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    http_body_util::StreamBody::new(stream).boxed()
}

enum First {
    State(Vec<Arc<Value>>),
    Replay(Vec<Arc<Change>>),
}

/// Sends one line, applying armed faults. False when the stream must end.
async fn emit(inner: &Inner, tx: &Tx, line: Bytes) -> bool {
    if inner.faults.malformed.swap(false, Ordering::SeqCst)
        && tx
            .send(Ok(Frame::data(Bytes::from_static(
                b"{\"type\":\"MODIFIED\",\"object\":{oops this is not json\n",
            ))))
            .await
            .is_err()
    {
        return false;
    }
    if inner.faults.cut_line.swap(false, Ordering::SeqCst) {
        let _ = tx.send(Ok(Frame::data(line.slice(..line.len() / 2)))).await;
        // An error frame makes the server abort the connection without ending the chunked body.
        let _ = tx
            .send(Err(std::io::Error::other("connection cut mid-line")))
            .await;
        return false;
    }
    tx.send(Ok(Frame::data(line))).await.is_ok()
}

/// Consecutive events that are ready share one write, as the API server flushes a watch
/// response only when no further event is waiting. Armed faults apply line by line.
struct Writer<'a> {
    inner: &'a Inner,
    tx: &'a Tx,
    buf: BytesMut,
}

impl Writer<'_> {
    const FLUSH_AT: usize = 64 * 1024;

    async fn line(&mut self, line: Bytes) -> bool {
        let f = &self.inner.faults;
        if f.malformed.load(Ordering::SeqCst) || f.cut_line.load(Ordering::SeqCst) {
            return self.flush().await && emit(self.inner, self.tx, line).await;
        }
        self.buf.extend_from_slice(&line);
        self.buf.len() < Self::FLUSH_AT || self.flush().await
    }

    async fn flush(&mut self) -> bool {
        if self.buf.is_empty() {
            return true;
        }
        let chunk = self.buf.split().freeze();
        self.tx.send(Ok(Frame::data(chunk))).await.is_ok()
    }
}

async fn run(
    inner: &Inner,
    p: &Params,
    tx: &Tx,
    first: First,
    mut sub: broadcast::Receiver<Arc<Change>>,
    start_rv: u64,
) {
    let mut w = Writer {
        inner,
        tx,
        buf: BytesMut::new(),
    };
    match first {
        First::State(objects) => {
            for o in objects.iter().filter(|o| p.selects(o)) {
                if !w.line(watch_line("ADDED", o)).await {
                    return;
                }
            }
            if p.initial_events_end && !w.line(p.bookmark(start_rv, true)).await {
                return;
            }
        }
        First::Replay(changes) => {
            for c in &changes {
                if let Some(line) = p.translate(c) {
                    if !w.line(line).await {
                        return;
                    }
                }
            }
        }
    }
    if !w.flush().await {
        return;
    }
    let mut ticks = tokio::time::interval(inner.cfg.bookmark_interval);
    ticks.tick().await;
    loop {
        tokio::select! {
            _ = ticks.tick(), if p.bookmarks => {
                // Everything up to the store's current resourceVersion is in `sub` already (it is
                // sent under the lock); forward it before claiming that position.
                let (rv, pending, behind) = {
                    let store = inner.store.lock().expect("store lock poisoned");
                    let mut pending = Vec::new();
                    let behind = loop {
                        match sub.try_recv() {
                            Ok(c) => pending.push(c),
                            Err(broadcast::error::TryRecvError::Empty) => break false,
                            Err(_) => break true,
                        }
                    };
                    (store.rv, pending, behind)
                };
                if behind {
                    return lagged(tx).await;
                }
                for c in &pending {
                    if let Some(line) = p.translate(c) {
                        if !emit(inner, tx, line).await {
                            return;
                        }
                    }
                }
                if !emit(inner, tx, p.bookmark(rv, false)).await {
                    return;
                }
            }
            c = sub.recv() => match c {
                Ok(mut c) => loop {
                    if let Some(line) = p.translate(&c) {
                        if !w.line(line).await {
                            return;
                        }
                    }
                    match sub.try_recv() {
                        Ok(next) => c = next,
                        Err(broadcast::error::TryRecvError::Empty) => {
                            if !w.flush().await {
                                return;
                            }
                            break;
                        }
                        Err(broadcast::error::TryRecvError::Lagged(_)) => return lagged(tx).await,
                        Err(broadcast::error::TryRecvError::Closed) => return,
                    }
                },
                Err(broadcast::error::RecvError::Lagged(_)) => return lagged(tx).await,
                Err(broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}

async fn lagged(tx: &Tx) {
    let _ = tx
        .send(Err(std::io::Error::other("watcher fell too far behind")))
        .await;
}
