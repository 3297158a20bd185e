//! The Sync steps: announcing a stream's whole current state, through a `sendInitialEvents`
//! watch or paginated lists, and reconciling it with what the stream had announced before.
//!
//! # Delta resyncs
//! After a 410 the stream's acknowledged position says which versions consumers already hold:
//! every event up to it is in Kafka. A member whose resourceVersion is not newer than that
//! position has not changed since it was last published, so a resync does not publish it again;
//! objects that are not members, or are newer, are re-announced as before, and inferred DELETEDs
//! and the resync-end marker are unchanged. This compares resourceVersions as integers, which
//! Kubernetes guarantees for one resource since 1.35 (KEP-5504); where the position or an
//! object's version is not a decimal integer, the object is re-announced (and the resync counted
//! in `resync_full_fallbacks_total`). Without a position (a changed query, a first sync) and on
//! a requested full resync, every object is re-announced.
//!
//! # When the history went back
//! An etcd restore brings objects back at the versions they had at the snapshot, at or below
//! positions the stream already passed: a delta would skip them as unchanged. A 504 "Too large
//! resource version" on a watch is not such a sign by itself (a lagging watch cache answers the
//! same): it leads to a delta resync, which a list older than the position makes full. Every
//! sign of a rewind makes the next resync full:
//! - a list, or the end of the initial events, older than the position (the delta is then
//!   abandoned, or the sync started over whole);
//! - the checkpoint ConfigMap found behind what the relay last wrote, or behind the copy of its
//!   write counter in the membership topic (see [`crate::checkpoint::WRITES_KEY`]);
//! - a watch line or list item skipped as malformed: what it said is lost.

use std::time::Instant;

use super::relist::Relisting;
use super::{Announced, Reading, Step, Stream};
use crate::decode;
use crate::envelope::{self, Announcement};
use crate::event::EventType;
use crate::event::{Identity, Meta, WatchEvent};
use crate::kubeapi::{self, ApiError, WatchFrom};
use crate::membership::Key;
use crate::membership::{Change, Known};
use crate::stream::machine::{self, Outcome, PageFailure, Reason, Stop};

impl Stream {
    /// Bookkeeping for a sync of `reason`: a resync with an acknowledged position is a delta,
    /// unless a full one was requested. Call with nothing in flight.
    pub(super) fn announced(&self, reason: Reason) -> Announced {
        match reason {
            Reason::Resync => {
                let mut a = Announced::new(Some(self.outbox.members()));
                // While objects are still to be taken in, a member below the position may have
                // had its record lost (see `take_in`): nothing is skipped as unchanged.
                if let Some(position) = self
                    .outbox
                    .checkpoint()
                    .filter(|_| !self.position.full_resync && self.position.covered.is_none())
                {
                    a.since(position);
                }
                a
            }
            Reason::Start => Announced::new(None),
        }
    }

    /// One page of the collection at `path` under the channel's selectors, unless the stream
    /// stops first.
    pub(super) async fn list_page(
        &self,
        path: &str,
        size: Option<u32>,
        token: Option<&str>,
    ) -> Result<Result<kubeapi::ListPage, ApiError>, Stop> {
        let query = self.query();
        let page = kubeapi::list_page(&self.client, path, &query, size, token);
        tokio::select! {
            _ = self.life.stop.cancelled() => Err(Stop::Cancelled),
            p = page => Ok(p),
        }
    }

    /// Every page of the collection, fetched back to back before anything is announced, as one
    /// page: with no wait for Kafka between pages, the snapshot's continue token outlives the
    /// listing, and no request is larger or slower than a page (a whole list in one request
    /// can take the server longer than the client's read timeout, and never finish).
    async fn list_all(&self) -> Result<Result<kubeapi::ListPage, ApiError>, Stop> {
        let size = Some(self.cfg.kubernetes.list_page_size);
        let mut all = match self.list_page(&self.source.path, size, None).await? {
            Ok(p) => p,
            Err(e) => return Ok(Err(e)),
        };
        while let Some(token) = all.continue_token.take() {
            match self
                .list_page(&self.source.path, size, Some(&token))
                .await?
            {
                Ok(p) => {
                    all.items.extend(p.items);
                    all.continue_token = p.continue_token;
                }
                Err(e) => return Ok(Err(e)),
            }
        }
        Ok(Ok(all))
    }

