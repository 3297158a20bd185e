//! The Watch step, and reading an open watch: lines to events, events to announcements handed
//! to the outbox, with delivery reports settled first and the checkpoint published as it moves.
//! Also the other steps that read without syncing: a backoff's wait, and waiting for a custom
//! resource to be served.

use std::time::{Duration, Instant};

use super::feed::Feed;
use super::{join, Reading, Step, Stream};
use crate::decode;
use crate::envelope::Announcement;
use crate::event::WatchEvent;
use crate::event::{comparable, EventType};
use crate::kubeapi::{self, ApiError, WatchFrom};
use crate::membership::Change;
use crate::producer::Inbox;
use crate::registry::Phase;
use crate::stream::machine::{Cursor, Outcome, Reason, Stop};

impl Stream {
    /// Reads `w` until it ends, fails, or (while reading an initial state) the state has ended:
    /// then `Ok(Some(rv))`. Delivery reports come first; lines are read only while there is room.
    pub(super) async fn read(
        &mut self,
        w: &mut Feed,
        reading: &mut Reading,
    ) -> Result<Option<String>, Stop> {
        let idle_after = self.timers.idle_after;
        let rearm = |idle: &mut std::pin::Pin<Box<tokio::time::Sleep>>| {
            idle.as_mut()
                .reset(tokio::time::Instant::now() + idle_after)
        };
        rearm(&mut self.timers.idle);
        let live = matches!(reading, Reading::Live { .. });
        if live && self.scope.as_ref().is_some_and(|s| s.moved()) {
            self.rescope().await?;
        }
        if let (true, Some(scoped)) = (live, self.scope.as_mut()) {
            scoped.floor_passed();
        }
        loop {
            let room = self.outbox.has_room();
            // A sync waiting for Kafka lends its permit meanwhile.
            if room {
                self.syncs.reclaim(&self.life.stop).await?;
            } else {
                self.syncs.lend();
            }
            let moved = self.outbox.moved();
            let acks = (!room).then(|| self.outbox.acknowledgements());
            tokio::select! {
                biased;
                _ = self.life.stop.cancelled() => return Err(Stop::Cancelled),
                report = self.outbox.report() => {
                    // Every report taken with it is settled in the same pass.
                    let mut next = Some(report);
                    while let Some(report) = next {
                        if let Err(e) = self.outbox.settle(report).await {
                            return Err(e.into());
                        }
                        next = self.outbox.ready_report();
                    }
                    // Idle time counts only while the stream reads: not while Kafka holds it.
                    if !room {
                        rearm(&mut self.timers.idle);
                    }
                }
                // Kafka acknowledged an entry its transaction holds: room again, maybe.
                () = acknowledged(acks.as_deref()), if !room => {}
                _ = &mut self.timers.publish, if moved => {
                    self.publish_checkpoint();
                }
                delta = self.reporter.resync_requested() => {
                    self.position.full_resync = !delta;
                    return Err(Stop::Requested);
                }
                _ = super::scope::changed(&mut self.scope), if live => self.rescope().await?,
                _ = &mut self.timers.idle, if room => return Err(Stop::Stalled),
                line = w.next_line(), if room => match line {
                    Ok(Some(line)) => {
                        self.m.last_event.set(crate::metrics::unix_now());
                        rearm(&mut self.timers.idle);
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
                    Err(e) => return Err(self.api_stopped(e)),
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
        let buf = std::mem::take(&mut self.source.object_buf);
        let mut ev = match decode::decode_line_into(line, self.source.trim, buf) {
            Ok(ev) => ev,
            Err(e) => {
                self.m.malformed.inc();
                // What the line said is lost: the next resync re-announces every object.
                self.position.full_resync = true;
                let position = match reading {
                    Reading::Live { at } => at.as_deref(),
                    Reading::Initial { .. } | Reading::TakeIn { .. } => None,
                };
                // Skipped: it can never be processed, and reading it again would only loop. The
                // position stays where the last good event left it. Its content may be a
                // Secret's: it is logged at debug level only.
                tracing::warn!(stream = %self.id, ?position, bytes = line.len(), error = %e, "skipping a watch line that cannot be processed");
                tracing::debug!(stream = %self.id, content = %String::from_utf8_lossy(line), "the skipped line");
                self.source.object_buf = Vec::new();
                return Ok(None);
            }
        };
        self.m.received[ev.event_type.index()].inc();
        let result = self.on_event(&mut ev, arrived, reading).await;
        self.source.object_buf = ev.object;
        result
    }

    async fn on_event(
        &mut self,
        ev: &mut WatchEvent,
        arrived: Instant,
        reading: &mut Reading,
    ) -> Result<Option<String>, Stop> {
        let rv = ev.meta.resource_version().to_string();
        match (ev.event_type, reading) {
            (EventType::Error, _) => Err(match ev.status_code {
                Some(410) => Stop::Gone,
                code => self.api_stopped(ApiError::Status {
                    code: code.unwrap_or(500),
                    reason: "WatchError".into(),
                    message: String::from_utf8_lossy(&ev.object).into_owned(),
                    retry_after: None,
                }),
            }),
            // Not a position yet: the state before it is still arriving.
            (EventType::Bookmark, Reading::Initial { .. } | Reading::TakeIn { .. })
                if !ev.initial_events_end =>
            {
                Ok(None)
            }
            // Every object of the state was taken in or passed over.
            (EventType::Bookmark, Reading::TakeIn { .. }) => Ok(Some(rv)),
            (EventType::Bookmark, Reading::Initial { announced, .. }) if announced.rewound(&rv) => {
                // The state is older than the position (an etcd restore): what the delta
                // skipped as unchanged may be back at another version.
                tracing::warn!(stream = %self.id, %rv, "the initial events ended below the stream's position");
                Err(Stop::Rewound)
            }
            (
                EventType::Bookmark,
                Reading::Initial {
                    reason, announced, ..
                },
            ) => {
                let (reason, announced) = (*reason, std::mem::take(announced));
                let (objects, unchanged) = (announced.len(), announced.skipped());
                self.finish_sync(announced, reason, &rv).await?;
                tracing::info!(stream = %self.id, objects, unchanged, %rv, resync = reason == Reason::Resync, "initial events ended");
                Ok(Some(rv))
            }
            (EventType::Bookmark, Reading::Live { at }) => {
                *at = Some(rv.clone());
                if self.channel.forwards(EventType::Bookmark) {
                    let meta = std::mem::take(&mut ev.meta);
                    let a = Announcement::marker("bookmark", &self.id, meta, &rv, false);
                    self.outbox
                        .send(a, &ev.object, arrived, Some(rv), None)
                        .await?;
                } else {
                    self.outbox.pass(Some(rv), None).await?;
                }
                Ok(None)
            }
            (t, reading) => {
                if self.source.kind.is_empty() {
                    self.source.kind = ev.meta.kind().to_string();
                }
                let change = if t == EventType::Deleted {
                    Some(Change::Leave {
                        uid: ev.meta.uid().to_string(),
                    })
                } else {
                    Some(Change::Announced)
                };
                match reading {
                    // The initial state (sent as ADDED): like list items, no position until all
                    // of it has been announced.
                    Reading::Initial { .. } if !self.holds(&ev.meta) => {}
                    Reading::Initial {
                        reason,
                        announced,
                        relisting,
                    } => {
                        // Noted once handed over (the emit takes the object's identity with
                        // it), and only what is announced.
                        let noted = if t == EventType::Deleted {
                            announced.remove(ev.meta.uid());
                            None
                        } else {
                            self.announce_replacement(announced, &ev.meta).await?;
                            if relisting.again(ev.meta.uid(), ev.meta.resource_version())
                                || announced.unchanged(&ev.meta, self.outbox.members())
                            {
                                return Ok(None);
                            }
                            relisting.now.keeps().then(|| {
                                (
                                    ev.meta.uid().to_string(),
                                    ev.meta.resource_version().to_string(),
                                )
                            })
                        };
                        let resync = *reason == Reason::Resync;
                        self.emit(ev, arrived, None, change, resync).await?;
                        if let Some((uid, rv)) = noted {
                            relisting.now.note(&uid, &rv);
                        }
                    }
                    // The state's objects the position does not cover; the watch from there
                    // publishes the rest.
                    Reading::TakeIn {
                        floor,
                        covered,
                        objects,
                    } => {
                        if t == EventType::Added && self.takes_in(&ev.meta, *floor, covered) {
                            *objects += 1;
                            self.emit(ev, arrived, None, change, false).await?;
                        }
                    }
                    Reading::Live { at } => {
                        *at = Some(rv.clone());
                        let ns = ev.meta.namespace();
                        let admitted = self.scope.as_ref().is_none_or(|s| s.holds(ns))
                            && self.fences.admits(ns, ev.meta.resource_version());
                        if admitted {
                            self.emit(ev, arrived, Some(rv), change, false).await?;
                        } else {
                            // Out of scope (or already covered by its namespace's entry list):
                            // only the position moves.
                            self.outbox.pass(Some(rv), None).await?;
                        }
                    }
                }
                Ok(None)
            }
        }
    }

    /// Publishes an object event if its type is forwarded; either way it takes its place in the
    /// order of the outbox.
    pub(super) async fn emit(
        &mut self,
        ev: &mut WatchEvent,
        arrived: Instant,
        position: Option<String>,
        change: Option<Change>,
        resync: bool,
    ) -> Result<(), Stop> {
        if !self.channel.forwards(ev.event_type) {
            self.m.filtered.inc();
            // An object whose changes are filtered joins all the same when its deletion is
            // forwarded, so a deletion missed while down is still announced.
            let change = match change {
                Some(Change::Announced) if self.channel.forwards(EventType::Deleted) => {
                    join(&ev.meta, self.outbox.route())
                }
                Some(Change::Announced) => None,
                change => change,
            };
            return self.outbox.pass(position, change).await.map_err(Stop::from);
        }
        let a = Announcement::change(ev.event_type, std::mem::take(&mut ev.meta), resync);
        self.outbox
            .send(a, &ev.object, arrived, position, change)
            .await
            .map_err(Stop::from)
    }
}

/// The steps that read without syncing: a backoff's wait, waiting for a custom resource to be
/// served, and the Watch.
impl Stream {
    pub(super) async fn wait(&mut self, delay: Duration) -> Step {
        // Nothing is read while waiting: what was acknowledged so far is published now.
        self.publish_checkpoint();
        tokio::select! {
            _ = self.life.stop.cancelled() => Self::stopped(Stop::Cancelled),
            _ = tokio::time::sleep(delay) => Outcome::Waited,
        }
    }

    pub(super) async fn await_resource(&mut self) -> Step {
        let p = &self.channel.path;
        let api_version = p.api_version();
        let exists = kubeapi::resource_exists(&self.client, &api_version, &p.resource);
        let exists = tokio::select! {
            _ = self.life.stop.cancelled() => return Self::stopped(Stop::Cancelled),
            r = exists => r,
        };
        match exists {
            Ok(true) => Outcome::Served {
                checkpoint: self.resume_from(),
            },
            Ok(false) => Self::stopped(Stop::NotServed),
            Err(e) => Self::stopped(Stop::Api(e)),
        }
    }

    /// Opens a watch, unless cancelled first. A fanned-out part subscribes to its hub instead:
    /// for its initial events, or to resume after its position, as a watch from there (the hub
    /// reopens its shared watch from the lowest position its parts need; a position the server
    /// no longer holds reads as a 410, as from a watch of its own).
    pub(super) async fn open(&self, from: WatchFrom<'_>) -> Result<Feed, Stop> {
        if let Some(f) = &self.source.fanned {
            let from = match from {
                WatchFrom::InitialEvents => None,
                WatchFrom::Version(rv) => Some(rv),
            };
            return Ok(Feed::Fanned(f.fanouts.subscribe(
                &f.collection,
                f.shard,
                from,
            )));
        }
        let query = self.query();
        let opened = kubeapi::watch(
            &self.client,
            &self.source.path,
            &query,
            from,
            self.cfg.kubernetes.watch_timeout_seconds,
        );
        tokio::select! {
            _ = self.life.stop.cancelled() => Err(Stop::Cancelled),
            w = opened => w.map(Feed::Api).map_err(|e| self.api_stopped(e)),
        }
    }

    pub(super) async fn watch(&mut self, at: &Cursor, open: Option<Feed>) -> Step {
        if let Some(covered) = self.position.covered.clone() {
            // Before the watch from the position: what it does not cover (see `take_in`). A
            // position that does not compare cannot tell: a resync takes everything in.
            let taken = match comparable(&at.rv) {
                Some(floor) => self.take_in(floor, covered).await,
                None => Err(Stop::Requested),
            };
            if let Err(why) = taken {
                return Self::stopped(why);
            }
        }
        let mut w = match open {
            Some(w) => w,
            None => match self.open(WatchFrom::Version(&at.rv)).await {
                Ok(w) => w,
                Err(why) => return Self::stopped(why),
            },
        };
        self.set_phase(Phase::Watching);
        // Staleness counts from the first watch; reopening a stalled one does not reset it.
        if self.m.last_event.get() == 0 {
            self.m.last_event.set(crate::metrics::unix_now());
        }
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
}

/// Waits for [`Inbox::held_more`] of `inbox`, if any.
async fn acknowledged(inbox: Option<&Inbox>) {
    match inbox {
        Some(inbox) => inbox.held_more().await,
        None => std::future::pending().await,
    }
}
