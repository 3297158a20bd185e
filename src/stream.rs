//! One stream: a (channel, namespace) pair followed from list to watch to resync.
//!
//! The stream is a state machine ([`State`]) driven by [`Stream::run`]. While it reads its watch
//! it also consumes its delivery reports, acknowledging handled before new input so that memory
//! stays bounded: once `maxInFlightPerStream` records await Kafka, the stream stops reading.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::{Histogram, IntCounter, IntGauge};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::StreamShared;
use crate::config::{Channel, Config, OversizePolicy};
use crate::envelope::{self, EnvelopeMeta, ObjectMeta, Record, Trim, WatchEvent};
use crate::kubeapi::{self, ApiError, Query, WatchFrom};
use crate::metrics::Metrics;
use crate::sink::{Ack, DeliveryError, Pending, SendError, Sink};
use crate::tracker::{Change, Known};

/// Settings every stream shares, taken from the configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    pub cluster: String,
    pub watch_timeout_seconds: u32,
    pub list_page_size: u32,
    pub send_initial_events: bool,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    pub max_in_flight: usize,
    pub max_message_bytes: usize,
    pub oversize: OversizePolicy,
    pub dead_letter_topic: Option<String>,
    pub flush_timeout: Duration,
}

impl Settings {
    pub fn from_config(cfg: &Config) -> Self {
        Self {
            cluster: cfg.cluster_name.clone(),
            watch_timeout_seconds: cfg.kubernetes.watch_timeout_seconds,
            list_page_size: cfg.kubernetes.list_page_size,
            send_initial_events: cfg.kubernetes.send_initial_events,
            backoff_initial: Duration::from_millis(cfg.kubernetes.backoff_initial_ms),
            backoff_max: Duration::from_millis(cfg.kubernetes.backoff_max_ms),
            max_in_flight: cfg.kafka.max_in_flight_per_stream,
            max_message_bytes: cfg.kafka.max_message_bytes,
            oversize: cfg.kafka.oversize,
            dead_letter_topic: cfg.kafka.dead_letter_topic.clone(),
            flush_timeout: Duration::from_secs(cfg.kafka.flush_timeout_seconds),
        }
    }
}

/// The checkpoint key of a stream.
pub fn stream_id(channel: &Channel, namespace: Option<&str>) -> String {
    format!("{}.{}", channel.name, namespace.unwrap_or("_all"))
}

/// Where a stream is.
#[derive(Debug)]
enum State {
    /// A custom channel whose resource discovery does not list yet (a CRD not installed):
    /// poll discovery with backoff, then start.
    AwaitResource,
    /// No usable position: list every object and announce it, then watch from the list's
    /// resourceVersion. With `resync`, the position expired (410): re-announce flagged as a
    /// resync, infer DELETED for known objects missing from the list, and mark the end.
    /// Where the server supports it, the list is a watch that sends the current state first
    /// (`sendInitialEvents`) and goes on as a plain watch once that state has ended; a server
    /// that refuses it gets paginated lists from then on.
    List { resync: bool },
    /// Watch from a position; a clean end or a cut connection reopens from the last event read.
    Watch { rv: String },
    /// Wait, then go on.
    Backoff { next: Box<State>, delay: Duration },
    /// Cancelled: drain deliveries and stop.
    Done,
}

/// Why a stream left its current step.
#[derive(Debug)]
enum Stop {
    Cancelled,
    /// The watch ended cleanly (server timeout): reopen from the last position at once.
    Closed,
    /// The position expired.
    Gone,
    Api(ApiError),
    /// A line could not be decoded; resume from the last good position.
    Malformed,
    /// Kafka gave up on a record: replay from the checkpoint.
    Delivery(String),
}

impl From<ApiError> for Stop {
    fn from(e: ApiError) -> Self {
        match e {
            ApiError::Gone(_) => Stop::Gone,
            e => Stop::Api(e),
        }
    }
}

/// Exponential backoff with jitter, so streams that failed together retry apart.
struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
    seed: u64,
}

impl Backoff {
    fn new(initial: Duration, max: Duration, seed: u64) -> Self {
        Self {
            initial,
            max,
            current: initial,
            seed: seed | 1,
        }
    }

    fn next(&mut self) -> Duration {
        // xorshift: jitter needs spread, not quality.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let base = self.current;
        self.current = (self.current * 2).min(self.max);
        base / 2 + base.mul_f64((self.seed % 1000) as f64 / 2000.0)
    }

