//! Taking in what a gathered position does not cover.
//!
//! A switch that gathers namespaces' streams into one stream over the collection read
//! cluster-wide resumes it from the lowest of their positions (see
//! [`crate::membership::regroup`]). A namespace of its scope that had no such stream, and holds
//! objects at or below that position (one the old scope left out, as when `namespaces: [a, b]`
//! or a selector becomes `allNamespaces` with the switch), is not covered by it: a watch from
//! the position shows none of those objects, and a list of the whole scope would collapse every
//! change made since the position, in every namespace, into one record each.
//!
//! So, before it watches, such a stream ([`crate::checkpoint::Saved::covered`]) reads the
//! collection's current state once and announces only the objects at or below its position of
//! the namespaces the gathered streams did not cover. Every other object was announced by
//! those streams, or changed after the position, and the watch from there publishes each of
//! its changes. A consumer sees each object taken in announced (ADDED) at the version it held
//! since before the position, then every change after the position, in order; nothing of the
//! namespaces the position covered is published again.
//!
//! The entry keeps the covered namespaces until everything announced is acknowledged: a
//! take-in cut short (a failed delivery, a crash) is done again whole, in the same era within
//! one run (at least once, what the first announced may be repeated; exactly once, the entry
//! without them commits in the same transaction as the last of what was taken in). They are
//! kept as names, not told by the members: a member of a namespace taken in may have had its
//! membership written and its event lost, and so no resync skips a member as unchanged
//! meanwhile. While they are kept, the entry's query is marked
//! ([`crate::checkpoint::taking_in`]): a relay that does not know of the take-in (an older
//! version beside this one in a rollout) relists rather than resume without it, and a switch
//! back to one stream per namespace resumes only the covered namespaces from the position. A
//! position the server no longer holds, or a read of the collection older than it, makes the
//! stream resync instead, which takes every object in.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::{Reading, Stream};
use crate::event::{comparable, Meta};
use crate::kubeapi::{ApiError, WatchFrom};
use crate::stream::machine::Stop;

impl Stream {
    /// Takes in the objects at or below `floor` (the position the stream resumes from) of the
    /// namespaces not `covered`, then stops taking in (see the module's doc).
    pub(super) async fn take_in(
        &mut self,
        floor: u64,
        covered: Arc<BTreeSet<String>>,
    ) -> Result<(), Stop> {
        // Its objects may have had records from another stream (a namespace retired from an
        // earlier scope): announced in a new era, their versions never go back. So is what the
        // watch publishes after them. A take-in tried again in this run announces in the same.
        if !self.position.take_in_era {
            if !self.next_era().await {
                return Err(Stop::Cancelled);
            }
            self.position.take_in_era = true;
        }
        let mut objects = 0usize;
        let fed = self.source.fanned.is_some() || self.cfg.kubernetes.send_initial_events;
        let opened = if fed {
            self.open(WatchFrom::InitialEvents).await.map(Some)
        } else {
            Ok(None)
        };
        let rv = match opened {
            Ok(Some(mut w)) => {
                let mut reading = Reading::TakeIn {
                    floor,
                    covered,
                    objects: 0,
                };
                let read = self.read(&mut w, &mut reading).await.map_err(gone_is_cut)?;
                if let Reading::TakeIn { objects: n, .. } = reading {
                    objects = n;
                }
                match read {
                    Some(rv) => rv,
                    None => return Err(Stop::Closed),
                }
            }
            // Refused (the WatchList feature off, an older server), or not asked for: pages.
            Err(Stop::Api(ApiError::Status {
                code: 400 | 403 | 422,
                ..
            }))
            | Ok(None) => {
                let path = self.source.path.clone();
                let keep = |s: &Stream, meta: &Meta| Ok(s.takes_in(meta, floor, &covered));
                match self.announce_list(&path, keep).await.map_err(gone_is_cut)? {
                    Ok((rv, n)) => {
                        objects = n;
                        rv
                    }
                    Err(e) => return Err(gone_is_cut(self.api_stopped(e))),
                }
            }
            Err(why) => return Err(why),
        };
        // A list older than the position (a lagging cache, a restored etcd) may lack what the
        // watch from the position will not show: a resync takes everything in.
        if comparable(&rv).is_some_and(|rv| rv < floor) {
            tracing::warn!(stream = %self.id, %rv, floor, "the collection read to take in is older than the position; resyncing");
            return Err(Stop::Rewound);
        }
        // Done: the position goes without the covered namespaces, committed with what was
        // taken in (exactly once) and checkpointed once that is acknowledged, so that a
        // restart after it does not take in again.
        let covered = self.position.covered.take();
        self.stamp();
        self.outbox.restamp();
        if let Err(why) = self.drained().await {
            // Not all acknowledged: it is taken in again.
            self.position.covered = covered;
            self.stamp();
            return Err(why);
        }
        if let Some(saved) = self.publish_checkpoint() {
            if !self.written(&saved).await {
                return Err(Stop::Cancelled);
            }
        }
        tracing::info!(stream = %self.id, objects, floor, %rv, "took in the objects its position did not cover");
        Ok(())
    }

    /// Whether an object of the collection's state is taken in below `floor`: of a namespace
    /// not `covered`, and not changed since (a version that does not compare is taken in: at
    /// worst a repeat).
    pub(super) fn takes_in(&self, meta: &Meta, floor: u64, covered: &BTreeSet<String>) -> bool {
        self.holds(meta)
            && meta.namespace().is_some_and(|ns| !covered.contains(ns))
            && comparable(meta.resource_version()).is_none_or(|rv| rv <= floor)
    }
}

/// A 410 while taking in is the read's (the shared list cut midway, a continue token expired),
/// not the position's: the take-in is read again, from the same position.
fn gone_is_cut(why: Stop) -> Stop {
    match why {
        Stop::Gone => Stop::Closed,
        why => why,
    }
}
