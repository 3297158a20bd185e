//! One read of a collection per replica, dealt to the shards' streams.
//!
//! With sharding on, a channel read over one collection is fanned out: every shard runs its part
//! of the stream (see [`crate::config::ShardingConfig::fans`]), and the parts a replica runs
//! share one hub per collection and query: one main watch, and one list whenever parts
//! need their state (at their start, after a 410), instead of a watch and a list per shard.
//!
//! Each part subscribes with its shard and reads, as from a `sendInitialEvents` watch of its
//! own: the current objects of its shard as ADDED lines, a bookmark ending them, then its
//! shard's live changes and every bookmark. [`board`] decides who gets which line; the hub's
//! loop performs the I/O:
//! - **Catch-up**: once parts wait (after [`JOIN_QUIET`] without another joining, at most
//!   [`JOIN_MAX`] after the first; while shards claimed here are still starting their streams
//!   ([`Fanouts::starting`]), until they have, at most [`START_MAX`] after the first), one
//!   list of the collection serves all of them: a
//!   `sendInitialEvents` watch, or paginated lists where the server refuses it. Without a main
//!   watch, the catch-up's watch goes on as the main one (or, after pages, a watch opens from
//!   the list's resourceVersion).
//! - **Main watch**: reopened from its position when it ends, stalls or fails, so the parts'
//!   lines go on without a gap; when it cannot go on from there (a 410, an error event) every
//!   part it fed gets a 410 and relists through the next catch-up.
//! - **Resumes**: a part with a position (a shard claimed from another replica, a watch cut, a
//!   failed delivery) joins at it, and the main watch is reopened from the lowest position it
//!   must serve (after [`RESUME_QUIET`] without another joining); each part gets only the
//!   lines above what it holds. Only a position the server
//!   no longer holds (410) makes a part relist. [`hub`] decides when the reads open, close and
//!   retry; this module's loop performs its effects.
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
//! A part that stops reading (its outbox full, its records behind a stalled partition) holds
//! up no other part: its lines queue, and go out in order once it reads again ([`backlog`]).
//! One that queues too much is let go (its subscription closed) and resumes from its position
//! later. When every part stops reading (Kafka slow for the whole replica), the hub stops
//! reading too, as a slow reader holds up a watch. A list is not queued: a part being listed
//! that stops reading holds its catch-up up, for [`SLOW_LIST`] at most before it is let go.
//! Lines are shared buffers, dealt without copying; a hub holds no objects, only the lines a
//! part being listed must not miss (bounded by [`board::HELD_BYTES`] a part and
//! [`board::HUB_HELD_BYTES`] a hub, past which the part holding the most drops them and,
//! once its list ends, resumes from the list's position: it never lists again for it).

mod backlog;
mod board;
pub mod cover;
mod hub;
mod namespaces;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, PollSender};

use crate::config::ShardingConfig;
use crate::decode::{self, Trim};
use crate::event::{comparable, EventType, WatchEvent};
use crate::kubeapi::{self, ApiError, Query, WatchFrom};
use board::{Line, Out, To};
use cover::{Cover, Points};
use hub::{Effect, Input};
use namespaces::{Known, Namespaces};

/// How long a catch-up waits for more parts to join after the last one did.
pub const JOIN_QUIET: Duration = Duration::from_millis(500);
/// How long a reopen for resuming parts waits for more to join after the last one did: the
/// parts of shards claimed together (a replica's shards after it died) join within a few tens
/// of milliseconds of each other, and each waits for the reopen before its first line.
pub const RESUME_QUIET: Duration = Duration::from_millis(100);
/// How long a catch-up waits at most after the first part waiting joined.
pub const JOIN_MAX: Duration = Duration::from_secs(5);
/// How long a catch-up waits at most after the first part waiting joined while shards claimed
/// by the replica are still starting their streams ([`Fanouts::starting`]).
pub const START_MAX: Duration = Duration::from_secs(30);
/// How often live parts get a bookmark at the main watch's position (more often when the
/// streams' idle timeout is short).
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// Lines a part's subscription buffers before its lines queue in the hub ([`backlog`]).
const LINES: usize = 512;
/// The first wait before trying again a request that failed; it doubles with each failure in a
/// row, up to [`RETRY_MAX`], unless the server says when to come back.
const RETRY: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// How long a part being listed may hold up its catch-up with no room before it is let go.
const SLOW_LIST: Duration = Duration::from_secs(30);
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

