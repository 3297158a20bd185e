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
//! - **The server's filter**: where the API server filters by shard (sharded list and watch)
//!   and the objects are namespaced, the main watch and every catch-up ask it only for the
//!   namespaces of their parts' shards ([`cover`], from the replica's namespaces followed by
//!   [`namespaces`]). The main watch reopens from its position to take in a joining part's
//!   shard (before that part's list, so nothing between them is missed) and, a moment after
//!   parts left, to leave theirs out. A namespace the reads did not ask for (created since)
//!   expires its shard's parts, which relist once the reads ask for it. Every object received
//!   is still dealt by its shard, whatever the server sent.
//!
//! A part that stops reading (its outbox full, Kafka slow) holds the hub up, as a slow reader
//! holds up a watch: the replica's parts share one producer, so they slow down together.
//! Lines are shared buffers, dealt without copying; a hub holds no objects, only the lines a
//! part being listed must not miss (bounded by [`board::HELD_BYTES`]).

mod board;
pub mod cover;
mod namespaces;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
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
use cover::Cover;
use namespaces::{Known, Namespaces};

/// How long a catch-up waits for more parts to join after the last one did.
pub const JOIN_QUIET: Duration = Duration::from_millis(500);
/// How long a catch-up waits at most after the first part waiting joined.
pub const JOIN_MAX: Duration = Duration::from_secs(5);
/// How often live parts get a bookmark at the main watch's position (more often when the
/// streams' idle timeout is short).
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// Lines a part's subscription buffers before the hub waits for it.
const LINES: usize = 512;
/// The first wait before trying again a request that failed; it doubles with each failure in a
/// row, up to [`RETRY_MAX`], unless the server says when to come back.
const RETRY: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);
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

/// The replica's namespaces, followed from the first hub that needs them.
struct Follow {
    client: kube::Client,
    settings: Settings,
    stop: CancellationToken,
    known: OnceLock<Known>,
}

impl Follow {
    fn known(&self) -> Known {
        self.known
            .get_or_init(|| {
                namespaces::follow(
                    self.client.clone(),
                    self.settings.sharding.clone(),
                    self.settings.watch_timeout_seconds,
                    self.stop.clone(),
                )
            })
            .clone()
    }
}

/// Whether the API server filters a collection's reads by shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Server {
    /// Not asked yet.
    Unasked,
    /// It does (its lists say so): reads ask for the replica's shards only.
    Filters,
    /// It sends everything (the gate off, or an older server), or it is not used: the hub
    /// reads whole and drops other replicas' objects.
    Whole,
}

/// How long a catch-up waits for the replica's first list of namespaces before reading whole.
const NAMESPACES_WAIT: Duration = Duration::from_secs(30);

/// The hubs of this replica, one per collection, started on their first subscriber; they stop
/// when this is dropped.
pub struct Fanouts {
    client: kube::Client,
    settings: Settings,
    hubs: Mutex<HashMap<Collection, Arc<Hub>>>,
    stop: CancellationToken,
    metrics: Arc<crate::metrics::Metrics>,
    follow: Arc<Follow>,
}

impl Drop for Fanouts {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A hub, as its subscribers reach it.
pub struct Hub {
    joins: mpsc::UnboundedSender<Seat>,
    next: AtomicU64,
}

/// A part's lines, as a watch's: see the module's doc.
pub struct Subscription {
    rx: mpsc::Receiver<Bytes>,
    /// Told when the part goes, so the hub stops asking the server for its shard at once.
    hub: mpsc::UnboundedSender<Seat>,
    id: u64,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let _ = self.hub.send(Seat::Leave(self.id));
    }
}