    fn reset(&mut self) {
        self.current = self.initial;
    }
}

/// Pre-labelled metric handles for one stream.
const EVENT_TYPES: [&str; 5] = ["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"];

struct StreamMetrics {
    /// events_received_total per entry of EVENT_TYPES.
    received: [IntCounter; 5],
    published: IntCounter,
    filtered: IntCounter,
    malformed: IntCounter,
    synthetic_deletes: IntCounter,
    resyncs: IntCounter,
    in_flight: IntGauge,
    up: IntGauge,
    latency: Histogram,
}

pub struct Stream {
    id: String,
    channel: Arc<Channel>,
    namespace: Option<String>,
    settings: Arc<Settings>,
    client: kube::Client,
    sink: Sink,
    metrics: Arc<Metrics>,
    m: StreamMetrics,
    shared: Arc<StreamShared>,
    cancel: CancellationToken,
    acks_tx: mpsc::UnboundedSender<Ack>,
    acks_rx: mpsc::UnboundedReceiver<Ack>,
    path: String,
    topic: String,
    source: String,
    trim: Trim,
    /// Kind of the channel's objects, learned from lists and events (for synthetic events).
    kind: String,
    /// Position of the last event read (not necessarily delivered).
    position: Option<String>,
    backoff: Backoff,
    /// Buffers reused for every event: the trimmed object and the envelope. The producer copies
    /// the envelope when it takes the record, so neither outlives one event.
    object_buf: Vec<u8>,
    value_buf: Vec<u8>,
    /// Whether to try `sendInitialEvents` (cleared when the server refuses it).
    initial_events: bool,
    /// While a watch is sending the initial state: what has been announced so far.
    initial: Option<Initial>,
}

/// The initial state arriving on a `sendInitialEvents` watch.
struct Initial {
    resync: bool,
    seen: HashSet<String>,
}

