//! One stream: a (channel, namespace) pair followed from list to watch to resync.
//!
//! [`machine`] decides where a stream goes; [`Stream`] performs each step (await the resource,
//! sync, watch, back off), turns lines into announcements and hands them to its
//! [`Outbox`](crate::outbox::Outbox), and publishes its phase and acknowledged checkpoint
//! through its [`Reporter`]. While it reads a watch it also settles delivery reports, reports
//! first, so memory stays bounded: once `maxInFlightPerStream` entries await Kafka it stops
//! reading.

pub mod machine;

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::{IntCounter, IntGauge};
use tokio_util::sync::CancellationToken;

use crate::channel::Channel;
use crate::checkpoint::Saved;
use crate::config::Config;
use crate::decode::{self, ObjectMeta, Trim, WatchEvent};
use crate::envelope::{self, Announcement, Route};
use crate::event::EventType;
use crate::kubeapi::{self, ApiError, Query, WatchFrom};
use crate::metrics::Metrics;
use crate::outbox::{Limits, Outbox, OutboxError};
use crate::producer::Producer;
use crate::registry::{Phase, Reporter};
use crate::tracker::{Change, Known};
use machine::{Backoff, Cursor, Outcome, Reason, State, Stop, Via};

type Step = Outcome<kubeapi::Watch>;

/// Pre-labelled metric handles for one stream.
struct StreamMetrics {
    /// events_received_total, per [`EventType::ALL`].
    received: [IntCounter; 5],
    filtered: IntCounter,
    malformed: IntCounter,
    synthetic_deletes: IntCounter,
    resyncs: IntCounter,
    up: IntGauge,
}

/// What the lines of an open watch are: the initial state of a Sync, or live changes.
enum Reading {
    Initial {
        reason: Reason,
        seen: HashSet<String>,
    },
    Live {
        at: Option<String>,
    },
}

/// Everything a stream is started with.
pub struct Wiring {
    pub cfg: Arc<Config>,
    pub client: kube::Client,
    pub producer: Arc<dyn Producer>,
    pub metrics: Arc<Metrics>,
}

pub struct Stream {
    id: String,
    channel: Arc<Channel>,
    cfg: Arc<Config>,
    client: kube::Client,
    metrics: Arc<Metrics>,
    m: StreamMetrics,
    /// The collection URL.
    path: String,
    api_version: String,
    trim: Trim,
    /// Kind of the channel's objects, learned from lists and events (for inferred events).
    kind: String,
    outbox: Outbox,
    reporter: Reporter,
    cancel: CancellationToken,
    backoff: Backoff,
    /// The object buffer reused for every event.
    object_buf: Vec<u8>,
    /// Fires when the next checkpoint may be published.
    publish: Pin<Box<tokio::time::Sleep>>,
    publish_every: Duration,
}

