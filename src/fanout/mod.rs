//! One read of a collection per replica, dealt to the shards' streams.
//!
//! With sharding on, a channel read over one collection is fanned out: every shard runs its part
//! of the stream (see [`crate::config::ShardingConfig::fans`]), and the parts a replica runs
//! share one [`Hub`] per collection and query: one main watch, and one list whenever parts
//! need their state (at their start, after a 410), instead of a watch and a list per shard.
//!
//! Each part subscribes with its shard and reads, as from a `sendInitialEvents` watch of its
//! own: the current objects of its shard as ADDED lines, a bookmark ending them, then its
//! shard's live changes and every bookmark. [`board`] decides who gets which line; the hub's
//! loop performs the I/O:
//! - **Catch-up**: once parts wait (after [`JOIN_QUIET`] without another joining, at most
//!   [`JOIN_MAX`] after the first), one list of the collection serves all of them: a
//!   `sendInitialEvents` watch, or paginated lists where the server refuses it. Without a main
//!   watch, the catch-up's watch goes on as the main one (or, after pages, a watch opens from
//!   the list's resourceVersion).
//! - **Main watch**: reopened from its position when it ends, stalls or fails, so the parts'
//!   lines go on without a gap; when it cannot go on from there (a 410, an error event) every
//!   part it fed gets a 410 and relists through the next catch-up.
//! - **Heartbeats**: every [`HEARTBEAT`] a bookmark at the main watch's position goes to every
//!   live part, so a quiet shard's stream neither stalls nor falls behind.
//!
//! A part that stops reading (its outbox full, Kafka slow) holds the hub up, as a slow reader
//! holds up a watch: the replica's parts share one producer, so they slow down together.
//! Lines are shared buffers, dealt without copying; a hub holds no objects, only the lines a
//! part being listed must not miss (bounded by [`board::HELD_BYTES`]).

mod board;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::ShardingConfig;
use crate::decode::{self, Trim};
use crate::event::{comparable, EventType, WatchEvent};
use crate::kubeapi::{self, ApiError, Query, WatchFrom};
use board::{Board, Line, Out, To};

/// How long a catch-up waits for more parts to join after the last one did.
pub const JOIN_QUIET: Duration = Duration::from_millis(500);
/// How long a catch-up waits at most after the first part waiting joined.
pub const JOIN_MAX: Duration = Duration::from_secs(5);
/// How often live parts get a bookmark at the main watch's position (more often when the
/// streams' idle timeout is short).
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// Lines a part's subscription buffers before the hub waits for it.
const LINES: usize = 512;
/// The wait before trying again a request that failed.
const RETRY: Duration = Duration::from_secs(1);
/// Nothing is trimmed here: the parts trim as their channels say.
const WHOLE: Trim = Trim {
    drop_managed_fields: false,
    allow_secret_data: true,
};

/// What a hub reads: one collection under one query.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Collection {
    pub path: String,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    /// The objects' `apiVersion`, for list items that lack it.
    pub api_version: String,
}

/// How the hubs read and deal.
#[derive(Clone)]
pub struct Settings {
    pub sharding: ShardingConfig,
    pub list_page_size: u32,
    pub watch_timeout_seconds: u32,
    /// A main watch that delivered nothing for this long is reopened.
    pub idle: Duration,
}

/// The hubs of this replica, one per collection, started on their first subscriber; they stop
/// when this is dropped.
pub struct Fanouts {
    client: kube::Client,
    settings: Settings,
    hubs: Mutex<HashMap<Collection, Arc<Hub>>>,
    stop: CancellationToken,
    metrics: Arc<crate::metrics::Metrics>,
}

impl Drop for Fanouts {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A hub, as its subscribers reach it.
pub struct Hub {
    joins: mpsc::UnboundedSender<(u64, u32, mpsc::Sender<Bytes>)>,
    next: AtomicU64,
}

/// A part's lines, as a watch's: see the module's doc.
pub struct Subscription {
    rx: mpsc::Receiver<Bytes>,
}

impl Subscription {
    /// The next line; `None` once the hub let the part go (it then reads as a closed watch).
    pub async fn next_line(&mut self) -> Option<Bytes> {
        self.rx.recv().await
    }

