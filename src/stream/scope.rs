//! A cluster-wide stream filtered to some namespaces (the `clusterWide` watch strategy): one
//! watch of the cluster-wide collection instead of one per namespace, the objects of namespaces
//! out of scope dropped before anything else is done with them.
//!
//! # What the consumer sees
//! Exactly what one stream per namespace would give it:
//! - A namespace entering scope has its objects announced: the stream lists that namespace
//!   (at resourceVersion L) and announces every object, then drops the namespace's watch events
//!   at or below L (the list already holds them), so each key keeps its order. This compares
//!   resourceVersions as integers (KEP-5504); where L is not one, the stream resyncs instead.
//! - A namespace leaving scope has its members deleted (inferred, flagged `synthetic`), in the
//!   stream's order, after everything the stream published about them.
//! - The stream's query fingerprint includes its namespaces, and is stamped on its checkpoints
//!   only once everything announced under them is acknowledged. A restart under the same
//!   namespaces resumes the watch from the position; under others (namespaces entered or left
//!   while it was down, or a crash before a change was acknowledged) the position is dropped and
//!   the stream reconciles its members with a list of the whole collection under the new scope:
//!   objects re-announced, members out of scope deleted.
//! - A failed delivery replays its watch from the checkpoint, as any stream's does, once its
//!   scope is settled (the checkpoints carry the namespaces applied): every change is published
//!   again in order. During a scope change not acknowledged yet it resyncs whole instead: what
//!   it announced of entering namespaces (a list) and leaving ones (inferred DELETEDs) is not on
//!   its watch, so replaying the watch would not announce it again.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

use super::Stream;
use crate::event::comparable;
use crate::kubeapi::ApiError;
use crate::membership::Change;
use crate::membership::Key;
use crate::stream::machine::Stop;

/// The namespaces in scope; `None` until they are known (a selector not listed yet).
pub type Namespaces = Option<Arc<BTreeSet<String>>>;

/// Where a filtered stream learns its namespaces.
pub struct NamespaceFilter {
    desired: watch::Receiver<Namespaces>,
    /// A fixed list keeps its sender here, so the receiver never sees it closed.
    _fixed: Option<watch::Sender<Namespaces>>,
    /// Only these of them: a shard's part of a fanned-out stream keeps its shard's namespaces.
    within: Option<Within>,
}

/// Which namespaces a filter keeps of those it learns.
pub type Within = Arc<dyn Fn(&str) -> bool + Send + Sync>;

impl NamespaceFilter {
    /// A fixed list of namespaces (a `namespaces` channel).
    pub fn fixed(namespaces: impl IntoIterator<Item = String>) -> Self {
        let (tx, desired) = watch::channel(Some(Arc::new(namespaces.into_iter().collect())));
        Self {
            desired,
            _fixed: Some(tx),
            within: None,
        }
    }

    /// The namespaces `desired` says, as a follower of a selector learns them.
    pub fn following(desired: watch::Receiver<Namespaces>) -> Self {
        Self {
            desired,
            _fixed: None,
            within: None,
        }
    }

    /// Keeps only the namespaces `within` says.
    pub fn within(mut self, within: Within) -> Self {
        self.within = Some(within);
        self
    }

    /// What the filter keeps of `learned`.
    fn kept(&self, learned: &BTreeSet<String>) -> BTreeSet<String> {
        match &self.within {
            Some(keep) => learned.iter().filter(|ns| keep(ns)).cloned().collect(),
            None => learned.clone(),
        }
    }
}

/// A filtered stream's view of its scope.
pub(super) struct Scoped {
    filter: NamespaceFilter,
    /// The query fingerprint of the collection, without the namespaces.
    base: String,
    /// The fingerprint the stream's checkpoint was saved under.
    saved_query: Option<String>,
    /// The namespaces whose objects the stream has announced (or is announcing).
    applied: BTreeSet<String>,
    /// Per namespace that entered while watching: the resourceVersion of its entry list. Its
    /// watch events at or below it are already covered.
    fences: HashMap<String, u64>,
}

