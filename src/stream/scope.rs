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

use tokio::sync::watch;

use crate::event::comparable;

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

    /// The namespaces that left the scope and those that entered it since the stream applied
    /// it, the scope's latest taken as seen; `None` while it is not known yet.
    pub(super) fn take_moves(&mut self) -> Option<(Vec<String>, Vec<String>)> {
        let learned = self.filter.desired.borrow_and_update().clone()?;
        let desired = self.filter.kept(&learned);
        let left = self.applied.difference(&desired).cloned().collect();
        let entered = desired.difference(&self.applied).cloned().collect();
        Some((left, entered))
    }

    /// Namespace `ns` left: its objects no longer belong to the stream.
    pub(super) fn leave(&mut self, ns: &str) {
        self.applied.remove(ns);
        self.fences.remove(ns);
    }

    /// Namespace `ns` entered, listed at `fence`: its live events at or below it are dropped
    /// (the list held them).
    pub(super) fn enter(&mut self, ns: &str, fence: u64) {
        self.applied.insert(ns.to_string());
        self.fences.insert(ns.to_string(), fence);
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