/// A part joining its hub (from its position, when it resumes), or leaving it.
enum Seat {
    Join(u64, u32, Option<String>, mpsc::Sender<Bytes>),
    Leave(u64),
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
        let stop = CancellationToken::new();
        let follow = Arc::new(Follow {
            client: client.clone(),
            settings: settings.clone(),
            stop: stop.clone(),
            known: OnceLock::new(),
        });
        Self {
            client,
            settings,
            hubs: Mutex::default(),
            stop,
            metrics,
            follow,
        }
    }

    /// Subscribes shard `shard`'s part to `collection`; its hub starts on the first call.
    /// Without `from`, the part reads its initial state first (a catch-up); with it, the part
    /// resumes: it reads every change of its shard after that position, as a watch from there
    /// would, or a 410 when the server no longer holds it.
    pub fn subscribe(
        &self,
        collection: &Collection,
        shard: u32,
        from: Option<&str>,
    ) -> Subscription {
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
                        own: self.metrics.fanout_objects.with_label_values(&["own"]),
                        other: self.metrics.fanout_objects.with_label_values(&["other"]),
                        filtered: self.metrics.fanout_server_filtered.clone(),
                        server: if self.settings.sharding.server_ranges {
                            Server::Unasked
                        } else {
                            Server::Whole
                        },
                        follow: self.follow.clone(),
                        known: None,
                        main_cover: None,
                        catch_cover: None,
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
        let _ = hub
            .joins
            .send(Seat::Join(id, shard, from.map(str::to_string), tx));
        Subscription {
            rx,
            hub: hub.joins.clone(),
            id,
        }
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
    /// Objects received of this replica's shards, and of others'.
    own: prometheus::IntCounter,
    other: prometheus::IntCounter,
    filtered: prometheus::IntGauge,
    server: Server,
    follow: Arc<Follow>,
    /// The replica's namespaces, once the server filters.
    known: Option<Known>,
    /// The shards the main watch and the running catch-up asked the server for, and the
    /// ranges that cover them; `None` for a read of the whole collection.
    main_cover: Option<(BTreeSet<u32>, Cover)>,
    catch_cover: Option<(BTreeSet<u32>, Cover)>,
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
    async fn run(mut self, mut joins: mpsc::UnboundedReceiver<Seat>, stop: CancellationToken) {
        let mut main: Option<kubeapi::Watch> = None;
        let mut catch: Option<Catch> = None;
        let mut first_waiting: Option<Instant> = None;
        let mut last_join = Instant::now();
        let mut retry_at = Instant::now();
        // Failures in a row of the hub's requests, for the backoff.
        let mut failures = 0u32;
        let backoff = |failures: &mut u32, e: &ApiError| {
            *failures = failures.saturating_add(1);
            let doubled = RETRY.saturating_mul(1 << (*failures - 1).min(5));
            Instant::now() + e.retry_after().unwrap_or(doubled.min(RETRY_MAX))
        };
        let mut last_line = Instant::now();
        // When the main watch, asking the server for shards no part reads any more, reopens
        // for the others only (a moment after the last one left, should more leave at once).
        let mut narrow_at: Option<Instant> = None;
        let mut beat = tokio::time::interval(HEARTBEAT.min(self.settings.idle / 3));
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let waiting = self.board.waiting() && catch.is_none();
            let catch_at = first_waiting
                .map_or(last_join + JOIN_QUIET, |f| {
                    (last_join + JOIN_QUIET).min(f + JOIN_MAX)
                })
                .max(retry_at);
            // The main watch (re)opens from where it must serve: its own position, or below it
            // for parts resuming (once joins are quiet, as for a catch-up).
            let resuming = self.board.resuming();
            let reopen = resuming || (main.is_none() && self.board.position().is_some());
            let reopen_at = if resuming { catch_at } else { retry_at };
            let out = tokio::select! {
                _ = stop.cancelled() => return,
                seat = joins.recv() => {
                    match seat {
                        None => return,
                        Some(Seat::Join(id, shard, from, tx)) => {
                            self.lines.insert(id, tx);
                            last_join = Instant::now();
                            first_waiting.get_or_insert(last_join);
                            let out = self.board.join(id, shard, from.as_deref());
                            self.deliver(out).await;
                        }
                        Some(Seat::Leave(id)) => {
                            self.board.leave(id);
                            self.lines.remove(&id);
                            if self.asks_too_much() {
                                narrow_at.get_or_insert(Instant::now() + JOIN_QUIET);
                            }
                        }
                    }
                    Vec::new()
                }
                _ = tokio::time::sleep_until(narrow_at.unwrap_or_else(Instant::now)), if narrow_at.is_some() => {
                    narrow_at = None;
                    if self.asks_too_much() && !self.board.is_empty() {
                        main = None;
                    }
                    Vec::new()
                }
                _ = tokio::time::sleep_until(catch_at), if waiting => {
                    first_waiting = None;
                    let shards = self.board.waiting_shards();
                    match self.begin_catch_up(&shards).await {
                        Ok(c) => {
                            // A main watch that the server filters for other shards reopens
                            // with these too, from its position: below the list's.
                            if self.main_cover.as_ref().is_some_and(|(m, _)| !shards.is_subset(m)) {
                                main = None;
                            }
                            self.board.begin_catch_up();
                            catch = Some(c);
                        }
                        Err(e) => {
                            tracing::warn!(path = %self.collection.path, error = %e, "listing the collection for the shards failed; retrying");
                            retry_at = backoff(&mut failures, &e);
                        }
                    }
                    Vec::new()
                }
                _ = tokio::time::sleep_until(reopen_at), if reopen => {
                    // A main watch still running is closed: the new one starts at or below it.
                    main = None;
                    match self.board.reopen_from() {
                        None => Vec::new(),
                        Some(at) => {
                            let shards = self.board.shards();
                            let cover = self.cover(&shards).await;
                            match self.open(WatchFrom::Version(&at), cover.as_ref()).await {
                                Ok(w) => {
                                    main = Some(w);
                                    self.main_cover = cover.map(|c| (shards, c));
                                    last_line = Instant::now();
                                    failures = 0;
                                    self.board.opened(&at)
                                }
                                Err(e @ ApiError::Gone(_)) => {
                                    tracing::info!(path = %self.collection.path, %at, error = %e, "the collection's watch cannot go on from this position; the shards that needed it relist");
                                    self.board.reopen_gone(&at)
                                }
                                // The server's cache has not reached the position (another API
                                // server's): it will; nothing is relisted for it.
                                Err(e) => {
                                    tracing::warn!(path = %self.collection.path, %at, error = %e, "reopening the collection's watch failed; retrying");
                                    retry_at = backoff(&mut failures, &e);
                                    Vec::new()
                                }
                            }
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
                            let cover = self.catch_cover.take();
                            if becomes_main {
                                if let Some(Catch::Watch(w)) = caught {
                                    main = Some(w);
                                    self.main_cover = cover;
                                    last_line = Instant::now();
                                }
                            }
                            self.board.caught_up(&rv, becomes_main)
                        }
                        Read::Error(code) => {
                            tracing::info!(path = %self.collection.path, ?code, "listing the collection for the shards ended with an error event; its shards sync again");
                            catch = None;
                            self.catch_cover = None;
                            retry_at = Instant::now() + RETRY;
                            self.board.catch_up_failed()
                        }
                    },
                    Paged::End(rv) => {
                        catch = None;
                        self.catch_cover = None;
                        let becomes_main = self.board.position().is_none();
                        self.board.caught_up(&rv, becomes_main)
                    }
                    Paged::Failed(e) => {
                        tracing::warn!(path = %self.collection.path, error = %e, "listing the collection for the shards failed; its shards sync again");
                        catch = None;
                        self.catch_cover = None;
                        retry_at = backoff(&mut failures, &e);
                        self.board.catch_up_failed()
                    }
                },
                _ = namespaces_changed(&mut self.known) => {
                    let missed = self.missed();
                    if missed.is_empty() {
                        Vec::new()
                    } else {
                        tracing::info!(path = %self.collection.path, ?missed, "namespaces the API server was not asked for: the shards of them relist");
                        self.board.missed(&missed)
                    }
                }
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
                        self.catch_cover = None;
                        self.board.gap();
                        Vec::new()
                    } else if main.is_some() && last_line.elapsed() >= self.settings.idle {
                        tracing::warn!(path = %self.collection.path, "the collection's watch delivered nothing, not even a bookmark; reopening it");
                        main = None;
                        Vec::new()
                    } else if main.is_none() {
                        // No bookmark while no main watch runs: a part that hears nothing for
                        // its idle timeout stalls, and says so, rather than look healthy.
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

    /// Opens a watch of the collection, of the namespaces in `cover` only when given.
    async fn open(
        &self,
        from: WatchFrom<'_>,
        cover: Option<&Cover>,
    ) -> Result<kubeapi::Watch, ApiError> {
        let c = &self.collection;
        let selector = cover.map(Cover::selector);
        let query = Query {
            label_selector: c.label_selector.as_deref(),
            field_selector: c.field_selector.as_deref(),
            shard_selector: selector.as_deref(),
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

    /// Starts a catch-up of `shards`: a `sendInitialEvents` watch, or pages where the server
    /// refuses it.
    async fn begin_catch_up(&mut self, shards: &BTreeSet<u32>) -> Result<Catch, ApiError> {
        let cover = self.cover(shards).await;
        self.catch_cover = None;
        self.lists.inc();
        if !self.pages {
            match self.open(WatchFrom::InitialEvents, cover.as_ref()).await {
                Ok(w) => {
                    self.catch_cover = cover.map(|c| (shards.clone(), c));
                    return Ok(Catch::Watch(w));
                }
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
            cover.as_ref().map(Cover::selector),
            self.settings.list_page_size,
            tx,
        ));
        self.catch_cover = cover.map(|c| (shards.clone(), c));
        Ok(Catch::Pages(rx))
    }

    /// The ranges to ask the server for, to read the objects of `shards`: `None` to read the
    /// whole collection (a cluster-scoped one, a server that does not filter, namespaces not
    /// known). The server is asked once whether it filters.
    async fn cover(&mut self, shards: &BTreeSet<u32>) -> Option<Cover> {
        if self.server == Server::Unasked {
            match self.probe().await {
                // An empty collection: asked again at the next read.
                Ok(None) => return None,
                Ok(Some(true)) => {
                    tracing::info!(path = %self.collection.path, "the API server filters by shard: this replica reads only its shards' namespaces");
                    self.server = Server::Filters;
                    self.filtered.inc();
                    self.known = Some(self.follow.known());
                }
                Ok(Some(false)) => {
                    tracing::info!(path = %self.collection.path, "the API server does not filter this collection by namespace (not namespaced, or no sharded lists and watches): this replica reads it whole and keeps its shards' objects");
                    self.server = Server::Whole;
                }
                Err(e) => {
                    tracing::warn!(path = %self.collection.path, error = %e, "asking the API server whether it filters by shard failed; reading whole this time");
                    return None;
                }
            }
        }
        let known = self.known.as_mut()?;
        let _ = tokio::time::timeout(
            NAMESPACES_WAIT,
            known.wait_for(|n| *n != Namespaces::Listing),
        )
        .await;
        let cover = match &*known.borrow_and_update() {
            Namespaces::Known(points) => {
                let c = Cover::of(points, shards, cover::MAX_RANGES);
                tracing::debug!(path = %self.collection.path, shards = shards.len(), ranges = c.len(), "asking the API server for the shards' namespaces");
                Some(c)
            }
            Namespaces::Listing => None,
            Namespaces::Unavailable => {
                self.server = Server::Whole;
                self.filtered.dec();
                None
            }
        };
        if self.server == Server::Whole {
            self.known = None;
        }
        cover
    }

    /// Whether the main watch asks the server for a shard no part reads any more.
    fn asks_too_much(&self) -> bool {
        self.main_cover
            .as_ref()
            .is_some_and(|(m, _)| m.iter().any(|k| !self.board.has_shard(*k)))
    }

    /// Whether the server filters this collection's objects by namespace: they are namespaced
    /// and it applies a `shardSelector`. One short list asking for the whole space, which a
    /// server that filters answers with its `shardInfo`; `None` when it holds no object to tell
    /// whether they are namespaced.
    async fn probe(&self) -> Result<Option<bool>, ApiError> {
        #[derive(serde::Deserialize)]
        struct Item {
            metadata: Md,
        }
        #[derive(serde::Deserialize)]
        struct Md {
            #[serde(default)]
            namespace: Option<String>,
        }
        let c = &self.collection;
        let everything = Cover::everything().selector();
        let query = Query {
            label_selector: c.label_selector.as_deref(),
            field_selector: c.field_selector.as_deref(),
            shard_selector: Some(&everything),
        };
        match kubeapi::list_page(&self.client, &c.path, &query, Some(1), None).await {
            Ok(page) => {
                let Some(item) = page.items.first() else {
                    return Ok(None);
                };
                let item: Item = serde_json::from_str(item.get())?;
                let namespaced = item.metadata.namespace.is_some_and(|n| !n.is_empty());
                Ok(Some(page.sharded && namespaced))
            }
            // A server that knows the parameter and refuses it.
            Err(ApiError::Status {
                code: 400 | 422, ..
            }) => Ok(Some(false)),
            Err(e) => Err(e),
        }
    }

    /// The shards whose namespaces the running reads were not asked for, given the
    /// namespaces known now; they are no longer counted as asked for.
    fn missed(&mut self) -> BTreeSet<u32> {
        let Some(known) = self.known.as_mut() else {
            return BTreeSet::new();
        };
        let Namespaces::Known(points) = known.borrow_and_update().clone() else {
            return BTreeSet::new();
        };
        let mut missed = BTreeSet::new();
        for (shards, c) in [&mut self.main_cover, &mut self.catch_cover]
            .into_iter()
            .flatten()
        {
            let lost = cover::uncovered(&points, shards, c);
            shards.retain(|k| !lost.contains(k));
            missed.extend(lost);
        }
        missed
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
                if self.board.has_shard(shard) {
                    self.own.inc();
                } else {
                    self.other.inc();
                }
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

async fn namespaces_changed(known: &mut Option<Known>) {
    if let Some(k) = known {
        if k.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

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
    shard_selector: Option<String>,
    page_size: u32,
    tx: mpsc::Sender<Paged>,
) {
    // Sent with every page: the server filters each page it is asked for.
    let query = Query {
        label_selector: collection.label_selector.as_deref(),
        field_selector: collection.field_selector.as_deref(),
        shard_selector: shard_selector.as_deref(),
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