impl Stream {
    #[allow(clippy::too_many_arguments)] // one constructor wiring a stream to its shared parts
    pub fn new(
        channel: Arc<Channel>,
        namespace: Option<String>,
        settings: Arc<Settings>,
        client: kube::Client,
        sink: Sink,
        metrics: Arc<Metrics>,
        shared: Arc<StreamShared>,
        cancel: CancellationToken,
    ) -> Self {
        let id = shared.id.clone();
        let (acks_tx, acks_rx) = mpsc::unbounded_channel();
        let path = channel.path.collection_url(namespace.as_deref());
        let m = StreamMetrics {
            received: EVENT_TYPES.map(|t| metrics.events_received.with_label_values(&[&id, t])),
            published: metrics.events_published.with_label_values(&[&id]),
            filtered: metrics.events_filtered.with_label_values(&[&id]),
            malformed: metrics.malformed_lines.with_label_values(&[&id]),
            synthetic_deletes: metrics.synthetic_deletes.with_label_values(&[&id]),
            resyncs: metrics.resyncs.with_label_values(&[&id]),
            in_flight: metrics.in_flight.with_label_values(&[&id]),
            up: metrics.stream_up.with_label_values(&[&id]),
            latency: metrics.publish_latency.with_label_values(&[&id]),
        };
        let seed = id.bytes().fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100000001b3)
        }) ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        Self {
            topic: channel.topic_for(&settings.cluster, namespace.as_deref()),
            source: format!("/clusters/{}{}", settings.cluster, path),
            trim: Trim {
                drop_managed_fields: channel.drop_managed_fields,
                allow_secret_data: channel.allow_secret_data,
            },
            backoff: Backoff::new(settings.backoff_initial, settings.backoff_max, seed),
            kind: String::new(),
            position: None,
            object_buf: Vec::new(),
            value_buf: Vec::new(),
            initial_events: settings.send_initial_events,
            initial: None,
            id,
            channel,
            namespace,
            settings,
            client,
            sink,
            metrics,
            m,
            shared,
            cancel,
            acks_tx,
            acks_rx,
            path,
        }
    }

    /// Runs until cancelled, then waits (up to the flush timeout) for outstanding deliveries so
    /// the final checkpoint covers them.
    pub async fn run(mut self) {
        let mut state = if self.channel.builtin {
            self.start_state()
        } else {
            State::AwaitResource
        };
        loop {
            state = match state {
                State::Done => break,
                State::Backoff { next, delay } => {
                    self.set_up(false);
                    tokio::select! {
                        _ = self.cancel.cancelled() => State::Done,
                        _ = tokio::time::sleep(delay) => *next,
                    }
                }
                State::AwaitResource => self.await_resource().await,
                State::List { resync } if self.initial_events => {
                    let stop = self.watch_initial(resync).await;
                    let resume = match (self.initial.take(), &self.position) {
                        (None, Some(rv)) => State::Watch { rv: rv.clone() },
                        // The initial state did not end: start it over.
                        _ => State::List { resync },
                    };
                    self.after(stop, resume)
                }
                State::List { resync } => match self.list(resync).await {
                    Ok(rv) => {
                        self.backoff.reset();
                        State::Watch { rv }
                    }
                    Err(stop) => self.after(stop, State::List { resync }),
                },
                State::Watch { rv } => {
                    let stop = self.watch(WatchFrom::Version(&rv)).await;
                    let resume = State::Watch {
                        rv: self.position.clone().unwrap_or(rv),
                    };
                    self.after(stop, resume)
                }
            };
        }
        self.set_up(false);
        self.final_drain().await;
    }

    fn start_state(&mut self) -> State {
        let checkpoint = self
            .shared
            .tracker
            .lock()
            .expect("tracker lock poisoned")
            .checkpoint()
            .map(str::to_string);
        self.position = checkpoint.clone();
        match checkpoint {
            Some(rv) => State::Watch { rv },
            None => State::List { resync: false },
        }
    }

    /// The transition after a step ended with `stop`; `retry` is where to go back to.
    fn after(&mut self, stop: Stop, retry: State) -> State {
        let restart = |reason: &str| {
            self.metrics
                .watch_restarts
                .with_label_values(&[&self.id, reason])
                .inc()
        };
        match stop {
            Stop::Cancelled => State::Done,
            Stop::Closed => {
                self.backoff.reset();
                retry
            }
            Stop::Gone => {
                restart("expired");
                self.m.resyncs.inc();
                tracing::info!(stream = %self.id, position = ?self.position, "resourceVersion expired; relisting");
                State::List { resync: true }
            }
            Stop::Malformed => {
                restart("malformed");
                State::Backoff {
                    next: Box::new(retry),
                    delay: self.backoff.next(),
                }
            }
            Stop::Delivery(error) => {
                restart("delivery_failed");
                tracing::warn!(stream = %self.id, %error, "delivery failed; replaying from the checkpoint");
                let next = {
                    let mut t = self.shared.tracker.lock().expect("tracker lock poisoned");
                    t.reset();
                    self.m.in_flight.set(0);
                    t.checkpoint().map(str::to_string)
                };
                self.position = next.clone();
                let next = match next {
                    Some(rv) => State::Watch { rv },
                    None => State::List { resync: false },
                };
                State::Backoff {
                    next: Box::new(next),
                    delay: self.backoff.next(),
                }
            }
            Stop::Api(e) => {
                self.metrics
                    .api_errors
                    .with_label_values(&[&self.id, e.kind()])
                    .inc();
                if matches!(e, ApiError::Status { code: 404, .. }) && !self.channel.builtin {
                    tracing::warn!(stream = %self.id, error = %e, "resource no longer served; waiting for it");
                    return State::AwaitResource;
                }
                if let ApiError::Body(_) = e {
                    restart("connection");
                    tracing::info!(stream = %self.id, error = %e, "watch connection ended; resuming");
                } else {
                    tracing::warn!(stream = %self.id, error = %e, "API request failed; backing off");
                }
                let delay = e.retry_after().unwrap_or_else(|| self.backoff.next());
                State::Backoff {
                    next: Box::new(retry),
                    delay,
                }
            }
        }
    }

    fn set_up(&self, up: bool) {
        self.shared.up.store(up, Ordering::Release);
        self.m.up.set(up as i64);
    }

    async fn await_resource(&mut self) -> State {
        let p = &self.channel.path;
        match kubeapi::resource_exists(&self.client, &p.api_version(), &p.resource).await {
            Ok(true) => {
                self.backoff.reset();
                self.start_state()
            }
            Ok(false) => {
                tracing::info!(stream = %self.id, resource = %p.resource_name(), "resource not served yet; waiting");
                State::Backoff {
                    next: Box::new(State::AwaitResource),
                    delay: self.backoff.next(),
                }
            }
            Err(e) => {
                self.metrics
                    .api_errors
                    .with_label_values(&[&self.id, e.kind()])
                    .inc();
                State::Backoff {
                    next: Box::new(State::AwaitResource),
                    delay: self.backoff.next(),
                }
            }
        }
    }

    fn query(&self) -> Query<'_> {
        Query {
            label_selector: self.channel.label_selector.as_deref(),
            field_selector: self.channel.field_selector.as_deref(),
        }
    }

    /// Before a resync: the known set must equal everything announced before it is compared
    /// with the new state.
    async fn begin_resync(&mut self) -> Result<(), Stop> {
        self.wait_in_flight(0).await
    }

    /// A `sendInitialEvents` watch: the current state, then changes, on one connection.
    async fn watch_initial(&mut self, resync: bool) -> Stop {
        if resync {
            if let Err(stop) = self.begin_resync().await {
                return stop;
            }
        }
        self.initial = Some(Initial {
            resync,
            seen: HashSet::new(),
        });
        match self.watch(WatchFrom::InitialEvents).await {
            // Refused (the WatchList feature is off, or an older server): list instead.
            Stop::Api(ApiError::Status {
                code: 400 | 403 | 422,
                ref message,
                ..
            }) if self.initial.as_ref().is_some_and(|i| i.seen.is_empty()) => {
                tracing::info!(stream = %self.id, %message, "sendInitialEvents refused; using paginated lists");
                self.initial_events = false;
                Stop::Closed
            }
            stop => stop,
        }
    }

    async fn list(&mut self, resync: bool) -> Result<String, Stop> {
        if resync {
            self.begin_resync().await?;
        }
        let api_version = self.channel.path.api_version();
        let mut seen = HashSet::new();
        let mut token: Option<String> = None;
        let list_rv = loop {
            let page = match kubeapi::list_page(
                &self.client,
                &self.path,
                &self.query(),
                self.settings.list_page_size,
                token.as_deref(),
            )
            .await
            {
                Ok(p) => p,
                // The snapshot pinned by the continue token expired: start the list over.
                Err(ApiError::Gone(_)) if token.is_some() => {
                    token = None;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            if let Some(k) = page.kind.strip_suffix("List") {
                self.kind = k.to_string();
            }
            for item in &page.items {
                self.wait_in_flight(self.settings.max_in_flight - 1).await?;
                let ev = match envelope::decode_item(
                    "ADDED",
                    item,
                    self.trim,
                    (&api_version, &self.kind),
                ) {
                    Ok(ev) => ev,
                    Err(e) => {
                        self.m.malformed.inc();
                        tracing::warn!(stream = %self.id, error = %e, "skipping an undecodable list item");
                        continue;
                    }
                };
                seen.insert(ev.meta.uid.clone());
                let change = upsert(&ev.meta);
                self.emit(&ev, Instant::now(), None, change, resync).await?;
            }
            match page.continue_token {
                Some(c) => token = Some(c),
                None => break page.resource_version,
            }
        };
        let objects = seen.len();
        self.finish_state(seen, resync, &list_rv).await?;
        tracing::info!(stream = %self.id, objects, rv = %list_rv, resync, "listed");
        Ok(list_rv)
    }

    /// The whole current state has been announced, consistent as of `list_rv`. After a resync,
    /// known objects it lacks get a synthetic DELETED and the end is marked; either way the
    /// stream's position becomes `list_rv` once everything before it is acknowledged.
    async fn finish_state(
        &mut self,
        seen: HashSet<String>,
        resync: bool,
        list_rv: &str,
    ) -> Result<(), Stop> {
        let api_version = self.channel.path.api_version();
        let list_rv = list_rv.to_string();
        if resync {
            let vanished: Vec<(String, Known)> = {
                let t = self.shared.tracker.lock().expect("tracker lock poisoned");
                t.known()
                    .iter()
                    .filter(|(uid, _)| !seen.contains(*uid))
                    .map(|(u, k)| (u.clone(), k.clone()))
                    .collect()
            };
            for (uid, known) in vanished {
                self.wait_in_flight(self.settings.max_in_flight - 1).await?;
                self.m.synthetic_deletes.inc();
                let meta = ObjectMeta {
                    kind: self.kind.clone(),
                    api_version: api_version.clone(),
                    name: known.name,
                    namespace: known.namespace,
                    uid: uid.clone(),
                    resource_version: known.rv,
                };
                let change = Some(Change::Remove { uid });
                if self.channel.forward_deleted {
                    let object = envelope::reference_object(&meta);
                    let id = format!("{}/deleted", meta.uid);
                    let rec = self.record("DELETED", &meta, &object, &id, &list_rv, true, true);
                    self.publish(rec, Instant::now(), None, change).await?;
                } else {
                    self.push_done(None, change);
                }
            }
            // Everything the resync produced is in Kafka before its end is marked.
            self.wait_in_flight(0).await?;
            let object = envelope::bookmark_object(
                &api_version,
                &self.kind,
                &list_rv,
                Some(("watchrelay.io/resync-end", "true")),
            );
            let meta = ObjectMeta {
                name: self.id.clone(),
                resource_version: list_rv.clone(),
                ..Default::default()
            };
            let id = format!("resync-end/{}/{}", self.id, list_rv);
            let rec = self.record("BOOKMARK", &meta, &object, &id, &list_rv, true, false);
            self.publish(
                rec,
                Instant::now(),
                Some(list_rv.clone()),
                Some(Change::Complete),
            )
            .await?;
        } else {
            self.push_done(Some(list_rv.clone()), Some(Change::Complete));
        }
        self.position = Some(list_rv);
        Ok(())
    }

    async fn watch(&mut self, from: WatchFrom<'_>) -> Stop {
        let query = self.query();
        let opened = kubeapi::watch(
            &self.client,
            &self.path,
            &query,
            from,
            self.settings.watch_timeout_seconds,
        );
        let mut w = tokio::select! {
            _ = self.cancel.cancelled() => return Stop::Cancelled,
            w = opened => match w {
                Ok(w) => w,
                Err(e) => return e.into(),
            },
        };
        self.set_up(true);
        loop {
            let room = self.in_flight() < self.settings.max_in_flight;
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return Stop::Cancelled,
                Some(ack) = self.acks_rx.recv() => {
                    if let Err(stop) = self.on_ack(ack).await {
                        return stop;
                    }
                }
                line = w.next_line(), if room => match line {
                    Ok(Some(line)) => {
                        if let Err(stop) = self.on_line(&line).await {
                            return stop;
                        }
                        // Lines already received are handled without another trip through
                        // the select; acknowledgements still come first once room runs out.
                        while self.in_flight() < self.settings.max_in_flight {
                            let Some(line) = w.buffered_line() else { break };
                            if let Err(stop) = self.on_line(&line).await {
                                return stop;
                            }
                        }
                    }
                    Ok(None) => return Stop::Closed,
                    Err(e) => return e.into(),
                }
            }
        }
    }

    async fn on_line(&mut self, line: &[u8]) -> Result<(), Stop> {
        let arrived = Instant::now();
        let buf = std::mem::take(&mut self.object_buf);
        let ev = match envelope::decode_line_into(line, self.trim, buf) {
            Ok(ev) => ev,
            Err(e) => {
                self.m.malformed.inc();
                let preview = String::from_utf8_lossy(&line[..line.len().min(120)]).into_owned();
                tracing::warn!(stream = %self.id, position = ?self.position, error = %e, %preview, "malformed watch line; resuming from the last good position");
                return Err(Stop::Malformed);
            }
        };
        let result = self.on_event(&ev, arrived).await;
        self.object_buf = ev.object;
        result
    }

    async fn on_event(&mut self, ev: &WatchEvent, arrived: Instant) -> Result<(), Stop> {
        match EVENT_TYPES.iter().position(|t| *t == ev.event_type) {
            Some(i) => self.m.received[i].inc(),
            None => self
                .metrics
                .events_received
                .with_label_values(&[&self.id, &ev.event_type])
                .inc(),
        }
        match ev.event_type.as_str() {
            "ERROR" => Err(match ev.status_code {
                Some(410) => Stop::Gone,
                code => Stop::Api(ApiError::Status {
                    code: code.unwrap_or(500),
                    reason: "WatchError".into(),
                    message: String::from_utf8_lossy(&ev.object).into_owned(),
                    retry_after: None,
                }),
            }),
            "BOOKMARK" if self.initial.is_some() => {
                if !ev.initial_events_end {
                    // Not a position yet: the state before it is still arriving.
                    return Ok(());
                }
                let initial = self.initial.take().expect("guarded");
                let objects = initial.seen.len();
                let rv = &ev.meta.resource_version;
                self.finish_state(initial.seen, initial.resync, rv).await?;
                tracing::info!(stream = %self.id, objects, %rv, resync = initial.resync, "initial events ended");
                Ok(())
            }
            "BOOKMARK" => {
                let rv = ev.meta.resource_version.clone();
                self.position = Some(rv.clone());
                if self.channel.forward_bookmarks {
                    let id = format!("bookmark/{}/{}", self.id, rv);
                    let meta = ObjectMeta {
                        name: self.id.clone(),
                        ..ev.meta.clone()
                    };
                    let rec = self.record("BOOKMARK", &meta, &ev.object, &id, &rv, false, false);
                    self.publish(rec, arrived, Some(rv), None).await
                } else {
                    self.push_done(Some(rv), None);
                    Ok(())
                }
            }
            "ADDED" | "MODIFIED" | "DELETED" => {
                if self.kind.is_empty() {
                    self.kind = ev.meta.kind.clone();
                }
                let deleted = ev.event_type == "DELETED";
                let change = if deleted {
                    Some(Change::Remove {
                        uid: ev.meta.uid.clone(),
                    })
                } else {
                    upsert(&ev.meta)
                };
                match self.initial.as_mut() {
                    // The initial state (sent as ADDED): like list items, no position until
                    // all of it has been announced.
                    Some(initial) => {
                        if deleted {
                            initial.seen.remove(&ev.meta.uid);
                        } else {
                            initial.seen.insert(ev.meta.uid.clone());
                        }
                        let resync = initial.resync;
                        self.emit(ev, arrived, None, change, resync).await
                    }
                    None => {
                        let rv = ev.meta.resource_version.clone();
                        self.position = Some(rv.clone());
                        self.emit(ev, arrived, Some(rv), change, false).await
                    }
                }
            }
            other => {
                self.m.malformed.inc();
                tracing::warn!(stream = %self.id, event_type = other, "unknown watch event type; resuming");
                Err(Stop::Malformed)
            }
        }
    }

    /// Publishes an object event if its type is forwarded; either way it takes its place in the
    /// ordered tracker.
    async fn emit(
        &mut self,
        ev: &WatchEvent,
        arrived: Instant,
        rv: Option<String>,
        change: Option<Change>,
        resync: bool,
    ) -> Result<(), Stop> {
        if !self.channel.forwards(&ev.event_type) {
            self.m.filtered.inc();
            self.push_done(rv, change);
            return Ok(());
        }
        let id = format!("{}/{}", ev.meta.uid, ev.meta.resource_version);
        let rec = self.record(
            &ev.event_type,
            &ev.meta,
            &ev.object,
            &id,
            &ev.meta.resource_version,
            resync,
            false,
        );
        self.publish(rec, arrived, rv, change).await
    }

    #[allow(clippy::too_many_arguments)] // the envelope's fields, each distinct
    fn record(
        &mut self,
        event_type: &str,
        meta: &ObjectMeta,
        object: &[u8],
        id: &str,
        rv: &str,
        resync: bool,
        synthetic: bool,
    ) -> Record {
        let observed_at = envelope::now_rfc3339();
        let env = EnvelopeMeta {
            id,
            channel: &self.channel.path.template,
            operation_id: &self.channel.operation_id,
            message: &self.channel.message,
            cluster: &self.settings.cluster,
            namespace: self.namespace.as_deref(),
            resource_version: rv,
            observed_at: &observed_at,
            resync,
            synthetic,
            truncated_bytes: None,
        };
        let key = meta.key();
        Record {
            topic: self.topic.clone(),
            value: {
                let mut value = std::mem::take(&mut self.value_buf);
                envelope::write_envelope(&mut value, event_type, object, &env);
                value
            },
            headers: envelope::cloudevents_headers(&env, event_type, &self.source, &key),
            key,
        }
    }

    fn in_flight(&self) -> usize {
        self.shared
            .tracker
            .lock()
            .expect("tracker lock poisoned")
            .in_flight()
    }

    fn push_done(&self, rv: Option<String>, change: Option<Change>) {
        if self
            .shared
            .tracker
            .lock()
            .expect("tracker lock poisoned")
            .push_done(rv, change)
        {
            self.shared.dirty.store(true, Ordering::Release);
        }
    }

    async fn publish(
        &mut self,
        rec: Record,
        arrived: Instant,
        rv: Option<String>,
        change: Option<Change>,
    ) -> Result<(), Stop> {
        let seq = {
            let mut t = self.shared.tracker.lock().expect("tracker lock poisoned");
            let seq = t.push(rv, change);
            self.m.in_flight.set(t.in_flight() as i64);
            seq
        };
        if rec.value.len() > self.settings.max_message_bytes {
            return self
                .send_oversize(seq, arrived, &rec.value, &rec.topic)
                .await;
        }
        if self.enqueue(&rec, seq, arrived).await? {
            self.value_buf = rec.value;
            Ok(())
        } else {
            self.send_oversize(seq, arrived, &rec.value, &rec.topic)
                .await
        }
    }

    /// Hands a record to the producer under `seq`. False when it was refused at once for its
    /// size; any other refusal stops the stream so it replays from its checkpoint.
    async fn enqueue(&mut self, rec: &Record, seq: u64, arrived: Instant) -> Result<bool, Stop> {
        let pending = Pending {
            tx: self.acks_tx.clone(),
            seq,
            sent_at: arrived,
        };
        match self.sink.send(rec, pending).await {
            Ok(()) => Ok(true),
            Err(SendError::TooLarge) => Ok(false),
            Err(SendError::Other(e)) => {
                self.metrics
                    .delivery_errors
                    .with_label_values(&[&self.id, "enqueue"])
                    .inc();
                Err(Stop::Delivery(e.to_string()))
            }
        }
    }

    /// Replaces an event too large for Kafka by a reference envelope (the object reduced to its
    /// identity, `truncatedBytes` set), sent to the dead-letter topic or, with `trim`, to the
    /// channel's own topic. It takes the original's place in the ordered tracker.
    async fn send_oversize(
        &mut self,
        seq: u64,
        arrived: Instant,
        value: &[u8],
        topic: &str,
    ) -> Result<(), Stop> {
        let (action, target) = match (&self.settings.oversize, &self.settings.dead_letter_topic) {
            (OversizePolicy::DeadLetter, Some(dlq)) if topic != dlq => ("dead_letter", dlq.clone()),
            _ => ("trim", self.topic.clone()),
        };
        self.metrics
            .oversize
            .with_label_values(&[&self.id, action])
            .inc();
        let rec = match reference_record(value, target, &self.source) {
            Some(rec) => rec,
            None => {
                tracing::error!(stream = %self.id, "oversized record is not an envelope; dropping it");
                self.ack_delivered(seq);
                return Ok(());
            }
        };
        tracing::warn!(stream = %self.id, bytes = value.len(), key = %rec.key, action, "event too large for Kafka; sending a reference");
        match self.enqueue(&rec, seq, arrived).await? {
            true => Ok(()),
            false => Err(Stop::Delivery(
                "even the reference envelope is too large".into(),
            )),
        }
    }

    fn ack_delivered(&self, seq: u64) {
        let mut t = self.shared.tracker.lock().expect("tracker lock poisoned");
        if t.ack(seq) {
            self.shared.dirty.store(true, Ordering::Release);
        }
        self.m.in_flight.set(t.in_flight() as i64);
    }

    async fn on_ack(&mut self, ack: Ack) -> Result<(), Stop> {
        match ack.result {
            Ok(()) => {
                self.m.latency.observe(ack.sent_at.elapsed().as_secs_f64());
                self.m.published.inc();
                self.ack_delivered(ack.seq);
                Ok(())
            }
            Err(DeliveryError::TooLarge { value }) => {
                let topic = self.topic.clone();
                self.send_oversize(ack.seq, ack.sent_at, &value, &topic)
                    .await
            }
            Err(DeliveryError::Failed(e)) => {
                self.metrics
                    .delivery_errors
                    .with_label_values(&[&self.id, "delivery"])
                    .inc();
                Err(Stop::Delivery(e))
            }
        }
    }

    /// Handles delivery reports until at most `limit` records are in flight.
    async fn wait_in_flight(&mut self, limit: usize) -> Result<(), Stop> {
        while self.in_flight() > limit {
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return Err(Stop::Cancelled),
                Some(ack) = self.acks_rx.recv() => self.on_ack(ack).await?,
            }
        }
        Ok(())
    }

    async fn final_drain(&mut self) {
        let deadline = tokio::time::Instant::now() + self.settings.flush_timeout;
        while self.in_flight() > 0 {
            match tokio::time::timeout_at(deadline, self.acks_rx.recv()).await {
                Ok(Some(ack)) => {
                    if ack.result.is_ok() {
                        self.ack_delivered(ack.seq);
                    }
                }
                _ => {
                    tracing::warn!(stream = %self.id, in_flight = self.in_flight(), "stopping with undelivered records; they will be replayed");
                    break;
                }
            }
        }
    }
}

