//! A filtered stream following its scope while it watches (see [`super::scope`] for what the
//! consumer sees): the namespaces that left have their members deleted, those that entered are
//! listed and announced.

use super::scope::Scoped;
use super::Stream;
use crate::event::{comparable, Meta};
use crate::kubeapi::ApiError;
use crate::membership::Key;
use crate::stream::machine::Stop;

impl Stream {
    /// While watching: applies the scope's latest namespaces. Those that left have their
    /// members deleted; those that entered are listed and announced. A stop leaves the rest to
    /// the next pass (the stream's state stays consistent after each namespace).
    pub(super) async fn rescope(&mut self) -> Result<(), Stop> {
        let Some((left, entered)) = self.scope.as_mut().and_then(Scoped::take_moves) else {
            return Ok(());
        };
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
        let Some((query, sum, table)) =
            (self.scope.as_ref()).map(|s| (s.fingerprint(), s.sum(), s.table()))
        else {
            return Ok(());
        };
        if query != self.position.query {
            self.drained().await?;
            self.position.query = query;
            self.position.sum = Some(sum);
            self.position.table = Some(table);
            self.stamp();
        }
        Ok(())
    }

    async fn leave_namespace(&mut self, ns: &str, rv: &str) -> Result<(), Stop> {
        if let Some(s) = self.scope.as_mut() {
            s.leave(ns);
        }
        self.fences.lift(ns);
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
    ///
    /// At a start that resumed from a position under other namespaces ([`Scoped::floor`]),
    /// only the objects at or below the position are announced, and the namespace's watch
    /// events above it are published: the resumed watch replays them.
    async fn enter_namespace(&mut self, ns: &str, rv: &str) -> Result<(), Stop> {
        let floor = self.scope.as_ref().and_then(Scoped::floor);
        let stale = self.delete_members_of(ns, rv).await?;
        if stale > 0 {
            tracing::info!(stream = %self.id, namespace = %ns, objects = stale, "an earlier entry of the namespace was cut short: deleted what it announced before listing again");
        }
        let path = self.channel.path.collection_url(Some(ns));
        let keep = |s: &Stream, meta: &Meta| match floor {
            None => Ok(true),
            Some(floor) => match comparable(meta.resource_version()) {
                // Changed since the position: the resumed watch publishes it.
                Some(at) => Ok(at <= floor),
                None => {
                    tracing::info!(stream = %s.id, namespace = %ns, "an object's resourceVersion does not compare; resyncing to take the namespace in");
                    s.m.full_fallbacks.inc();
                    Err(Stop::Requested)
                }
            },
        };
        let (list_rv, objects) = match self.announce_list(&path, keep).await? {
            Ok(listed) => listed,
            // The namespace's listing cannot go on: a resync takes the whole scope anew.
            Err(ApiError::Gone(_)) => return Err(Stop::Requested),
            Err(e) => return Err(self.api_stopped(e)),
        };
        let Some(fence) = comparable(&list_rv) else {
            tracing::info!(stream = %self.id, namespace = %ns, rv = %list_rv, "a resourceVersion that does not compare; resyncing to take the namespace in");
            self.m.full_fallbacks.inc();
            return Err(Stop::Requested);
        };
        if let Some(s) = self.scope.as_mut() {
            s.enter(ns);
        }
        self.fences.fence(ns.to_string(), floor.unwrap_or(fence));
        tracing::info!(stream = %self.id, namespace = %ns, objects, rv = %list_rv, "namespace entered the scope: announced its objects");
        Ok(())
    }
}
