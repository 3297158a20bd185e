//! The Sync steps: announcing a stream's whole current state, through a `sendInitialEvents`
//! watch or paginated lists, and reconciling it with what the stream had announced before.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use super::{Reading, Step, Stream};
use crate::decode::{self, ObjectMeta};
use crate::envelope::{self, Announcement};
use crate::event::EventType;
use crate::kubeapi::{self, ApiError, WatchFrom};
use crate::membership::Members;
use crate::stream::machine::{Outcome, Reason, Stop};
use crate::tracker::{Change, Known};

/// What a Sync has announced so far, against what the stream knew before it.
///
/// A resync may find an object under a name the stream knows with another uid (deleted and
/// created again while the stream could not see it). The old uid's inferred DELETED must then
/// come before the new uid's ADDED on that key, or a consumer keyed by name (or a compacted
/// topic) would end up deleting a live object.
#[derive(Default)]
pub(super) struct Announced {
    /// Uids of the new state.
    seen: HashSet<String>,
    /// Known objects by namespace and name (a resync only): more than one when a member too
    /// many shares a live object's name.
    by_name: HashMap<(Option<String>, String), Vec<String>>,
    /// Known uids already given their inferred DELETED because another uid took their name.
    replaced: HashSet<String>,
}

impl Announced {
    /// Bookkeeping for a sync: with `known` (a resync) replaced names are detected.
    pub(super) fn new(known: Option<&Members>) -> Self {
        let mut by_name: HashMap<_, Vec<String>> = HashMap::new();
        for (uid, k) in known.into_iter().flat_map(Members::iter) {
            by_name.entry((k.namespace, k.name)).or_default().push(uid);
        }
        Self {
            by_name,
            ..Self::default()
        }
    }

    /// Records an object of the new state; returns the known uids it replaces.
    pub(super) fn add(&mut self, meta: &ObjectMeta) -> Vec<String> {
        self.seen.insert(meta.uid.clone());
        let name = (meta.namespace.clone(), meta.name.clone());
        let Some(uids) = self.by_name.get(&name) else {
            return Vec::new();
        };
        let replaced: Vec<String> = uids
            .iter()
            .filter(|old| **old != meta.uid && !self.replaced.contains(*old))
            .cloned()
            .collect();
        self.replaced.extend(replaced.iter().cloned());
        replaced
    }

    /// An object of the new state was deleted before the state ended.
    pub(super) fn remove(&mut self, uid: &str) {
        self.seen.remove(uid);
    }

    pub(super) fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether a known uid still needs its inferred DELETED once the state has ended.
    fn vanished(&self, uid: &str) -> bool {
        !self.seen.contains(uid) && !self.replaced.contains(uid)
    }
}

impl Stream {
    /// Bookkeeping for a sync of `reason`.
    pub(super) fn announced(&self, reason: Reason) -> Announced {
        match reason {
            Reason::Resync => Announced::new(Some(self.outbox.members())),
            Reason::Start => Announced::new(None),
        }
    }

    /// Before announcing `meta` in a sync: the inferred DELETED of the known object whose name
    /// it took, if any.
    pub(super) async fn announce_replacement(
        &mut self,
        announced: &mut Announced,
        meta: &ObjectMeta,
    ) -> Result<(), Stop> {
        for old in announced.add(meta) {
            let Some(known) = self.outbox.members().get(&old) else {
                continue;
            };
            tracing::info!(stream = %self.id, name = %meta.name, old = %old, new = %meta.uid, "object recreated under its name while unseen; deleting the old one first");
            self.infer_delete(old, known, &meta.resource_version)
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
        self.outbox
            .wait_for_room()
            .await
            .map_err(|e| self.outbox_stop(e))?;
        self.m.synthetic_deletes.inc();
        let change = Some(Change::Leave { uid: uid.clone() });
        if !self.channel.forwards(EventType::Deleted) {
            return self
                .outbox
                .pass(None, change)
                .await
                .map_err(|e| self.outbox_stop(e));
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
        let a = Announcement::inferred_delete(meta, rv);
        self.outbox
            .send(a, &object, Instant::now(), None, change)
            .await
            .map_err(|e| self.outbox_stop(e))
    }

    /// Sync through a `sendInitialEvents` watch: the current state, then changes, on one
    /// connection, handed on to the Watch state once the state has ended.
    pub(super) async fn sync_initial(&mut self, reason: Reason) -> Step {
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
            self.outbox
                .wait_until(0)
                .await
                .map_err(|e| self.outbox_stop(e))?;
        }
        let mut announced = self.announced(reason);
        let mut token: Option<String> = None;
        // Paginated, unless a continue token expired: the snapshot it pinned outlived its
        // lifetime (a large state, a slow consumer), and starting over with pages could do the
        // same forever. The list is then read whole, in one request, as client-go does.
        let mut whole = false;
        let list_rv = loop {
            let query = self.query();
            let page = kubeapi::list_page(
                &self.client,
                &self.path,
                &query,
                (!whole).then_some(self.cfg.kubernetes.list_page_size),
                token.as_deref(),
            );
            let page = tokio::select! {
                _ = self.cancel.cancelled() => return Err(Stop::Cancelled),
                p = page => p,
            };
            let page = match page {
                Ok(p) => p,
                Err(ApiError::Gone(_)) if token.is_some() => {
                    tracing::info!(stream = %self.id, "continue token expired; listing whole");
                    self.metrics
                        .watch_restarts
                        .with_label_values(&[&self.id, "continue_expired"])
                        .inc();
                    token = None;
                    whole = true;
                    // What the earlier pages announced is reconciled with the whole list: an
                    // object they showed that has gone since gets its inferred DELETED.
                    self.outbox
                        .wait_until(0)
                        .await
                        .map_err(|e| self.outbox_stop(e))?;
                    reason = Reason::Resync;
                    announced = self.announced(reason);
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
                self.announce_replacement(&mut announced, &ev.meta).await?;
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
        let objects = announced.len();
        self.finish_sync(announced, reason, &list_rv).await?;
        tracing::info!(stream = %self.id, objects, rv = %list_rv, resync = reason == Reason::Resync, "listed");
        Ok(list_rv)
    }

    /// The whole current state has been announced, consistent as of `list_rv`. After a resync,
    /// known objects it lacks get an inferred DELETED and the end is marked; either way the
    /// stream's position becomes `list_rv` once everything before it is acknowledged.
    pub(super) async fn finish_sync(
        &mut self,
        announced: Announced,
        reason: Reason,
        list_rv: &str,
    ) -> Result<(), Stop> {
        if reason == Reason::Start {
            return self
                .outbox
                .pass(Some(list_rv.to_string()), None)
                .await
                .map_err(|e| self.outbox_stop(e));
        }
        let vanished: Vec<(String, Known)> = self
            .outbox
            .members()
            .iter()
            .filter(|(uid, _)| announced.vanished(uid))
            .collect();
        for (uid, known) in vanished {
            self.infer_delete(uid, known, list_rv).await?;
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
            .send(a, &object, Instant::now(), Some(list_rv.to_string()), None)
            .await
            .map_err(|e| self.outbox_stop(e))
    }
}