    /// A line already received, if any.
    pub fn buffered_line(&mut self) -> Option<Bytes> {
        self.rx.try_recv().ok()
    }
}

impl Fanouts {
    pub fn new(
        client: kube::Client,
        settings: Settings,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Self {
        Self {
            client,
            settings,
            hubs: Mutex::default(),
            stop: CancellationToken::new(),
            metrics,
        }
    }

    /// Subscribes shard `shard`'s part to `collection`; its hub starts on the first call.
    pub fn subscribe(&self, collection: &Collection, shard: u32) -> Subscription {
        let hub = {
            let mut hubs = self.hubs.lock().expect("hubs lock poisoned");
            hubs.entry(collection.clone())
                .or_insert_with(|| {
                    let (joins, rx) = mpsc::unbounded_channel();
                    let reader = Reader {
                        client: self.client.clone(),
                        settings: self.settings.clone(),
                        collection: collection.clone(),
                        board: Board::default(),
                        lines: HashMap::new(),
                        kind: String::new(),
                        pages: false,
                        buf: Vec::new(),
                        watches: self.metrics.fanout_watches.clone(),
                        lists: self.metrics.fanout_lists.clone(),
                    };
                    tokio::spawn(reader.run(rx, self.stop.clone()));
                    Arc::new(Hub {
                        joins,
                        next: AtomicU64::new(0),
                    })
                })
                .clone()
        };
        let (tx, rx) = mpsc::channel(LINES);
        let id = hub.next.fetch_add(1, Ordering::Relaxed);
        // A hub that stopped (the relay stops) leaves the part with a closed subscription.
        let _ = hub.joins.send((id, shard, tx));
        Subscription { rx }
    }
}

/// Where a catch-up's lines come from.
enum Catch {
    /// A `sendInitialEvents` watch.
    Watch(kubeapi::Watch),
    /// Paginated lists, turned into lines by a task of their own.
    Pages(mpsc::Receiver<Paged>),
}

/// What the pages task sends.
enum Paged {
    Line(Bytes),
    End(String),
    Failed(ApiError),
}

/// The hub's loop and what it holds.
struct Reader {
    client: kube::Client,
    settings: Settings,
    collection: Collection,
    board: Board,
    lines: HashMap<u64, mpsc::Sender<Bytes>>,
    /// The objects' kind, learned from the first one (for the bookmarks the hub writes).
    kind: String,
    /// The server refused `sendInitialEvents`: catch-ups page.
    pages: bool,
    buf: Vec<u8>,
    watches: prometheus::IntCounter,
    lists: prometheus::IntCounter,
}

/// What a line of the collection is, for the hub.
enum Read {
    /// An object's change, or a plain bookmark: dealt.
    Dealt(Line, Option<String>),
    /// The end of a `sendInitialEvents` watch's initial state.
    End(String),
    /// An error event.
    Error(Option<u16>),
}

impl Reader {
    async fn run(
        mut self,
        mut joins: mpsc::UnboundedReceiver<(u64, u32, mpsc::Sender<Bytes>)>,
        stop: CancellationToken,
    ) {
        let mut main: Option<kubeapi::Watch> = None;
        let mut catch: Option<Catch> = None;
        let mut first_waiting: Option<Instant> = None;
        let mut last_join = Instant::now();
        let mut retry_at = Instant::now();
        let mut last_line = Instant::now();
        let mut beat = tokio::time::interval(HEARTBEAT.min(self.settings.idle / 3));
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let waiting = self.board.waiting() && catch.is_none();
            let catch_at = first_waiting
                .map_or(last_join + JOIN_QUIET, |f| {
                    (last_join + JOIN_QUIET).min(f + JOIN_MAX)
                })
                .max(retry_at);
            let reopen = main.is_none() && self.board.position().is_some();
            let out = tokio::select! {
                _ = stop.cancelled() => return,
                joined = joins.recv() => {
                    let Some((id, shard, tx)) = joined else { return };
                    self.board.join(id, shard);
                    self.lines.insert(id, tx);
                    last_join = Instant::now();
                    first_waiting.get_or_insert(last_join);
                    Vec::new()
                }
                _ = tokio::time::sleep_until(catch_at), if waiting => {
                    first_waiting = None;
                    match self.begin_catch_up().await {
                        Ok(c) => {
                            self.board.begin_catch_up();
                            catch = Some(c);
                        }
                        Err(e) => {
                            tracing::warn!(path = %self.collection.path, error = %e, "listing the collection for the shards failed; retrying");
                            retry_at = Instant::now() + RETRY;
                        }
                    }
                    Vec::new()
                }
                _ = tokio::time::sleep_until(retry_at), if reopen => {
                    let at = self.board.position().unwrap_or_default().to_string();
                    match self.open(WatchFrom::Version(&at)).await {
                        Ok(w) => {
                            main = Some(w);
                            last_line = Instant::now();
                            Vec::new()
                        }
                        Err(e @ (ApiError::Gone(_) | ApiError::Status { code: 504, .. })) => {
                            tracing::info!(path = %self.collection.path, error = %e, "the collection's watch cannot go on from its position; the shards relist");
                            self.board.gap()
                        }
                        Err(e) => {
                            tracing::warn!(path = %self.collection.path, error = %e, "reopening the collection's watch failed; retrying");
                            retry_at = Instant::now() + RETRY;
                            Vec::new()
                        }
                    }
                }
                line = next_line(&mut main), if main.is_some() => {
                    last_line = Instant::now();
                    match line {
                        Ok(Some(line)) => match self.read(&line) {
                            Read::Dealt(line, rv) => self.board.live(&line, rv.as_deref()),
                            Read::End(_) => Vec::new(),
                            Read::Error(code) => {
                                tracing::info!(path = %self.collection.path, ?code, "the collection's watch ended with an error event; the shards relist");
                                main = None;
                                self.board.gap()
                            }
                        },
                        // Ended or cut: reopened from its position.
                        Ok(None) | Err(_) => {
                            main = None;
                            Vec::new()
                        }
                    }
                }
                line = next_caught(&mut catch), if catch.is_some() => match line {
                    Paged::Line(line) => match self.read(&line) {
                        Read::Dealt(line, _) if line.to == To::All && line.rv.is_some() => Vec::new(),
                        Read::Dealt(line, _) => self.board.listed(&line),
                        Read::End(rv) => {
                            // Only without a main position: a main watch down for a moment
                            // is reopened from its own, or its live parts would miss what
                            // happened between it and the list.
                            let becomes_main = self.board.position().is_none();
                            let caught = catch.take();
                            if becomes_main {
                                if let Some(Catch::Watch(w)) = caught {
                                    main = Some(w);
                                    last_line = Instant::now();
                                }
                            }
                            self.board.caught_up(&rv, becomes_main)
                        }
                        Read::Error(code) => {
                            tracing::info!(path = %self.collection.path, ?code, "listing the collection for the shards ended with an error event; retrying");
                            catch = None;
                            self.board.catch_up_failed();
                            retry_at = Instant::now() + RETRY;
                            Vec::new()
                        }
                    },
                    Paged::End(rv) => {
                        catch = None;
                        let becomes_main = self.board.position().is_none();
                        self.board.caught_up(&rv, becomes_main)
                    }
                    Paged::Failed(e) => {
                        tracing::warn!(path = %self.collection.path, error = %e, "listing the collection for the shards failed; retrying");
                        catch = None;
                        self.board.catch_up_failed();
                        retry_at = Instant::now() + RETRY;
                        Vec::new()
                    }
                },
                _ = beat.tick() => {
                    self.lines.retain(|_, tx| !tx.is_closed());
                    let gone: Vec<u64> = self.board.ids().filter(|id| !self.lines.contains_key(id)).collect();
                    for id in gone {
                        self.board.leave(id);
                    }
                    if self.board.is_empty() {
                        // Nobody reads: nothing is held open.
                        main = None;
                        catch = None;
                        self.board.gap();
                        Vec::new()
                    } else if main.is_some() && last_line.elapsed() >= self.settings.idle {
                        tracing::warn!(path = %self.collection.path, "the collection's watch delivered nothing, not even a bookmark; reopening it");
                        main = None;
                        Vec::new()
                    } else {
                        match self.board.heartbeat() {
                            Some((live, at)) => {
                                let line = self.bookmark(&at, false);
                                live.into_iter().map(|id| Out::Send(id, line.clone())).collect()
                            }
                            None => Vec::new(),
                        }
                    }
                }
            };
            self.deliver(out).await;
        }
    }

