//! What a stream does with its position when it changes course, and at its end: forgetting the
//! position before publishing what is not a replay of its watch, retracting what it announced
//! under an old topic or key, and the final drain and checkpoint.

use super::{Ended, Stream};
use crate::event::{Identity, Meta};
use crate::membership::Key;
use crate::outbox::OutboxError;
use crate::registry::Phase;

impl Stream {
    /// Writes the stream's entry without a position, and waits until it is written; false when
    /// stopped first.
    ///
    /// Before a stream publishes what is not a replay of its watch from the saved position —
    /// the reconciliation of a changed query, the inferred DELETEDs of leaving its scope — that
    /// position must go: were the relay to die midway, a later run resuming from it (under the
    /// old query, or back in scope) would replay only changes after it and never undo what was
    /// published since. Without a position, that run reconciles with its members instead.
    ///
    /// What follows is announced in a new era (see [`crate::envelope::version`]), saved with
    /// the forgotten position before anything is announced in it.
    pub(super) async fn forget_position(&mut self) -> bool {
        // With a transactional producer the forgotten position is committed with what follows,
        // under the query and route it follows.
        // Without a position there is nothing to take in below it: the sync lists everything.
        self.position.covered = None;
        self.stamp();
        self.outbox.next_era();
        self.outbox.forget_position();
        self.position.era_fresh = true;
        let mut saved = self
            .outbox
            .take_saved()
            .expect("forgetting the position moves it");
        saved.query = Some(self.position.query.clone());
        saved.sum = self.position.sum.clone();
        saved.table = self.position.table.clone();
        saved.route = Some(self.position.route_id.clone());
        saved.kind = self.learned_kind();
        let saved = self.reporter.checkpoint(saved);
        self.written(&saved).await
    }

    /// Moves the stream to a new era, its position kept, and waits until the era is written:
    /// before it announces what may not continue the history its members' last records came
    /// from (see [`crate::envelope::version`]). False when stopped first.
    pub(super) async fn next_era(&mut self) -> bool {
        self.outbox.next_era();
        match self.publish_checkpoint() {
            Some(saved) => self.written(&saved).await,
            None => true,
        }
    }

    /// Waits until `saved`, published, is written (at once without checkpoints); false when
    /// stopped first.
    pub(super) async fn written(&self, saved: &std::sync::Arc<crate::checkpoint::Saved>) -> bool {
        if !self.checkpoints {
            return true;
        }
        tokio::select! {
            _ = self.life.shutdown.cancelled() => false,
            _ = self.reporter.written(saved) => true,
        }
    }

    /// After a change of topic or key template (its position already forgotten): every member
    /// announced elsewhere than the stream's route now puts it gets its inferred DELETED there,
    /// acknowledged before the stream reconciles (which announces the live ones anew). False
    /// when stopped first.
    pub(super) async fn retract_elsewhere(&mut self) -> bool {
        self.ensure_kind().await;
        let route = self.outbox.route().clone();
        // Only the keys are kept (16 bytes a member), each member decoded again when retracted.
        let elsewhere: Vec<Key> = self
            .outbox
            .members()
            .keys()
            .filter(|key| {
                let Some((uid, k)) = self.outbox.members().get_key(key) else {
                    return false;
                };
                let meta = Meta::new(Identity {
                    uid: &uid,
                    name: &k.name,
                    namespace: k.namespace.as_deref(),
                    ..Identity::default()
                });
                k.topic.as_ref().is_some_and(|t| *t != route.topic)
                    || k.key
                        .as_ref()
                        .is_some_and(|key| *key != route.key.render(&meta))
            })
            .collect();
        tracing::info!(stream = %self.id, objects = elsewhere.len(), "retracting what was announced under the old topic or key");
        for key in elsewhere {
            let Some((uid, k)) = self.outbox.members().get_key(&key) else {
                continue;
            };
            let meta = k.meta(&uid, &self.source.kind, &self.source.api_version);
            let (topic, key) = k.place(&meta, &route);
            if self.outbox.wait_for_room().await.is_err() {
                return false;
            }
            self.m.synthetic_deletes.inc();
            if self
                .outbox
                .retract(meta, &k.rv, &topic, &key)
                .await
                .is_err()
            {
                return false;
            }
        }
        self.outbox.wait_until(0).await.is_ok()
    }