    /// Lists `path` page by page and announces each item `keep` takes (as ADDED, joining the
    /// members, with no position): the list's resourceVersion, and how many it announced.
    /// `keep` may stop the list (an object it cannot judge); an API error comes back as is.
    pub(super) async fn announce_list(
        &mut self,
        path: &str,
        mut keep: impl FnMut(&Stream, &Meta) -> Result<bool, Stop>,
    ) -> Result<Result<(String, usize), ApiError>, Stop> {
        let mut token: Option<String> = None;
        let mut objects = 0;
        loop {
            let size = Some(self.cfg.kubernetes.list_page_size);
            let page = match self.list_page(path, size, token.as_deref()).await? {
                Ok(p) => p,
                Err(e) => return Ok(Err(e)),
            };
            self.learn_kind(&page);
            for item in &page.items {
                let Some(mut ev) = self.listed(item).await? else {
                    continue;
                };
                if !keep(self, &ev.meta)? {
                    continue;
                }
                objects += 1;
                let change = Some(Change::Announced);
                self.emit(&mut ev, Instant::now(), None, change, false)
                    .await?;
            }
            match page.continue_token {
                Some(c) => token = Some(c),
                None => return Ok(Ok((page.resource_version, objects))),
            }
        }
    }

    /// Learns the kind of the channel's objects from a list page (`PodList`: `Pod`).
    pub(super) fn learn_kind(&mut self, page: &kubeapi::ListPage) {
        if let Some(k) = page.kind.strip_suffix("List") {
            self.source.kind = k.to_string();
        }
    }

    /// Once the outbox has room: a list item as the ADDED event a sync announces; `None`
    /// (counted and logged) when it cannot be decoded.
    pub(super) async fn listed(
        &mut self,
        item: &serde_json::value::RawValue,
    ) -> Result<Option<WatchEvent>, Stop> {
        self.room().await?;
        let type_meta = (self.source.api_version.as_str(), self.source.kind.as_str());
        match decode::decode_item(EventType::Added, item, self.source.trim, type_meta) {
            Ok(ev) => Ok(Some(ev)),
            Err(e) => {
                self.m.malformed.inc();
                self.position.full_resync = true;
                tracing::warn!(stream = %self.id, error = %e, "skipping an undecodable list item");
                Ok(None)
            }
        }
    }

    /// Whether an object belongs to the state a sync announces: always, but for a filtered
    /// stream's objects of namespaces out of its scope.
    pub(super) fn holds(&self, meta: &Meta) -> bool {
        self.scope
            .as_ref()
            .is_none_or(|s| s.holds(meta.namespace()))
    }

    /// Before announcing `meta` in a sync: the inferred DELETED of the known object whose name
    /// it took, if any.
    pub(super) async fn announce_replacement(
        &mut self,
        announced: &mut Announced,
        meta: &Meta,
    ) -> Result<(), Stop> {
        // The old object's DELETED takes the version just below the new one's: it was deleted
        // before the new one was created, and a consumer keeping each key's highest version
        // must keep the new object, not the DELETED.
        let rv = meta.resource_version();
        let before = crate::event::comparable(rv)
            .and_then(|v| v.checked_sub(1))
            .map_or_else(|| rv.to_string(), |v| v.to_string());
        for (old, known) in announced.add(meta, self.outbox.members()) {
            tracing::info!(stream = %self.id, name = %meta.name(), old = %old, new = %meta.uid(), "object recreated under its name while unseen; deleting the old one first");
            self.infer_delete(old, known, &before).await?;
        }
        Ok(())
    }