    /// Opens a watch of the collection.
    async fn open(&self, from: WatchFrom<'_>) -> Result<kubeapi::Watch, ApiError> {
        let c = &self.collection;
        let query = Query {
            label_selector: c.label_selector.as_deref(),
            field_selector: c.field_selector.as_deref(),
        };
        let w = kubeapi::watch(
            &self.client,
            &c.path,
            &query,
            from,
            self.settings.watch_timeout_seconds,
        )
        .await;
        if w.is_ok() {
            self.watches.inc();
        }
        w
    }

    /// Starts a catch-up: a `sendInitialEvents` watch, or pages where the server refuses it.
    async fn begin_catch_up(&mut self) -> Result<Catch, ApiError> {
        self.lists.inc();
        if !self.pages {
            match self.open(WatchFrom::InitialEvents).await {
                Ok(w) => return Ok(Catch::Watch(w)),
                Err(ApiError::Status {
                    code: 400 | 403 | 422,
                    message,
                    ..
                }) => {
                    tracing::info!(path = %self.collection.path, %message, "sendInitialEvents refused; the shards' catch-ups use paginated lists");
                    self.pages = true;
                }
                Err(e) => return Err(e),
            }
        }
        let (tx, rx) = mpsc::channel(LINES);
        tokio::spawn(list_pages(
            self.client.clone(),
            self.collection.clone(),
            self.settings.list_page_size,
            tx,
        ));
        Ok(Catch::Pages(rx))
    }