/// How long a hub's first read waits for the replica's first list of namespaces before reading
/// whole (later reads do not wait).
const NAMESPACES_WAIT: Duration = Duration::from_secs(30);

/// How long a read for parts that change hands waits for its fresh list of namespaces before
/// reading whole.
const FRESH_LIST: Duration = Duration::from_secs(10);

/// The hubs of this replica, one per collection, started on their first subscriber; they stop
/// when this is dropped.
pub struct Fanouts {
    client: kube::Client,
    settings: Settings,
    hubs: Mutex<HashMap<Collection, Arc<HubHandle>>>,
    stop: CancellationToken,
    metrics: Arc<crate::metrics::Metrics>,
    follow: Arc<Follow>,
    /// Shards claimed here still starting their streams.
    starting: Arc<watch::Sender<usize>>,
}

/// A shard claimed by the replica, starting its streams: while one counts, the hubs' catch-ups
/// wait for its parts to join, so that the shards claimed together are read once. Dropped once
/// the shard's streams are started, or its term ends first; a shard that takes longer than
/// [`START_MAX`] (its term retrying against a Kafka or an API server that refuses) stops
/// counting then, so that it holds no catch-up of the others' longer.
pub struct Starting(Arc<Mark>);

/// What a [`Starting`] and its expiry share: whether it still counts.
struct Mark {
    counts: AtomicBool,
    starting: Arc<watch::Sender<usize>>,
}

impl Mark {
    fn end(&self) {
        if self.counts.swap(false, Ordering::Relaxed) {
            self.starting.send_modify(|n| *n = n.saturating_sub(1));
        }
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        self.0.end();
    }
}

impl Drop for Fanouts {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A hub, as its subscribers reach it.
pub struct HubHandle {
    joins: mpsc::UnboundedSender<Seat>,
    next: AtomicU64,
}

/// A part's lines, as a watch's: see the module's doc.
pub struct Subscription {
    rx: mpsc::Receiver<Bytes>,
    /// Set by the hub when it expires the part: once its lines are read, it reads a 410 (even
    /// when the 410 did not fit in its buffer), never a plain end it would resume after.
    expired: Arc<AtomicBool>,
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
    Join(u64, u32, Option<String>, Lines),
    Leave(u64),
}

/// The hub's end of a part's subscription.
struct Lines {
    tx: mpsc::Sender<Bytes>,
    expired: Arc<AtomicBool>,
    /// While the seat is stalled: waits for room in its subscription.
    room: Option<PollSender<Bytes>>,
}

impl Subscription {
    /// The next line; `None` once the hub let the part go (it then reads as a closed watch,
    /// resumed from where it read), a 410 once the hub expired it.
    pub async fn next_line(&mut self) -> Option<Bytes> {
        match self.rx.recv().await {
            Some(line) => Some(line),
            None if self.expired.swap(false, Ordering::Relaxed) => {
                Some(Bytes::from_static(EXPIRED))
            }
            None => None,
        }
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
            starting: Arc::new(watch::Sender::new(0)),
        }
    }