impl Scoped {
    pub(super) fn new(filter: NamespaceFilter, base: String, saved_query: Option<String>) -> Self {
        Self {
            filter,
            base,
            saved_query,
            applied: BTreeSet::new(),
            fences: HashMap::new(),
        }
    }

    /// The stream's query fingerprint under the namespaces it applied.
    pub(super) fn fingerprint(&self) -> String {
        crate::config::Channel::scoped_fingerprint(
            self.applied.iter().map(String::as_str),
            &self.base,
        )
    }

    pub(super) fn saved_query(&self) -> Option<&String> {
        self.saved_query.as_ref()
    }

    /// Whether an object of `namespace` belongs to the state a sync announces.
    pub(super) fn holds(&self, namespace: Option<&str>) -> bool {
        namespace.is_some_and(|ns| self.applied.contains(ns))
    }

    /// Whether a live event of `namespace` at `rv` is published.
    pub(super) fn admits(&self, namespace: Option<&str>, rv: &str) -> bool {
        let Some(ns) = namespace.filter(|_| self.holds(namespace)) else {
            return false;
        };
        match (self.fences.get(ns), comparable(rv)) {
            (Some(fence), Some(rv)) => rv > *fence,
            _ => true,
        }
    }

    /// Whether the scope moved since the stream applied it.
    pub(super) fn moved(&self) -> bool {
        self.filter
            .desired
            .borrow()
            .as_ref()
            .is_some_and(|d| self.filter.kept(d) != self.applied)
    }

    /// Waits until the scope may have moved (never, once its source is gone).
    pub(super) async fn changed(&mut self) {
        if self.filter.desired.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Before a sync: waits for the scope to be known, then takes it whole. Should its source
    /// go away before it is known, this waits for the stream to stop: syncing under an empty
    /// scope would delete every member.
    pub(super) async fn take_all(&mut self) {
        let Ok(d) = self.filter.desired.wait_for(Option::is_some).await else {
            return std::future::pending().await;
        };
        let learned = d.as_deref().cloned().unwrap_or_default();
        drop(d);
        self.applied = self.filter.kept(&learned);
        self.fences.clear();
    }
}

/// Waits for a filtered stream's scope to move (never for another stream).
pub(super) async fn changed(scoped: &mut Option<Scoped>) {
    match scoped {
        Some(s) => s.changed().await,
        None => std::future::pending().await,
    }
}

impl Stream {
    /// While watching: applies the scope's latest namespaces. Those that left have their
    /// members deleted; those that entered are listed and announced. A stop leaves the rest to
    /// the next pass (the stream's state stays consistent after each namespace).
    pub(super) async fn rescope(&mut self) -> Result<(), Stop> {
        let Some(scoped) = self.scope.as_mut() else {
            return Ok(());
        };
        let Some(learned) = scoped.filter.desired.borrow_and_update().clone() else {
            return Ok(());
        };
        let desired = scoped.filter.kept(&learned);
        let left: Vec<String> = scoped.applied.difference(&desired).cloned().collect();
        let entered: Vec<String> = desired.difference(&scoped.applied).cloned().collect();
        if left.is_empty() && entered.is_empty() {
            return self.settle_scope().await;
        }
        // What is still joining is announced: it must be deleted too. And nothing in flight
        // may bring a position back once it is forgotten.
        self.outbox.settle_joins().await?;
        self.drained().await?;
        // Before the first DELETED or ADDED, the position goes: a start resuming from it
        // under the same fingerprint (the namespace back in scope, or the entering one out of
        // it again) would never undo a leave cut short, nor delete what an entry cut short
        // announced. Without it, that start reconciles its members with the scope it finds.
        // The DELETEDs name the position as it was.
        let rv = self.outbox.checkpoint().unwrap_or_default().to_string();
        if !self.forget_position().await {
            return Err(Stop::Cancelled);
        }
        for ns in left {
            self.leave_namespace(&ns, &rv).await?;
        }
        for ns in entered {
            self.enter_namespace(&ns, &rv).await?;
        }
        self.settle_scope().await
    }