    /// What `line` is, for the hub.
    fn read(&mut self, line: &Bytes) -> Read {
        let buf = std::mem::take(&mut self.buf);
        let ev = match decode::decode_line_into(line, WHOLE, buf) {
            Ok(ev) => ev,
            // Whose it is cannot be told: every part skips it (and resyncs whole later).
            Err(_) => {
                return Read::Dealt(
                    Line {
                        to: To::All,
                        rv: None,
                        bytes: line.clone(),
                    },
                    None,
                )
            }
        };
        let read = self.place(&ev, line);
        self.buf = ev.object;
        read
    }

    fn place(&mut self, ev: &WatchEvent, line: &Bytes) -> Read {
        let rv = ev.meta.resource_version();
        match ev.event_type {
            EventType::Error => Read::Error(ev.status_code),
            EventType::Bookmark if ev.initial_events_end => Read::End(rv.to_string()),
            EventType::Bookmark => Read::Dealt(
                Line {
                    to: To::All,
                    rv: comparable(rv),
                    bytes: line.clone(),
                },
                Some(rv.to_string()),
            ),
            _ => {
                if self.kind.is_empty() {
                    self.kind = ev.meta.kind().to_string();
                }
                let shard = self
                    .settings
                    .sharding
                    .shard_of_object(ev.meta.namespace(), ev.meta.name());
                Read::Dealt(
                    Line {
                        to: To::Shard(shard),
                        rv: comparable(rv),
                        bytes: line.clone(),
                    },
                    Some(rv.to_string()),
                )
            }
        }
    }