fn upsert(meta: &ObjectMeta) -> Option<Change> {
    Some(Change::Upsert {
        uid: meta.uid.clone(),
        known: Known {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            rv: meta.resource_version.clone(),
        },
    })
}

/// Builds the reference envelope of an oversized envelope.
fn reference_record(value: &[u8], topic: String, source: &str) -> Option<Record> {
    let mut v: serde_json::Value = serde_json::from_slice(value).ok()?;
    let obj = &v["object"];
    let md = &obj["metadata"];
    let s = |x: &serde_json::Value| x.as_str().unwrap_or_default().to_string();
    let meta = ObjectMeta {
        kind: s(&obj["kind"]),
        api_version: s(&obj["apiVersion"]),
        name: s(&md["name"]),
        namespace: md["namespace"].as_str().map(str::to_string),
        uid: s(&md["uid"]),
        resource_version: s(&md["resourceVersion"]),
    };
    let reference: serde_json::Value =
        serde_json::from_slice(&envelope::reference_object(&meta)).ok()?;
    v["object"] = reference;
    v["watchrelay"]["truncatedBytes"] = value.len().into();
    let w = &v["watchrelay"];
    let env = EnvelopeMeta {
        id: w["id"].as_str()?,
        channel: w["channel"].as_str()?,
        operation_id: w["operationId"].as_str()?,
        message: w["message"].as_str()?,
        cluster: w["cluster"].as_str()?,
        namespace: w["namespace"].as_str(),
        resource_version: w["resourceVersion"].as_str()?,
        observed_at: w["observedAt"].as_str()?,
        resync: w["resync"].as_bool()?,
        synthetic: w["synthetic"].as_bool()?,
        truncated_bytes: Some(value.len()),
    };
    let event_type = v["type"].as_str()?.to_string();
    let key = meta.key();
    let mut headers = envelope::cloudevents_headers(&env, &event_type, source, &key);
    headers.push(("ce_truncatedbytes", value.len().to_string()));
    Some(Record {
        topic,
        key,
        value: envelope::envelope_value(&event_type, &envelope::reference_object(&meta), &env),
        headers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_record_keeps_routing_and_identity() {
        let env = EnvelopeMeta {
            id: "u/5",
            channel: "/api/v1/namespaces/{namespace}/pods",
            operation_id: "watchNamespacedPods",
            message: "WatchEvent",
            cluster: "c",
            namespace: Some("a"),
            resource_version: "5",
            observed_at: "2026-01-01T00:00:00.000Z",
            resync: false,
            synthetic: false,
            truncated_bytes: None,
        };
        let big = format!(
            r#"{{"kind":"Pod","apiVersion":"v1","metadata":{{"name":"p","namespace":"a","uid":"u","resourceVersion":"5"}},"data":"{}"}}"#,
            "x".repeat(5000)
        );
        let value = envelope::envelope_value("MODIFIED", big.as_bytes(), &env);
        let rec =
            reference_record(&value, "dlq".into(), "/clusters/c/api/v1/namespaces/a/pods").unwrap();
        assert_eq!(rec.topic, "dlq");
        assert_eq!(rec.key, "a/p");
        assert!(rec.value.len() < 1000);
        let v: serde_json::Value = serde_json::from_slice(&rec.value).unwrap();
        assert_eq!(v["type"], "MODIFIED");
        assert_eq!(v["object"]["metadata"]["uid"], "u");
        assert_eq!(v["watchrelay"]["id"], "u/5");
        assert_eq!(v["watchrelay"]["truncatedBytes"], value.len());
    }

    #[test]
    fn backoff_grows_with_jitter_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(800), 42);
        let d: Vec<_> = (0..6).map(|_| b.next()).collect();
        for (i, d) in d.iter().enumerate() {
            let base = Duration::from_millis(100 << i.min(3));
            assert!(*d >= base / 2 && *d <= base, "{i}: {d:?}");
        }
        b.reset();
        assert!(b.next() <= Duration::from_millis(100));
    }
}
