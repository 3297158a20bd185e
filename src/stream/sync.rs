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
//! positions the stream already passed: a delta would skip them as unchanged. Every sign of a
//! rewind makes the next resync full:
//! - a list, or the end of the initial events, older than the position (the delta is then
//!   abandoned, or the sync started over whole);
//! - a 504 "Too large resource version" (the position is ahead of the server);
//! - the checkpoint ConfigMap found behind what the relay last wrote, or behind the copy of its
//!   write counter in the membership topic (see [`crate::checkpoint::WRITES_KEY`]);
//! - a watch line or list item skipped as malformed: what it said is lost.

use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::time::Instant;

use super::{Reading, Step, Stream};
use crate::decode;
use crate::envelope::{self, Announcement};
use crate::event::EventType;
use crate::event::{Identity, Meta, WatchEvent};
use crate::kubeapi::{self, ApiError, WatchFrom};
use crate::membership::{Change, Known};
use crate::membership::{Key, Members};
use crate::stream::machine::{self, Outcome, PageFailure, Reason, Stop};

/// What a Sync has announced so far, against what the stream knew before it.
///
/// A resync may find an object under a name the stream knows with another uid (deleted and
/// created again while the stream could not see it). The old uid's inferred DELETED must then
/// come before the new uid's ADDED on that key, or a consumer keyed by name (or a compacted
/// topic) would end up deleting a live object.
///
/// Its memory is a few dozen bytes per object whatever the objects, so a resync of a million
/// members stays within the chart's memory limit: uids are kept as the members' 16-byte keys,
/// and names as 8-byte hashes resolved against the members.
#[derive(Default)]
pub struct Announced {
    /// Keys of the uids of the new state; sorted once it has ended ([`Announced::end`]).
    seen: Vec<Key>,
    /// Of those, objects deleted before the state ended (an initial-events watch).
    deleted: HashSet<Key>,
    /// Known objects by a hash of namespace and name, sorted (a resync only): more than one
    /// when a member too many shares a live object's name, or names collide.
    by_name: Vec<(u64, Key)>,
    /// Known objects already given their inferred DELETED because another uid took their name.
    replaced: HashSet<Key>,
    /// A delta resync: the acknowledged position, as an integer.
    floor: Option<u64>,
    /// Members not published again because they are unchanged since `floor`.
    skipped: usize,
    /// The last object added took the name of a known one, whose inferred DELETED now goes
    /// first on its key: that object is published whatever its version.
    took_name: Option<Key>,
    /// A resourceVersion that is not a decimal integer was met: re-announced whole.
    incomparable: bool,
}

pub(super) use crate::event::comparable;

fn name_hash(namespace: Option<&str>, name: &str) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    (namespace, name).hash(&mut h);
    h.finish()
}

impl Announced {
    /// Bookkeeping for a sync: with `known` (a resync) replaced names are detected.
    pub fn new(known: Option<&Members>) -> Self {
        let Some(members) = known else {
            return Self::default();
        };
        let mut by_name: Vec<(u64, Key)> = Vec::with_capacity(members.len());
        by_name.extend(members.iter().map(|(uid, k)| {
            (
                name_hash(k.namespace.as_deref(), &k.name),
                Members::key(&uid),
            )
        }));
        by_name.sort_unstable();
        Self {
            seen: Vec::with_capacity(members.len()),
            by_name,
            ..Self::default()
        }
    }

    /// Records an object of the new state; returns the members it replaces (same name, another
    /// uid), each once.
    pub fn add(&mut self, meta: &Meta, members: &Members) -> Vec<(String, Known)> {
        let k = Members::key(meta.uid());
        self.seen.push(k);
        let h = name_hash(meta.namespace(), meta.name());
        let first = self.by_name.partition_point(|(x, _)| *x < h);
        let mut replaced = Vec::new();
        for &(_, old) in self.by_name[first..].iter().take_while(|(x, _)| *x == h) {
            if old == k || self.replaced.contains(&old) {
                continue;
            }
            let Some((uid, known)) = members.get_key(&old) else {
                continue;
            };
            if known.name == meta.name() && known.namespace.as_deref() == meta.namespace() {
                self.replaced.insert(old);
                replaced.push((uid, known));
            }
        }
        self.took_name = (!replaced.is_empty()).then_some(k);
        replaced
    }