    /// A bookmark line at `rv`; with `end`, the end of a part's initial state.
    fn bookmark(&self, rv: &str, end: bool) -> Bytes {
        let mut metadata = serde_json::json!({"resourceVersion": rv});
        if end {
            metadata["annotations"] = serde_json::json!({"k8s.io/initial-events-end": "true"});
        }
        let line = serde_json::json!({
            "type": "BOOKMARK",
            "object": {"kind": self.kind, "apiVersion": self.collection.api_version, "metadata": metadata},
        });
        Bytes::from(serde_json::to_vec(&line).expect("a bookmark serializes"))
    }

    /// Performs what the board decided.
    async fn deliver(&mut self, out: Vec<Out>) {
        for o in out {
            let (id, line) = match o {
                Out::Send(id, line) => (id, line),
                Out::End(id, rv) => (id, self.bookmark(&rv, true)),
                Out::Expire(id) => {
                    if let Some(tx) = self.lines.remove(&id) {
                        let _ = tx.try_send(Bytes::from_static(EXPIRED));
                    }
                    continue;
                }
            };
            let Some(tx) = self.lines.get(&id) else {
                continue;
            };
            if tx.send(line).await.is_err() {
                self.lines.remove(&id);
                self.board.leave(id);
            }
        }
    }
}

/// The 410 a part gets when the hub cannot go on feeding it.
const EXPIRED: &[u8] = br#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the shards' shared watch of the collection cannot go on from this position","reason":"Expired","code":410}}"#;

async fn next_line(main: &mut Option<kubeapi::Watch>) -> Result<Option<Bytes>, ApiError> {
    match main {
        Some(w) => w.next_line().await,
        None => std::future::pending().await,
    }
}

async fn next_caught(catch: &mut Option<Catch>) -> Paged {
    match catch {
        Some(Catch::Watch(w)) => match w.next_line().await {
            Ok(Some(line)) => Paged::Line(line),
            Ok(None) => Paged::Failed(ApiError::Body(
                "the initial events ended before their end".into(),
            )),
            Err(e) => Paged::Failed(e),
        },
        Some(Catch::Pages(rx)) => rx
            .recv()
            .await
            .unwrap_or_else(|| Paged::Failed(ApiError::Body("the list stopped".into()))),
        None => std::future::pending().await,
    }
}

/// Lists every page of `collection` as ADDED lines, then its resourceVersion.
async fn list_pages(
    client: kube::Client,
    collection: Collection,
    page_size: u32,
    tx: mpsc::Sender<Paged>,
) {
    let query = Query {
        label_selector: collection.label_selector.as_deref(),
        field_selector: collection.field_selector.as_deref(),
    };
    let mut token: Option<String> = None;
    loop {
        let page = kubeapi::list_page(
            &client,
            &collection.path,
            &query,
            Some(page_size),
            token.as_deref(),
        )
        .await;
        let page = match page {
            Ok(p) => p,
            Err(e) => {
                let _ = tx.send(Paged::Failed(e)).await;
                return;
            }
        };
        let kind = page
            .kind
            .strip_suffix("List")
            .unwrap_or_default()
            .to_string();
        for item in &page.items {
            let type_meta = (collection.api_version.as_str(), kind.as_str());
            let line = match decode::decode_item(EventType::Added, item, WHOLE, type_meta) {
                Ok(ev) => {
                    let mut line = Vec::with_capacity(ev.object.len() + 32);
                    line.extend_from_slice(br#"{"type":"ADDED","object":"#);
                    line.extend_from_slice(&ev.object);
                    line.push(b'}');
                    line
                }
                // Passed on as it is: the part counts it and skips it.
                Err(_) => item.get().as_bytes().to_vec(),
            };
            if tx.send(Paged::Line(Bytes::from(line))).await.is_err() {
                return;
            }
        }
        match page.continue_token {
            Some(c) => token = Some(c),
            None => {
                let _ = tx.send(Paged::End(page.resource_version)).await;
                return;
            }
        }
    }
}