impl Stream {
    pub fn new(
        channel: Arc<Channel>,
        namespace: Option<String>,
        wiring: &Wiring,
        reporter: Reporter,
        saved: Option<Saved>,
        cancel: CancellationToken,
    ) -> Self {
        let cfg = wiring.cfg.clone();
        let metrics = wiring.metrics.clone();
        let id = reporter.id().to_string();
        let path = channel.path.collection_url(namespace.as_deref());
        let route = Route {
            topic: channel.topic_for(&cfg.cluster_name, namespace.as_deref()),
            source: format!("/clusters/{}{}", cfg.cluster_name, path),
            channel: channel.path.template.clone(),
            operation_id: channel.operation_id.clone(),
            message: channel.message.clone(),
            cluster: cfg.cluster_name.clone(),
            namespace,
        };
        let limits = Limits {
            max_in_flight: cfg.kafka.max_in_flight_per_stream,
            max_message_bytes: cfg.kafka.max_message_bytes,
            oversize: cfg.kafka.oversize,
            dead_letter_topic: cfg.kafka.dead_letter_topic.clone(),
        };
        let outbox = Outbox::new(
            &id,
            Arc::new(route),
            wiring.producer.clone(),
            limits,
            saved,
            &metrics,
            cancel.clone(),
        );
        let m = StreamMetrics {
            received: EventType::ALL.map(|t| {
                metrics
                    .events_received
                    .with_label_values(&[&id, t.as_str()])
            }),
            filtered: metrics.events_filtered.with_label_values(&[&id]),
            malformed: metrics.malformed_lines.with_label_values(&[&id]),
            synthetic_deletes: metrics.synthetic_deletes.with_label_values(&[&id]),
            resyncs: metrics.resyncs.with_label_values(&[&id]),
            up: metrics.stream_up.with_label_values(&[&id]),
        };
        let seed = id.bytes().fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100000001b3)
        }) ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        let k = &cfg.kubernetes;
        Self {
            backoff: Backoff::new(
                Duration::from_millis(k.backoff_initial_ms),
                Duration::from_millis(k.backoff_max_ms),
                seed,
            ),
            publish_every: Duration::from_millis(cfg.checkpoint.interval_ms),
            publish: Box::pin(tokio::time::sleep(Duration::ZERO)),
            api_version: channel.path.api_version(),
            trim: Trim {
                drop_managed_fields: channel.drop_managed_fields,
                allow_secret_data: channel.allow_secret_data,
            },
            kind: String::new(),
            object_buf: Vec::new(),
            id,
            channel,
            cfg,
            client: wiring.client.clone(),
            metrics,
            m,
            path,
            outbox,
            reporter,
            cancel,
        }
    }

    /// Runs until cancelled, then waits (up to the flush timeout) for outstanding deliveries so
    /// the final checkpoint covers them. Gives the reporter back, for the owner to retire.
    pub async fn run(mut self) -> Reporter {
        let via = if self.cfg.kubernetes.send_initial_events {
            Via::InitialEvents
        } else {
            Via::Pages
        };
        let checkpoint = self.outbox.checkpoint().map(str::to_string);
        let mut state = machine::start(self.channel.builtin, checkpoint, via);
        loop {
            state = match state {
                State::Done => break,
                State::Backoff { then, delay } => {
                    let outcome = self.wait(delay).await;
                    self.transition(State::Backoff { then, delay }, outcome)
                }
                State::AwaitResource { via } => {
                    let outcome = self.await_resource().await;
                    self.transition(State::AwaitResource { via }, outcome)
                }
                State::Sync { reason, via } => {
                    let outcome = match via {
                        Via::InitialEvents => self.sync_initial(reason).await,
                        Via::Pages => self.sync_pages(reason).await,
                    };
                    self.transition(State::Sync { reason, via }, outcome)
                }
                State::Watch { at, open } => {
                    let outcome = self.watch(&at, open).await;
                    self.transition(State::Watch { at, open: None }, outcome)
                }
            };
        }
        self.stop().await
    }

    /// Logs and counts what a step reported, then moves the machine.
    fn transition(&mut self, state: State<kubeapi::Watch>, outcome: Step) -> State<kubeapi::Watch> {
        if let Outcome::Stopped { why, .. } = &outcome {
            match why {
                Stop::Gone => {
                    self.m.resyncs.inc();
                    tracing::info!(stream = %self.id, "resourceVersion expired; relisting");
                }
                Stop::Delivery { error, .. } => {
                    tracing::warn!(stream = %self.id, %error, "delivery failed; replaying from the checkpoint")
                }
                Stop::NotServed => {
                    tracing::info!(stream = %self.id, resource = %self.channel.path.resource_name(), "resource not served; waiting for it")
                }
                Stop::Api(e) => {
                    self.metrics
                        .api_errors
                        .with_label_values(&[&self.id, e.kind()])
                        .inc();
                    if let ApiError::Body(_) = e {
                        tracing::info!(stream = %self.id, error = %e, "watch connection ended; resuming");
                    } else {
                        tracing::warn!(stream = %self.id, error = %e, "API request failed; backing off");
                    }
                }
                Stop::Cancelled | Stop::Closed | Stop::Refused | Stop::Malformed => {}
            }
        }
        let t = machine::next(state, outcome, &mut self.backoff);
        if let Some(reason) = t.restart {
            self.metrics
                .watch_restarts
                .with_label_values(&[&self.id, reason])
                .inc();
        }
        match &t.next {
            State::Backoff { .. } | State::AwaitResource { .. } => self.set_phase(Phase::Waiting),
            State::Sync { .. } => self.set_phase(Phase::Syncing),
            State::Watch { .. } | State::Done => {}
        }
        t.next
    }

    fn set_phase(&self, phase: Phase) {
        self.reporter.phase(phase);
        self.m.up.set((phase == Phase::Watching) as i64);
    }

    /// Publishes the checkpoint if it moved since it was last published.
    fn publish_checkpoint(&mut self) {
        if let Some(saved) = self.outbox.take_saved() {
            self.reporter.checkpoint(saved);
        }
        let next = tokio::time::Instant::now() + self.publish_every;
        self.publish.as_mut().reset(next);
    }

    /// What a failed hand-over means for the machine. A failed delivery rewinds the outbox to
    /// its checkpoint here, so the transition knows where the replay starts.
    fn outbox_stop(&mut self, e: OutboxError) -> Stop {
        match e {
            OutboxError::Cancelled => Stop::Cancelled,
            OutboxError::Failed(error) => Stop::Delivery {
                error,
                checkpoint: self.outbox.rewind(),
            },
        }
    }

    fn api_stop(&self, e: ApiError) -> Stop {
        match e {
            ApiError::Gone(_) => Stop::Gone,
            ApiError::Status { code: 404, .. } if !self.channel.builtin => Stop::NotServed,
            e => Stop::Api(e),
        }
    }

    fn stopped(why: Stop) -> Step {
        Outcome::Stopped { why, at: None }
    }

    fn query(&self) -> Query<'_> {
        Query {
            label_selector: self.channel.label_selector.as_deref(),
            field_selector: self.channel.field_selector.as_deref(),
        }
    }

    async fn wait(&mut self, delay: Duration) -> Step {
        // Nothing is read while waiting: what was acknowledged so far is published now.
        self.publish_checkpoint();
        tokio::select! {
            _ = self.cancel.cancelled() => Self::stopped(Stop::Cancelled),
            _ = tokio::time::sleep(delay) => Outcome::Waited,
        }
    }

    async fn await_resource(&mut self) -> Step {
        let p = &self.channel.path;
        let api_version = p.api_version();
        let exists = kubeapi::resource_exists(&self.client, &api_version, &p.resource);
        let exists = tokio::select! {
            _ = self.cancel.cancelled() => return Self::stopped(Stop::Cancelled),
            r = exists => r,
        };
        match exists {
            Ok(true) => Outcome::Served {
                checkpoint: self.outbox.checkpoint().map(str::to_string),
            },
            Ok(false) => Self::stopped(Stop::NotServed),
            Err(e) => Self::stopped(Stop::Api(e)),
        }
    }

    /// Opens a watch, unless cancelled first.
    async fn open(&self, from: WatchFrom<'_>) -> Result<kubeapi::Watch, Stop> {
        let query = self.query();
        let opened = kubeapi::watch(
            &self.client,
            &self.path,
            &query,
            from,
            self.cfg.kubernetes.watch_timeout_seconds,
        );
        tokio::select! {
            _ = self.cancel.cancelled() => Err(Stop::Cancelled),
            w = opened => w.map_err(|e| self.api_stop(e)),
        }
    }

    /// Sync through a `sendInitialEvents` watch: the current state, then changes, on one
    /// connection, handed on to the Watch state once the state has ended.
    async fn sync_initial(&mut self, reason: Reason) -> Step {
        if reason == Reason::Resync {
            if let Err(e) = self.outbox.wait_until(0).await {
                return Self::stopped(self.outbox_stop(e));
            }
        }
        let mut w = match self.open(WatchFrom::InitialEvents).await {
            Ok(w) => w,
            // Refused (the WatchList feature is off, or an older server): list instead.
            Err(Stop::Api(ApiError::Status {
                code: 400 | 403 | 422,
                message,
                ..
            })) => {
                tracing::info!(stream = %self.id, %message, "sendInitialEvents refused; using paginated lists");
                return Self::stopped(Stop::Refused);
            }
            Err(why) => return Self::stopped(why),
        };
        let mut reading = Reading::Initial {
            reason,
            seen: HashSet::new(),
        };
        match self.read(&mut w, &mut reading).await {
            Ok(Some(rv)) => Outcome::Synced { rv, open: Some(w) },
            Ok(None) => Self::stopped(Stop::Closed),
            Err(why) => Self::stopped(why),
        }
    }

    /// Sync through paginated lists.
    async fn sync_pages(&mut self, reason: Reason) -> Step {
        match self.list(reason).await {
            Ok(rv) => Outcome::Synced { rv, open: None },
            Err(why) => Self::stopped(why),
        }
    }

    async fn list(&mut self, reason: Reason) -> Result<String, Stop> {
        if reason == Reason::Resync {
            self.outbox
                .wait_until(0)
                .await
                .map_err(|e| self.outbox_stop(e))?;
        }
        let mut seen = HashSet::new();
        let mut token: Option<String> = None;
        let list_rv = loop {
            let query = self.query();
            let page = kubeapi::list_page(
                &self.client,
                &self.path,
                &query,
                self.cfg.kubernetes.list_page_size,
                token.as_deref(),
            );
            let page = tokio::select! {
                _ = self.cancel.cancelled() => return Err(Stop::Cancelled),
                p = page => p,
            };
            let page = match page {
                Ok(p) => p,
                // The snapshot pinned by the continue token expired: start the list over.
                Err(ApiError::Gone(_)) if token.is_some() => {
                    token = None;
                    continue;
                }
                Err(e) => return Err(self.api_stop(e)),
            };
            if let Some(k) = page.kind.strip_suffix("List") {
                self.kind = k.to_string();
            }
            for item in &page.items {
                self.outbox
                    .wait_for_room()
                    .await
                    .map_err(|e| self.outbox_stop(e))?;
                let type_meta = (self.api_version.as_str(), self.kind.as_str());
                let mut ev = match decode::decode_item(EventType::Added, item, self.trim, type_meta)
                {
                    Ok(ev) => ev,
                    Err(e) => {
                        self.m.malformed.inc();
                        tracing::warn!(stream = %self.id, error = %e, "skipping an undecodable list item");
                        continue;
                    }
                };
                seen.insert(ev.meta.uid.clone());
                let change = upsert(&ev.meta);
                self.emit(
                    &mut ev,
                    Instant::now(),
                    None,
                    change,
                    reason == Reason::Resync,
                )
                .await?;
            }
            match page.continue_token {
                Some(c) => token = Some(c),
                None => break page.resource_version,
            }
        };
        let objects = seen.len();
        self.finish_sync(seen, reason, &list_rv).await?;
        tracing::info!(stream = %self.id, objects, rv = %list_rv, resync = reason == Reason::Resync, "listed");
        Ok(list_rv)
    }

    /// The whole current state has been announced, consistent as of `list_rv`. After a resync,
    /// known objects it lacks get an inferred DELETED and the end is marked; either way the
    /// stream's position becomes `list_rv` once everything before it is acknowledged.
    async fn finish_sync(
        &mut self,
        seen: HashSet<String>,
        reason: Reason,
        list_rv: &str,
    ) -> Result<(), Stop> {
        if reason == Reason::Start {
            self.outbox
                .pass(Some(list_rv.to_string()), Some(Change::Complete));
            return Ok(());
        }
        let vanished: Vec<(String, Known)> = self
            .outbox
            .known()
            .iter()
            .filter(|(uid, _)| !seen.contains(*uid))
            .map(|(u, k)| (u.clone(), k.clone()))
            .collect();
        for (uid, known) in vanished {
            self.outbox
                .wait_for_room()
                .await
                .map_err(|e| self.outbox_stop(e))?;
            self.m.synthetic_deletes.inc();
            let change = Some(Change::Remove { uid: uid.clone() });
            if !self.channel.forwards(EventType::Deleted) {
                self.outbox.pass(None, change);
                continue;
            }
            let meta = ObjectMeta {
                kind: self.kind.clone(),
                api_version: self.api_version.clone(),
                name: known.name,
                namespace: known.namespace,
                uid,
                resource_version: known.rv,
            };
            let object = envelope::reference_object(&meta);
            let a = Announcement::inferred_delete(meta, list_rv);
            self.outbox
                .send(a, &object, Instant::now(), None, change)
                .await
                .map_err(|e| self.outbox_stop(e))?;
        }
        // Everything the resync produced is in Kafka before its end is marked.
        self.outbox
            .wait_until(0)
            .await
            .map_err(|e| self.outbox_stop(e))?;
        let object = envelope::bookmark_object(
            &self.api_version,
            &self.kind,
            list_rv,
            Some(("watchrelay.io/resync-end", "true")),
        );
        let a = Announcement::marker("resync-end", &self.id, ObjectMeta::default(), list_rv, true);
        self.outbox
            .send(
                a,
                &object,
                Instant::now(),
                Some(list_rv.to_string()),
                Some(Change::Complete),
            )
            .await
            .map_err(|e| self.outbox_stop(e))
    }

    async fn watch(&mut self, at: &Cursor, open: Option<kubeapi::Watch>) -> Step {
        let mut w = match open {
            Some(w) => w,
            None => match self.open(WatchFrom::Version(&at.rv)).await {
                Ok(w) => w,
                Err(why) => return Self::stopped(why),
            },
        };
        self.set_phase(Phase::Watching);
        let mut reading = Reading::Live { at: None };
        let why = match self.read(&mut w, &mut reading).await {
            Ok(_) => Stop::Closed,
            Err(why) => why,
        };
        let Reading::Live { at } = reading else {
            unreachable!("a live watch stays live")
        };
        Outcome::Stopped { why, at }
    }

    /// Reads `w` until it ends, fails, or (while reading an initial state) the state has ended:
    /// then `Ok(Some(rv))`. Delivery reports come first; lines are read only while there is room.
    async fn read(
        &mut self,
        w: &mut kubeapi::Watch,
        reading: &mut Reading,
    ) -> Result<Option<String>, Stop> {
        loop {
            let room = self.outbox.has_room();
            let moved = self.outbox.moved();
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return Err(Stop::Cancelled),
                report = self.outbox.report() => {
                    if let Err(e) = self.outbox.settle(report).await {
                        return Err(self.outbox_stop(e));
                    }
                }
                _ = &mut self.publish, if moved => self.publish_checkpoint(),
                line = w.next_line(), if room => match line {
                    Ok(Some(line)) => {
                        if let Some(rv) = self.on_line(&line, reading).await? {
                            return Ok(Some(rv));
                        }
                        // Lines already received are handled without another trip through
                        // the select; reports still come first once room runs out.
                        while self.outbox.has_room() {
                            let Some(line) = w.buffered_line() else { break };
                            if let Some(rv) = self.on_line(&line, reading).await? {
                                return Ok(Some(rv));
                            }
                        }
                    }
                    Ok(None) => return Ok(None),
                    Err(e) => return Err(self.api_stop(e)),
                }
            }
        }
    }

    async fn on_line(
        &mut self,
        line: &[u8],
        reading: &mut Reading,
    ) -> Result<Option<String>, Stop> {
        let arrived = Instant::now();
        let buf = std::mem::take(&mut self.object_buf);
        let mut ev = match decode::decode_line_into(line, self.trim, buf) {
            Ok(ev) => ev,
            Err(e) => {
                self.m.malformed.inc();
                let position = match reading {
                    Reading::Live { at } => at.as_deref(),
                    Reading::Initial { .. } => None,
                };
                let preview = String::from_utf8_lossy(&line[..line.len().min(120)]).into_owned();
                tracing::warn!(stream = %self.id, ?position, error = %e, %preview, "malformed watch line; resuming from the last good position");
                return Err(Stop::Malformed);
            }
        };
        self.m.received[ev.event_type.index()].inc();
        let result = self.on_event(&mut ev, arrived, reading).await;
        self.object_buf = ev.object;
        result
    }

    async fn on_event(
        &mut self,
        ev: &mut WatchEvent,
        arrived: Instant,
        reading: &mut Reading,
    ) -> Result<Option<String>, Stop> {
        let rv = ev.meta.resource_version.clone();
        match (ev.event_type, reading) {
            (EventType::Error, _) => Err(match ev.status_code {
                Some(410) => Stop::Gone,
                code => Stop::Api(ApiError::Status {
                    code: code.unwrap_or(500),
                    reason: "WatchError".into(),
                    message: String::from_utf8_lossy(&ev.object).into_owned(),
                    retry_after: None,
                }),
            }),
            // Not a position yet: the state before it is still arriving.
            (EventType::Bookmark, Reading::Initial { .. }) if !ev.initial_events_end => Ok(None),
            (EventType::Bookmark, Reading::Initial { reason, seen }) => {
                let (reason, seen) = (*reason, std::mem::take(seen));
                let objects = seen.len();
                self.finish_sync(seen, reason, &rv).await?;
                tracing::info!(stream = %self.id, objects, %rv, resync = reason == Reason::Resync, "initial events ended");
                Ok(Some(rv))
            }
            (EventType::Bookmark, Reading::Live { at }) => {
                *at = Some(rv.clone());
                if self.channel.forwards(EventType::Bookmark) {
                    let meta = std::mem::take(&mut ev.meta);
                    let a = Announcement::marker("bookmark", &self.id, meta, &rv, false);
                    self.outbox
                        .send(a, &ev.object, arrived, Some(rv), None)
                        .await
                        .map_err(|e| self.outbox_stop(e))?;
                } else {
                    self.outbox.pass(Some(rv), None);
                }
                Ok(None)
            }
            (t, reading) => {
                if self.kind.is_empty() {
                    self.kind = ev.meta.kind.clone();
                }
                let change = if t == EventType::Deleted {
                    Some(Change::Remove {
                        uid: ev.meta.uid.clone(),
                    })
                } else {
                    upsert(&ev.meta)
                };
                match reading {
                    // The initial state (sent as ADDED): like list items, no position until all
                    // of it has been announced.
                    Reading::Initial { reason, seen } => {
                        if t == EventType::Deleted {
                            seen.remove(&ev.meta.uid);
                        } else {
                            seen.insert(ev.meta.uid.clone());
                        }
                        let resync = *reason == Reason::Resync;
                        self.emit(ev, arrived, None, change, resync).await?;
                    }
                    Reading::Live { at } => {
                        *at = Some(rv.clone());
                        self.emit(ev, arrived, Some(rv), change, false).await?;
                    }
                }
                Ok(None)
            }
        }
    }

    /// Publishes an object event if its type is forwarded; either way it takes its place in the
    /// order of the outbox.
    async fn emit(
        &mut self,
        ev: &mut WatchEvent,
        arrived: Instant,
        position: Option<String>,
        change: Option<Change>,
        resync: bool,
    ) -> Result<(), Stop> {
        if !self.channel.forwards(ev.event_type) {
            self.m.filtered.inc();
            self.outbox.pass(position, change);
            return Ok(());
        }
        let a = Announcement::change(ev.event_type, std::mem::take(&mut ev.meta), resync);
        self.outbox
            .send(a, &ev.object, arrived, position, change)
            .await
            .map_err(|e| self.outbox_stop(e))
    }

    /// Drains the outbox, publishes the final checkpoint and removes the stream's gauges.
    async fn stop(mut self) -> Reporter {
        self.set_phase(Phase::Stopped);
        let flush = Duration::from_secs(self.cfg.kafka.flush_timeout_seconds);
        let left = self.outbox.drain(tokio::time::Instant::now() + flush).await;
        if left > 0 {
            tracing::warn!(stream = %self.id, in_flight = left, "stopping with undelivered records; they will be replayed");
        }
        self.publish_checkpoint();
        for gauge in [&self.metrics.stream_up, &self.metrics.in_flight] {
            let _ = gauge.remove_label_values(&[&self.id]);
        }
        self.reporter
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