    /// Once everything announced under the namespaces applied is acknowledged, the checkpoints
    /// carry them (see the module's doc); until then they carry the namespaces before.
    pub(super) async fn settle_scope(&mut self) -> Result<(), Stop> {
        let Some(query) = self.scope.as_ref().map(Scoped::fingerprint) else {
            return Ok(());
        };
        if query != self.position.query {
            self.drained().await?;
            self.position.query = query;
            self.stamp();
        }
        Ok(())
    }

    async fn leave_namespace(&mut self, ns: &str, rv: &str) -> Result<(), Stop> {
        if let Some(s) = self.scope.as_mut() {
            s.applied.remove(ns);
            s.fences.remove(ns);
        }
        let n = self.delete_members_of(ns, rv).await?;
        tracing::info!(stream = %self.id, namespace = %ns, objects = n, "namespace left the scope: deleted what was announced of it");
        Ok(())
    }

    /// Publishes the inferred DELETED of every member of namespace `ns`; returns how many.
    async fn delete_members_of(&mut self, ns: &str, rv: &str) -> Result<usize, Stop> {
        let gone: Vec<Key> = self.outbox.members().keys_in(ns).collect();
        for k in &gone {
            let Some((uid, known)) = self.outbox.members().get_key(k) else {
                continue;
            };
            self.infer_delete(uid, known, rv).await?;
        }
        Ok(gone.len())
    }

    /// Lists namespace `ns` and announces its objects. Members of it an earlier attempt
    /// announced (one cut short by a failed page) are deleted first: any of them may have gone
    /// while the namespace was not applied, its watch event dropped.
    async fn enter_namespace(&mut self, ns: &str, rv: &str) -> Result<(), Stop> {
        let stale = self.delete_members_of(ns, rv).await?;
        if stale > 0 {
            tracing::info!(stream = %self.id, namespace = %ns, objects = stale, "an earlier entry of the namespace was cut short: deleted what it announced before listing again");
        }
        let path = self.channel.path.collection_url(Some(ns));
        let mut token: Option<String> = None;
        let mut objects = 0usize;
        let list_rv = loop {
            let size = Some(self.cfg.kubernetes.list_page_size);
            let page = match self.list_page(&path, size, token.as_deref()).await? {
                Ok(p) => p,
                // The namespace's listing cannot go on: a resync takes the whole scope anew.
                Err(ApiError::Gone(_)) => return Err(Stop::Requested),
                Err(e) => return Err(self.api_stopped(e)),
            };
            self.learn_kind(&page);
            for item in &page.items {
                let Some(mut ev) = self.listed(item).await? else {
                    continue;
                };
                objects += 1;
                self.emit(
                    &mut ev,
                    Instant::now(),
                    None,
                    Some(Change::Announced),
                    false,
                )
                .await?;
            }
            match page.continue_token {
                Some(c) => token = Some(c),
                None => break page.resource_version,
            }
        };
        let Some(fence) = comparable(&list_rv) else {
            tracing::info!(stream = %self.id, namespace = %ns, rv = %list_rv, "a resourceVersion that does not compare; resyncing to take the namespace in");
            self.m.full_fallbacks.inc();
            return Err(Stop::Requested);
        };
        if let Some(s) = self.scope.as_mut() {
            s.applied.insert(ns.to_string());
            s.fences.insert(ns.to_string(), fence);
        }
        tracing::info!(stream = %self.id, namespace = %ns, objects, rv = %list_rv, "namespace entered the scope: announced its objects");
        Ok(())
    }
}