    /// Marks a shard claimed by the replica as starting its streams, until the mark is dropped
    /// or [`START_MAX`] passed.
    pub fn starting(&self) -> Starting {
        self.starting.send_modify(|n| *n += 1);
        let mark = Arc::new(Mark {
            counts: AtomicBool::new(true),
            starting: self.starting.clone(),
        });
        let expiry = Arc::downgrade(&mark);
        tokio::spawn(async move {
            tokio::time::sleep(START_MAX).await;
            if let Some(mark) = expiry.upgrade() {
                mark.end();
            }
        });
        Starting(mark)
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
                        hub: hub::Hub::new(
                            hub::Timing {
                                join_quiet: JOIN_QUIET,
                                resume_quiet: RESUME_QUIET,
                                join_max: JOIN_MAX,
                                start_max: START_MAX,
                                retry: RETRY,
                                retry_max: RETRY_MAX,
                                idle: self.settings.idle,
                                // Parts waiting for the list hear nothing meanwhile: well within
                                // their idle timeout.
                                slow_list: SLOW_LIST.min(self.settings.idle / 2),
                            },
                            Instant::now(),
                        ),
                        lines: HashMap::new(),
                        main: None,
                        catch: None,
                        kind: String::new(),
                        pages: false,
                        buf: Vec::new(),
                        watches: self.metrics.fanout_watches.clone(),
                        lists: self.metrics.fanout_lists.clone(),
                        own: self.metrics.fanout_objects.with_label_values(&["own"]),
                        other: self.metrics.fanout_objects.with_label_values(&["other"]),
                        filtered: self.metrics.fanout_server_filtered.clone(),
                        let_go: self.metrics.fanout_parts_let_go.clone(),
                        server: if self.settings.sharding.server_ranges {
                            Server::Unasked
                        } else {
                            Server::Whole
                        },
                        follow: self.follow.clone(),
                        known: None,
                        whole_until: None,
                        waited: false,
                        unlisted: false,
                        starting: self.starting.subscribe(),
                    };
                    tokio::spawn(reader.run(rx, self.stop.clone()));
                    Arc::new(HubHandle {
                        joins,
                        next: AtomicU64::new(0),
                    })
                })
                .clone()
        };
        let (tx, rx) = mpsc::channel(LINES);
        let expired = Arc::new(AtomicBool::new(false));
        let id = hub.next.fetch_add(1, Ordering::Relaxed);
        // A hub that stopped (the relay stops) leaves the part with a closed subscription.
        let lines = Lines {
            tx,
            expired: expired.clone(),
            room: None,
        };
        let _ = hub
            .joins
            .send(Seat::Join(id, shard, from.map(str::to_string), lines));
        Subscription {
            rx,
            expired,
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

/// The hub's loop: it performs what [`hub::Hub`] decides and tells it what happened.
struct Reader {
    client: kube::Client,
    settings: Settings,
    collection: Collection,
    hub: hub::Hub,
    lines: HashMap<u64, Lines>,
    /// The main watch and the running catch-up, when they run.
    main: Option<kubeapi::Watch>,
    catch: Option<Catch>,
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
    let_go: prometheus::IntCounter,
    server: Server,
    follow: Arc<Follow>,
    /// The replica's namespaces, once the server filters.
    known: Option<Known>,
    /// A watch from a position before the replica's first list of namespaces reads whole (what
    /// was removed before that list is not known): the position past which it is reopened
    /// narrowed to the shards.
    whole_until: Option<u64>,
    /// The follower's first list was waited for (once per hub).
    waited: bool,
    /// The main watch reads whole because the follower had not listed yet: it is reopened
    /// narrowed once it has.
    unlisted: bool,
    /// How many shards claimed here are starting their streams.
    starting: watch::Receiver<usize>,
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
        let mut beat = tokio::time::interval(HEARTBEAT.min(self.settings.idle / 3));
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let starting = *self.starting.borrow_and_update() > 0;
        self.feed(Input::Starting(starting)).await;
        loop {
            let deadline = self.hub.deadline();
            let (main_paused, catch_paused) = (self.hub.main_paused(), self.hub.catch_paused());
            let stalled: Vec<u64> = self.hub.stalled_ids().collect();
            let input = tokio::select! {
                _ = stop.cancelled() => return,
                seat = joins.recv() => match seat {
                    None => return,
                    Some(Seat::Join(id, shard, from, tx)) => {
                        self.lines.insert(id, tx);
                        Input::Join { id, shard, from }
                    }
                    Some(Seat::Leave(id)) => {
                        self.lines.remove(&id);
                        Input::Leave(id)
                    }
                },
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => Input::Due,
                id = room(&mut self.lines, &stalled), if !stalled.is_empty() => match self.lines.get(&id) {
                    // As many of its lines as fit go out (the hub is its only sender).
                    Some(l) if !l.tx.is_closed() => Input::Room { id, free: l.tx.capacity().max(1) },
                    _ => {
                        self.lines.remove(&id);
                        Input::Leave(id)
                    }
                },
                line = next_line(&mut self.main), if self.main.is_some() && !main_paused => match line {
                    Ok(Some(line)) => match self.read(&line) {
                        Read::Dealt(line, rv) => Input::Main(line, rv),
                        Read::End(_) => continue,
                        Read::Error(code) => {
                            tracing::info!(path = %self.collection.path, ?code, "the collection's watch ended with an error event; the shards relist");
                            Input::MainError
                        }
                    },
                    // Ended or cut: reopened from its position.
                    Ok(None) | Err(_) => Input::MainEnded,
                },
                line = next_caught(&mut self.catch), if self.catch.is_some() && !catch_paused => match line {
                    Paged::Line(line) => match self.read(&line) {
                        Read::Dealt(line, _) => Input::Listed(line),
                        Read::End(rv) => Input::CaughtUp { rv, watch: true },
                        Read::Error(code) => {
                            tracing::info!(path = %self.collection.path, ?code, "listing the collection for the shards ended with an error event; its shards sync again");
                            Input::CatchFailed { begun: true, retry_after: None }
                        }
                    },
                    Paged::End(rv) => Input::CaughtUp { rv, watch: false },
                    Paged::Failed(e) => {
                        tracing::warn!(path = %self.collection.path, error = %e, "listing the collection for the shards failed; its shards sync again");
                        Input::CatchFailed { begun: true, retry_after: e.retry_after() }
                    }
                },
                points = namespaces_changed(&mut self.known) => Input::Namespaces(points),
                Ok(()) = self.starting.changed() => Input::Starting(*self.starting.borrow_and_update() > 0),
                _ = beat.tick() => {
                    self.lines.retain(|_, l| !l.tx.is_closed());
                    let gone = self.hub.board().ids().filter(|id| !self.lines.contains_key(id)).collect();
                    Input::Beat { gone }
                }
            };
            let narrow = match (&input, self.whole_until) {
                (Input::Main(_, Some(rv)), Some(until)) => {
                    comparable(rv).is_some_and(|rv| rv >= until)
                }
                // Read whole while the follower had not listed: it has now.
                (Input::Namespaces(_), _) => std::mem::take(&mut self.unlisted),
                _ => false,
            };
            self.feed(input).await;
            if narrow && self.main.is_some() {
                tracing::debug!(path = %self.collection.path, "the watch has passed the first list of namespaces: reopened for the shards' namespaces only");
                self.read_whole_until(None);
                self.main = None;
                self.feed(Input::MainEnded).await;
            }
        }
    }

    /// Tells the hub `input` and performs its effects, telling it their results in turn.
    async fn feed(&mut self, input: Input) {
        let mut todo: VecDeque<Effect> = self.hub.step(input, Instant::now()).into();
        while let Some(effect) = todo.pop_front() {
            let Some(result) = self.perform(effect).await else {
                continue;
            };
            // Their results' effects come first.
            for e in self.hub.step(result, Instant::now()).into_iter().rev() {
                todo.push_front(e);
            }
        }
    }

    /// Performs `effect`; what came of it, when the hub must know.
    async fn perform(&mut self, effect: Effect) -> Option<Input> {
        match effect {
            Effect::Seat(out) => self.deliver(out, false),
            Effect::Drain(out) => self.deliver(out, true),
            Effect::LetGo(id) => {
                tracing::info!(path = %self.collection.path, seat = id, "a part fell behind the collection's watch: let go (it resumes from its position, or relists when cut in its list)");
                self.lines.remove(&id);
                self.let_go.inc();
                None
            }
            // A part with no room for a heartbeat has lines to read: it is not waited for.
            Effect::Bookmark(beats) => {
                for (id, at) in beats {
                    let line = self.bookmark(&at, false);
                    if let Some(l) = self.lines.get(&id) {
                        let _ = l.tx.try_send(line);
                    }
                }
                None
            }
            Effect::CloseMain => {
                self.main = None;
                None
            }
            Effect::CloseCatch => {
                self.catch = None;
                None
            }
            Effect::Silent => {
                tracing::warn!(path = %self.collection.path, "the collection's watch delivered nothing, not even a bookmark; reopening it");
                None
            }
            Effect::Missed(missed) => {
                tracing::info!(path = %self.collection.path, ?missed, "namespaces the API server was not asked for: the shards of them relist");
                None
            }
            Effect::CatchBecomesMain => {
                match self.catch.take() {
                    Some(Catch::Watch(w)) => self.main = Some(w),
                    // Pages do not go on: the hub reopens from the list's position.
                    _ => return Some(Input::MainEnded),
                }
                None
            }
            Effect::Open { from, shards } => {
                let cover = self.cover(&shards, Some(&from)).await;
                Some(
                    match self.open(WatchFrom::Version(&from), cover.as_ref()).await {
                        Ok(w) => {
                            self.main = Some(w);
                            Input::Opened {
                                at: from,
                                asked: cover.map(|c| (shards, c)),
                            }
                        }
                        Err(e @ ApiError::Gone(_)) => {
                            tracing::info!(path = %self.collection.path, at = %from, error = %e, "the collection's watch cannot go on from this position; the shards that needed it relist");
                            Input::OpenFailed {
                                at: from,
                                gone: true,
                                retry_after: None,
                            }
                        }
                        // A 504 (the server's cache has not reached the position, another
                        // API server's) is tried again like any failure: nothing relists.
                        Err(e) => {
                            tracing::warn!(path = %self.collection.path, at = %from, error = %e, "opening the collection's watch failed; retrying");
                            Input::OpenFailed {
                                at: from,
                                gone: false,
                                retry_after: e.retry_after(),
                            }
                        }
                    },
                )
            }
            Effect::BeginCatchUp { shards } => Some(match self.begin_catch_up(&shards).await {
                Ok((catch, asked)) => {
                    self.catch = Some(catch);
                    Input::CatchBegun { asked }
                }
                Err(e) => {
                    tracing::warn!(path = %self.collection.path, error = %e, "listing the collection for the shards failed; retrying");
                    Input::CatchFailed {
                        begun: false,
                        retry_after: e.retry_after(),
                    }
                }
            }),
        }
    }

    /// Opens a watch of the collection, of the namespaces in `cover` only when given.
    async fn open(
        &mut self,
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
    /// refuses it; with what it asked the server for.
    async fn begin_catch_up(
        &mut self,
        shards: &BTreeSet<u32>,
    ) -> Result<(Catch, hub::Asked), ApiError> {
        let cover = self.cover(shards, None).await;
        self.lists.inc();
        if !self.pages {
            match self.open(WatchFrom::InitialEvents, cover.as_ref()).await {
                Ok(w) => return Ok((Catch::Watch(w), cover.map(|c| (shards.clone(), c)))),
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
        Ok((Catch::Pages(rx), cover.map(|c| (shards.clone(), c))))
    }

    /// The ranges to ask the server for, to read the objects of `shards` from `from` (`None`:
    /// from now, a catch-up): `None` to read the whole collection (a cluster-scoped one, a
    /// server that does not filter, namespaces not known). The server is asked once whether it
    /// filters.
    ///
    /// A read from a position also asks for the namespaces removed lately, and reads whole
    /// from a position before the follower's first list, which cannot know what was removed
    /// before it (see [`namespaces`]). A read for parts
    /// that change hands (a catch-up, or a watch opened from another position than the main
    /// one's: resuming parts) also asks for every namespace a list of them finds now, which
    /// the follower may not have seen yet: left out, their objects would be missing from the
    /// read, and a catch-up would take them for deleted. That list holds the hub's loop for
    /// [`FRESH_LIST`] at most; past it, or failed, the read is whole.
    async fn cover(&mut self, shards: &BTreeSet<u32>, from: Option<&str>) -> Option<Cover> {
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
        // Waited for once, by the hub's first read, which no part reads yet: a follower that
        // cannot list holds up no later read (those read whole until it lists).
        if !std::mem::replace(&mut self.waited, true) {
            let _ = tokio::time::timeout(
                NAMESPACES_WAIT,
                known.wait_for(|n| *n != Namespaces::Listing),
            )
            .await;
        }
        let (points, whole_until) = match &*known.borrow_and_update() {
            Namespaces::Known(names) => {
                self.unlisted = false;
                let ask = names.to_ask(from, Instant::now());
                // A watch from a position before the first list of namespaces: narrowed once
                // its position passes it.
                let until = ask.is_none().then(|| names.listed_at.unwrap_or(u64::MAX));
                (ask, from.is_some().then_some(until))
            }
            // Not listed yet: a main watch reads whole until the follower's first list.
            Namespaces::Listing => {
                self.unlisted = from.is_some();
                (None, from.is_some().then_some(Some(u64::MAX)))
            }
            Namespaces::Unavailable => {
                self.server = Server::Whole;
                // Already counted out while a read was whole for its age.
                if self.whole_until.take().is_none() {
                    self.filtered.dec();
                }
                (None, None)
            }
        };
        if let Some(until) = whole_until {
            self.read_whole_until(until);
        }
        if self.server == Server::Whole {
            self.known = None;
        }
        let mut points = points?;
        if from.is_none() || from != self.hub.board().position() {
            let listed = tokio::time::timeout(
                FRESH_LIST,
                namespaces::list_points(&self.client, &self.settings.sharding),
            )
            .await
            .unwrap_or_else(|_| {
                Err(ApiError::Body(format!(
                    "no answer within {} s",
                    FRESH_LIST.as_secs()
                )))
            });
            match listed {
                Ok(now) => {
                    let before = points.len();
                    points.extend(now);
                    points.sort_unstable();
                    points.dedup();
                    if points.len() > before {
                        tracing::debug!(path = %self.collection.path, namespaces = points.len() - before, "namespaces the follower had not seen yet are asked for too");
                    }
                }
                Err(e) => {
                    tracing::warn!(path = %self.collection.path, error = %e, "listing the namespaces for parts that change hands failed; reading whole this time");
                    return None;
                }
            }
        }
        let c = Cover::of(&points, shards, cover::MAX_RANGES);
        tracing::debug!(path = %self.collection.path, shards = shards.len(), ranges = c.len(), "asking the API server for the shards' namespaces");
        Some(c)
    }

    /// Whether the main watch being opened reads whole for its position's age, and past which
    /// position (`until`) it may be narrowed; the gauge of filtered collections leaves the
    /// collection out meanwhile.
    fn read_whole_until(&mut self, until: Option<u64>) {
        match (self.whole_until.is_some(), until.is_some()) {
            (false, true) => self.filtered.dec(),
            (true, false) => self.filtered.inc(),
            _ => {}
        }
        self.whole_until = until;
    }

    /// Whether the server filters this collection's objects by namespace: they are namespaced
    /// and it applies a `shardSelector`. One short list asking for the whole space, which a
    /// server that filters answers with its `shardInfo`; `None` when it holds no object to tell
    /// whether they are namespaced.
    async fn probe(&mut self) -> Result<Option<bool>, ApiError> {
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

    /// What `line` is, for the hub.
    fn read(&mut self, line: &Bytes) -> Read {
        let buf = std::mem::take(&mut self.buf);
        let ev = match decode::decode_line_into(line, WHOLE, buf) {
            Ok(ev) => ev,
            // Its part skips it (and resyncs whole later): the main position stays.
            Err(_) => {
                return Read::Dealt(
                    Line {
                        to: owner_of_undecodable(line, &self.settings.sharding),
                        rv: None,
                        bytes: line.clone(),
                    },
                    None,
                );
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
                if self.hub.board().has_shard(shard) {
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

    /// Hands a seat its line, or expires it; never waits. A seat with no room for the line, or
    /// stalled already (its earlier lines wait in the hub), is reported stalled, the line with
    /// it; a seat whose part went away, gone. A line `drained` from the head of a stalled
    /// seat's queue goes ahead of the rest.
    fn deliver(&mut self, out: Out, drained: bool) -> Option<Input> {
        let id = match &out {
            Out::Expire(id) => {
                if let Some(l) = self.lines.remove(id) {
                    l.expired.store(true, Ordering::Relaxed);
                    if l.tx.try_send(Bytes::from_static(EXPIRED)).is_ok() {
                        l.expired.store(false, Ordering::Relaxed);
                    }
                }
                return None;
            }
            Out::Send(id, _) | Out::End(id, _) => *id,
        };
        if !self.lines.contains_key(&id) {
            return None;
        }
        if self.hub.stalled(id) && !drained {
            return Some(Input::NoRoom(out));
        }
        let line = match out {
            Out::Send(_, line) => line,
            Out::End(_, rv) => self.bookmark(&rv, true),
            Out::Expire(_) => unreachable!("expiries are handed out above"),
        };
        let l = self.lines.get(&id)?;
        match l.tx.try_send(line) {
            Ok(()) => None,
            Err(mpsc::error::TrySendError::Full(line)) if drained => {
                Some(Input::NoRoomAhead(Out::Send(id, line)))
            }
            Err(mpsc::error::TrySendError::Full(line)) => Some(Input::NoRoom(Out::Send(id, line))),
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.lines.remove(&id);
                Some(Input::Leave(id))
            }
        }
    }
}

/// Where a line that does not decode goes: the shard of its object when the object's name can
/// still be read from it (its resourceVersion is missing), so that only that shard's part
/// skips it and resyncs whole later; every part when it names no object (not JSON, torn, an
/// unknown type), since any of them may have missed a change.
fn owner_of_undecodable(line: &[u8], sharding: &ShardingConfig) -> To {
    #[derive(serde::Deserialize)]
    struct Event {
        #[serde(rename = "type")]
        kind: String,
        object: Object,
    }
    #[derive(serde::Deserialize)]
    struct Object {
        metadata: Metadata,
    }
    #[derive(serde::Deserialize)]
    struct Metadata {
        #[serde(default)]
        namespace: Option<String>,
        name: String,
    }
    match serde_json::from_slice::<Event>(line) {
        Ok(ev) if matches!(ev.kind.as_str(), "ADDED" | "MODIFIED" | "DELETED") => {
            let md = ev.object.metadata;
            let namespace = md.namespace.as_deref().filter(|n| !n.is_empty());
            To::Shard(sharding.shard_of_object(namespace, &md.name))
        }
        _ => To::All,
    }
}

/// The 410 a part gets when the hub cannot go on feeding it.
const EXPIRED: &[u8] = br#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the shards' shared watch of the collection cannot go on from this position","reason":"Expired","code":410}}"#;

/// The namespaces there, once they change.
async fn namespaces_changed(known: &mut Option<Known>) -> Arc<Points> {
    if let Some(k) = known {
        while k.changed().await.is_ok() {
            if let Namespaces::Known(names) = &*k.borrow_and_update() {
                return Arc::new(names.points.clone());
            }
        }
    }
    std::future::pending().await
}

/// The first of the `stalled` seats whose subscription has room again, or closed (or is gone).
async fn room(lines: &mut HashMap<u64, Lines>, stalled: &[u64]) -> u64 {
    std::future::poll_fn(|cx| {
        for id in stalled {
            let Some(l) = lines.get_mut(id) else {
                return Poll::Ready(*id);
            };
            let tx = &l.tx;
            let room = l.room.get_or_insert_with(|| PollSender::new(tx.clone()));
            if room.poll_reserve(cx).is_ready() {
                // The slot is let go at once: the hub is the subscription's only sender, so
                // the next line finds room.
                l.room = None;
                return Poll::Ready(*id);
            }
        }
        Poll::Pending
    })
    .await
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An undecodable line goes to its object's shard alone when its name can be read, so that
    /// one part, not every part of every shard, resyncs whole later.
    #[test]
    fn an_undecodable_line_goes_to_its_objects_shard_when_it_names_one() {
        let sharding = ShardingConfig {
            enabled: true,
            shards: 16,
            ..ShardingConfig::default()
        };
        let decodes = |line: &str| decode::decode_line_into(line.as_bytes(), WHOLE, Vec::new());
        // No `metadata.resourceVersion`: the relay cannot place the change.
        let pod = r#"{"type":"MODIFIED","object":{"kind":"Pod","metadata":{"name":"web","namespace":"team-a","resourceVersion":""}}}"#;
        assert!(decodes(pod).is_err(), "the line must not decode");
        assert_eq!(
            owner_of_undecodable(pod.as_bytes(), &sharding),
            To::Shard(sharding.shard_of("team-a"))
        );
        let node = r#"{"type":"DELETED","object":{"kind":"Node","metadata":{"name":"n1"}}}"#;
        assert!(decodes(node).is_err());
        assert_eq!(
            owner_of_undecodable(node.as_bytes(), &sharding),
            To::Shard(sharding.shard_of("n1"))
        );
        for nameless in [
            r#"{"type":"MODIFIED","object":{"kind":"Pod","metadata":{"namespace":"team-a","uid":7"#,
            "not json",
            r#"{"type":"ERROR","object":{"kind":"Status","code":"x"}}"#,
        ] {
            assert_eq!(
                owner_of_undecodable(nameless.as_bytes(), &sharding),
                To::All,
                "{nameless}"
            );
        }
    }
}