    /// Whether the topic's schema is registered, waiting for it (with a schema registry): the
    /// inferred DELETEDs of leaving the scope carry its ids like every other record. False when
    /// the relay shuts down first: the stream's entry stays, and it leaves at its next start.
    async fn tagged(&self) -> bool {
        let Some(tag) = self.outbox.route().schema.clone() else {
            return true;
        };
        tokio::select! {
            _ = self.life.shutdown.cancelled() => false,
            _ = tag.registered() => true,
        }
    }

    /// Drains the outbox, publishes the final checkpoint and removes the stream's gauges. A
    /// stream that was leaving its scope has [`Ended::Left`] it only once every member's
    /// inferred DELETED was acknowledged: its entry may then go.
    pub(super) async fn stop(mut self) -> Ended {
        self.set_phase(Phase::Stopped);
        let mut gone = false;
        // Fenced (the Lease is lost): nothing more is checkpointed; the new leader replays.
        if !self.life.fenced.is_cancelled() {
            // Joins still pending are announcements too: settled first, so what they announce
            // is deleted with the rest rather than published after the leave. Nothing in flight
            // may bring a position back once it is forgotten.
            let leaving = self.life.leaving.is_cancelled() && self.settled_for_leave().await;
            let rv = self.outbox.checkpoint().unwrap_or_default().to_string();
            if leaving
                && !self.outbox.members().is_empty()
                && self.tagged().await
                && self.forget_position().await
            {
                self.leave_until_gone(&rv).await;
            }
            gone = leaving && self.outbox.members().is_empty();
            let left = self
                .outbox
                .drain(tokio::time::Instant::now() + self.cfg.drain_time())
                .await;
            if left > 0 {
                tracing::warn!(stream = %self.id, in_flight = left, "stopping with undelivered records; they will be replayed");
            }
            self.publish_checkpoint();
        }
        for gauge in [
            &self.metrics.stream_up,
            &self.metrics.in_flight,
            &self.metrics.last_event,
            &self.metrics.members,
        ] {
            let _ = gauge.remove_label_values(&[&self.id]);
        }
        if gone {
            Ended::Left(self.reporter)
        } else {
            Ended::Stopped
        }
    }

    /// Leaves the scope (see [`Stream::leave_scope`]) and waits for what that sent; after a
    /// failed delivery, tries again with the members still there, after a backoff, until none
    /// is left or the relay shuts down. A member leaves only once its DELETED is acknowledged,
    /// so a retry sends what is missing and at most repeats a DELETED whose report was lost.
    async fn leave_until_gone(&mut self, rv: &str) {
        loop {
            self.leave_scope(rv).await;
            // Stopping: the final drain (one budget) is `stop`'s.
            if self.life.shutdown.is_cancelled() {
                return;
            }
            self.outbox
                .drain(tokio::time::Instant::now() + self.cfg.drain_time())
                .await;
            if self.outbox.members().is_empty()
                || !self
                    .retry_leave("Kafka did not acknowledge every DELETED")
                    .await
            {
                return;
            }
        }
    }

    /// Before a leave: every pending join settled and nothing in flight. A failed delivery
    /// rewinds the outbox (its members stay as they are) and is tried again after a backoff,
    /// until it holds or the relay shuts down (false).
    async fn settled_for_leave(&mut self) -> bool {
        loop {
            let settled = match self.outbox.settle_joins().await {
                Ok(()) => self.outbox.wait_until(0).await,
                Err(e) => Err(e),
            };
            match settled {
                Ok(()) => return true,
                Err(OutboxError::Cancelled) => return false,
                Err(why) => {
                    if !self.retry_leave(&why.to_string()).await {
                        return false;
                    }
                }
            }
        }
    }

    /// After a failed attempt at leaving: says why (the log, and the stream's problem in the
    /// readiness) and waits out a backoff; false when the relay shuts down first.
    async fn retry_leave(&mut self, why: &str) -> bool {
        let delay = self.backoff.next();
        let members = self.outbox.members().len();
        tracing::warn!(stream = %self.id, members, ?delay, why, "leaving the scope cut short; trying again");
        self.reporter
            .problem(format!("leaving its scope: {why}; trying again"));
        tokio::select! {
            _ = self.life.shutdown.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }
}