    /// Publishes the inferred DELETED of a known object (or only forgets it, when DELETED is not
    /// forwarded).
    pub(super) async fn infer_delete(
        &mut self,
        uid: String,
        known: Known,
        rv: &str,
    ) -> Result<(), Stop> {
        self.room().await?;
        self.m.synthetic_deletes.inc();
        let change = Some(Change::Leave { uid: uid.clone() });
        if !self.channel.forwards(EventType::Deleted) {
            return self.outbox.pass(None, change).await.map_err(Stop::from);
        }
        let meta = known.meta(&uid, &self.source.kind, &self.source.api_version);
        let (topic, key) = known.place(&meta, self.outbox.route());
        self.outbox
            .retract(meta, rv, &topic, &key)
            .await
            .map_err(Stop::from)
    }

    /// Sync through a `sendInitialEvents` watch: the current state, then changes, on one
    /// connection, handed on to the Watch state once the state has ended.
    pub(super) async fn sync_initial(&mut self, reason: Reason) -> Step {
        if reason == Reason::Resync {
            if let Err(why) = self.drained().await {
                return Self::stopped(why);
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
            announced: self.announced(reason),
            relisting: Box::new(self.relisting()),
        };
        let read = self.read(&mut w, &mut reading).await;
        // Cut before its state ended: what it announced is left for the next.
        if let (Ok(None) | Err(_), Reading::Initial { relisting, .. }) = (&read, reading) {
            self.relist = Some(relisting.now);
        }
        match read {
            Ok(Some(rv)) => Outcome::Synced { rv, open: Some(w) },
            Ok(None) => Self::stopped(Stop::Closed),
            Err(why) => Self::stopped(why),
        }
    }

    /// Sync through paginated lists.
    pub(super) async fn sync_pages(&mut self, reason: Reason) -> Step {
        match self.list(reason).await {
            Ok(rv) => Outcome::Synced { rv, open: None },
            Err(why) => Self::stopped(why),
        }
    }

    /// A list (see [`Stream::list_noting`]); one that fails midway leaves what it announced
    /// for the list that starts over after it (see [`super::relist`]).
    async fn list(&mut self, reason: Reason) -> Result<String, Stop> {
        let mut relisting = None;
        let listed = self.list_noting(reason, &mut relisting).await;
        if listed.is_err() {
            self.relist = relisting.map(|r| r.now);
        }
        listed
    }

    /// The list that begins now, carrying on from the stream's last one if that failed
    /// midway.
    pub(super) fn relisting(&mut self) -> Relisting {
        let (from, rewinds, era) = (
            self.outbox.checkpoint(),
            self.outbox.rewinds(),
            self.outbox.era(),
        );
        Relisting::begin(self.relist.take(), from, rewinds, era)
    }

    /// The whole current state, page by page, each object announced unless a delta resync
    /// finds it unchanged or the list this one starts over after announced it at its version
    /// already; `relisting` notes what this one announced.
    async fn list_noting(
        &mut self,
        mut reason: Reason,
        relisting: &mut Option<Relisting>,
    ) -> Result<String, Stop> {
        if reason == Reason::Resync {
            self.drained().await?;
        }
        let relisting = relisting.insert(self.relisting());
        let mut announced = self.announced(reason);
        let mut token: Option<String> = None;
        // Paginated, unless a continue token expired: the snapshot it pinned outlived its
        // lifetime (a large state, a slow consumer), and starting over with pages could do the
        // same forever. Every page is then fetched before any is announced (see `list_all`).
        let mut whole = false;
        let list_rv = loop {
            let page = if whole {
                self.list_all().await?
            } else {
                let size = Some(self.cfg.kubernetes.list_page_size);
                self.list_page(&self.source.path, size, token.as_deref())
                    .await?
            };
            let page = match page
                .map_err(|e| machine::page_failed(e, token.is_some(), self.channel.builtin))
            {
                Ok(p) => p,
                Err(PageFailure::Refetch) => {
                    tracing::info!(stream = %self.id, "continue token expired; fetching every page before announcing");
                    self.metrics
                        .watch_restarts
                        .with_label_values(&[&self.id, "continue_expired"])
                        .inc();
                    token = None;
                    whole = true;
                    // What the earlier pages announced is reconciled with the whole list: an
                    // object they showed that has gone since gets its inferred DELETED.
                    self.drained().await?;
                    reason = Reason::Resync;
                    announced = self.announced(reason);
                    continue;
                }
                Err(PageFailure::Stop(why)) => return Err(why),
            };
            self.learn_kind(&page);
            if announced.rewound(&page.resource_version) {
                tracing::warn!(stream = %self.id, rv = %page.resource_version, "the list is older than the stream's position (an etcd restore?); re-announcing every object");
                announced.full();
                relisting.forget_earlier();
                // As for any full resync: a crash midway must not resume from the position.
                if !self.forget_position().await {
                    return Err(Stop::Cancelled);
                }
            }
            for item in &page.items {
                let Some(mut ev) = self.listed(item).await? else {
                    continue;
                };
                if !self.holds(&ev.meta) {
                    continue;
                }
                self.announce_replacement(&mut announced, &ev.meta).await?;
                if relisting.again(ev.meta.uid(), ev.meta.resource_version())
                    || announced.unchanged(&ev.meta, self.outbox.members())
                {
                    continue;
                }
                // Noted once handed over (the emit takes the object's identity with it).
                let noted = relisting.now.keeps().then(|| {
                    (
                        ev.meta.uid().to_string(),
                        ev.meta.resource_version().to_string(),
                    )
                });
                let change = Some(Change::Announced);
                self.emit(
                    &mut ev,
                    Instant::now(),
                    None,
                    change,
                    reason == Reason::Resync,
                )
                .await?;
                if let Some((uid, rv)) = noted {
                    relisting.now.note(&uid, &rv);
                }
            }
            match page.continue_token {
                Some(c) => token = Some(c),
                None => break page.resource_version,
            }
        };
        let (objects, unchanged) = (announced.len(), announced.skipped());
        self.finish_sync(announced, reason, &list_rv).await?;
        tracing::info!(stream = %self.id, objects, unchanged, rv = %list_rv, resync = reason == Reason::Resync, "listed");
        Ok(list_rv)
    }

    /// The whole current state has been announced, consistent as of `list_rv`. After a resync,
    /// known objects it lacks get an inferred DELETED and the end is marked; either way the
    /// stream's position becomes `list_rv` once everything before it is acknowledged.
    pub(super) async fn finish_sync(
        &mut self,
        mut announced: Announced,
        reason: Reason,
        list_rv: &str,
    ) -> Result<(), Stop> {
        self.position.full_resync = false;
        self.m.unchanged.inc_by(announced.skipped() as u64);
        if announced.incomparable {
            self.m.full_fallbacks.inc();
        }
        if reason == Reason::Start {
            return self
                .outbox
                .pass(Some(list_rv.to_string()), None)
                .await
                .map_err(Stop::from);
        }
        announced.end();
        let vanished: Vec<Key> = self
            .outbox
            .members()
            .keys()
            .filter(|k| announced.vanished(k))
            .collect();
        drop(announced);
        for k in vanished {
            let Some((uid, known)) = self.outbox.members().get_key(&k) else {
                continue;
            };
            self.infer_delete(uid, known, list_rv).await?;
        }
        // Everything the resync produced is in Kafka before its end is marked.
        self.drained().await?;
        let object = envelope::bookmark_object(
            &self.source.api_version,
            &self.source.kind,
            list_rv,
            Some(("watchrelay.io/resync-end", "true")),
        );
        // The marker's identity is its object's (apiVersion and kind), so a reference to it
        // says the same.
        let meta = Meta::new(Identity {
            api_version: &self.source.api_version,
            kind: &self.source.kind,
            ..Identity::default()
        });
        let a = Announcement::marker("resync-end", &self.id, meta, list_rv, true);
        self.outbox
            .send(a, &object, Instant::now(), Some(list_rv.to_string()), None)
            .await
            .map_err(Stop::from)
    }
}