    /// An object of the new state was deleted before the state ended.
    pub fn remove(&mut self, uid: &str) {
        self.deleted.insert(Members::key(uid));
    }

    /// The state has ended: what it holds can be asked ([`Announced::vanished`]).
    pub fn end(&mut self) {
        self.seen.sort_unstable();
        self.seen.dedup();
    }

    /// Members not published again, unchanged since the position.
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// Objects of the new state so far.
    pub fn len(&self) -> usize {
        self.seen.len().saturating_sub(self.deleted.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Makes this a delta resync from the acknowledged position `position`, unless it is not a
    /// decimal integer (every object is then re-announced).
    pub fn since(&mut self, position: &str) {
        self.floor = comparable(position);
        self.incomparable = self.floor.is_none();
    }

    /// Whether a state as of `list_rv` is older than the delta's position: the server's
    /// history was rewound (an etcd restore), and objects the delta skipped may be back at
    /// versions it never published.
    pub fn rewound(&self, list_rv: &str) -> bool {
        matches!((self.floor, comparable(list_rv)), (Some(floor), Some(rv)) if rv < floor)
    }

    /// Makes this a full resync: every object is re-announced.
    pub fn full(&mut self) {
        self.floor = None;
    }

    /// Whether the object need not be published again: a delta resync, a member of the stream,
    /// a version not newer than the position, and nothing published on its key in this sync
    /// (the inferred DELETED of an object whose name it took: a stale member, its membership
    /// tombstone lost). Call after [`Announced::add`].
    pub fn unchanged(&mut self, meta: &Meta, members: &Members) -> bool {
        let Some(floor) = self.floor else {
            return false;
        };
        if self.took_name == Some(Members::key(meta.uid())) {
            return false;
        }
        if !members.contains(meta.uid()) {
            return false;
        }
        match comparable(meta.resource_version()) {
            Some(rv) if rv <= floor => {
                self.skipped += 1;
                true
            }
            Some(_) => false,
            None => {
                self.incomparable = true;
                false
            }
        }
    }

    /// Whether a known object still needs its inferred DELETED once the state has ended.
    pub fn vanished(&self, k: &Key) -> bool {
        let seen = self.seen.binary_search(k).is_ok() && !self.deleted.contains(k);
        !seen && !self.replaced.contains(k)
    }
}

impl Stream {
    /// Bookkeeping for a sync of `reason`: a resync with an acknowledged position is a delta,
    /// unless a full one was requested. Call with nothing in flight.
    pub(super) fn announced(&self, reason: Reason) -> Announced {
        match reason {
            Reason::Resync => {
                let mut a = Announced::new(Some(self.outbox.members()));
                if let Some(position) = self
                    .outbox
                    .checkpoint()
                    .filter(|_| !self.position.full_resync)
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
        for (old, known) in announced.add(meta, self.outbox.members()) {
            tracing::info!(stream = %self.id, name = %meta.name(), old = %old, new = %meta.uid(), "object recreated under its name while unseen; deleting the old one first");
            self.infer_delete(old, known, meta.resource_version())
                .await?;
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
        };
        match self.read(&mut w, &mut reading).await {
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

    async fn list(&mut self, mut reason: Reason) -> Result<String, Stop> {
        if reason == Reason::Resync {
            self.drained().await?;
        }
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
                if announced.unchanged(&ev.meta, self.outbox.members()) {
                    continue;
                }
                let change = Some(Change::Announced);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(uid: &str, rv: &str) -> Meta {
        Meta::new(Identity {
            uid,
            name: uid,
            namespace: Some("a"),
            resource_version: rv,
            ..Identity::default()
        })
    }

    fn members(uids: &[&str]) -> Members {
        let mut m = Members::default();
        for uid in uids {
            let k = Known {
                name: (*uid).into(),
                namespace: Some("a".into()),
                rv: "1".into(),
                ..Known::default()
            };
            m.insert(uid, &k);
        }
        m
    }

    #[test]
    fn only_kep_5504_integers_compare() {
        assert_eq!(comparable("0"), Some(0));
        assert_eq!(comparable("18446744073709551615"), Some(u64::MAX));
        for rv in [
            "",
            "+5",
            "-5",
            "05",
            "1e3",
            "abc",
            " 5",
            "18446744073709551616",
        ] {
            assert_eq!(comparable(rv), None, "{rv:?}");
        }
    }

    #[test]
    fn a_delta_skips_members_not_newer_than_the_position() {
        let m = members(&["old", "edited"]);
        let mut a = Announced::new(Some(&m));
        a.since("100");
        for (uid, rv, skip) in [
            ("old", "100", true),
            ("edited", "101", false),
            ("new", "50", false),
        ] {
            let meta = meta(uid, rv);
            assert!(a.add(&meta, &m).is_empty());
            assert_eq!(a.unchanged(&meta, &m), skip, "{uid}");
        }
        assert_eq!((a.skipped(), a.incomparable), (1, false));
        a.end();
        assert!(
            !a.vanished(&Members::key("old")),
            "a skipped object is still seen"
        );
    }

    #[test]
    fn an_object_after_the_inferred_deleted_of_its_name_is_never_skipped() {
        // A stale member (its tombstone lost) and its live successor under the same name, both
        // unchanged since the position.
        let mut m = members(&["stale"]);
        let successor = Known {
            name: "stale".into(),
            namespace: Some("a".into()),
            rv: "50".into(),
            ..Known::default()
        };
        m.insert("successor", &successor);
        let mut a = Announced::new(Some(&m));
        a.since("100");
        let live = meta("successor", "50").with(|id| id.name = "stale");
        assert_eq!(
            a.add(&live, &m).len(),
            1,
            "the stale member is deleted first"
        );
        assert!(
            !a.unchanged(&live, &m),
            "then the live one follows on its key"
        );
        let other = meta("other", "50");
        a.add(&other, &m);
        m.insert("other", &Known::default());
        assert!(a.unchanged(&other, &m), "others are still skipped");
    }

    #[test]
    fn an_incomparable_version_is_reannounced_and_counted() {
        let m = members(&["x"]);
        let mut a = Announced::new(Some(&m));
        a.since("100");
        assert!(!a.unchanged(&meta("x", "opaque"), &m));
        assert!(a.incomparable);

        let mut whole = Announced::new(Some(&m));
        whole.since("not-a-number");
        assert!(!whole.unchanged(&meta("x", "5"), &m));
        assert!(whole.incomparable, "a position that does not compare");

        let mut full = Announced::new(Some(&m));
        assert!(!full.unchanged(&meta("x", "5"), &m), "no position: full");
        assert!(!full.incomparable);
    }

    #[test]
    fn a_name_taken_by_another_uid_is_replaced_once_and_vanished_members_found() {
        let m = members(&["gone", "taken", "kept", "deleted"]);
        let mut a = Announced::new(Some(&m));
        let successor = meta("successor", "7").with(|id| id.name = "taken");
        let replaced = a.add(&successor, &m);
        assert_eq!(replaced.len(), 1);
        assert_eq!(
            (replaced[0].0.as_str(), replaced[0].1.name.as_str()),
            ("taken", "taken")
        );
        assert!(a.add(&successor, &m).is_empty(), "once");
        let elsewhere = meta("other", "7").with(|id| {
            id.name = "kept";
            id.namespace = Some("b");
        });
        assert!(a.add(&elsewhere, &m).is_empty(), "another namespace's name");
        a.add(&meta("kept", "1"), &m);
        a.add(&meta("deleted", "1"), &m);
        a.remove("deleted");
        a.end();
        let vanished: Vec<&str> = ["gone", "taken", "kept", "deleted"]
            .into_iter()
            .filter(|u| a.vanished(&Members::key(u)))
            .collect();
        assert_eq!(vanished, ["gone", "deleted"]);
        assert_eq!(a.len(), 3);
    }
}
