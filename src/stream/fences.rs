//! Per namespace, the resourceVersion up to which a stream's watch events of that namespace were
//! already published, by something other than this stream's own watch:
//! - the namespace's own stream, before a `watchStrategy` switch gathered it into this one,
//!   which resumes from the lowest position of the streams it gathered (see
//!   `membership::regroup`);
//! - the list that took the namespace in when it entered a filtered stream's scope (see
//!   `stream::scope`).
//!
//! A watch event of a fenced namespace at or below its fence is not published again: its
//! position moves, nothing else. This holds for every stream over a collection, filtered to some
//! namespaces or not, so that no switch publishes a change twice, under exactly once too.
//!
//! The fences travel with the stream's checkpoints while they are above its position (see
//! [`crate::outbox::Stamp::fences_above`]): a start resuming from that position takes them
//! again. Once the position passes a fence, the fence no longer matters and is not written; a
//! sync clears them all once it reached its list's position, not before, so that a sync cut
//! short resumes from the checkpoint still fenced.
//! Comparing resourceVersions needs integers (KEP-5504): a fence or an event version that is
//! not one fences nothing.

use std::collections::{BTreeMap, HashMap};

use crate::event::comparable;

/// A stream's fences (see the module's doc).
#[derive(Debug, Default)]
pub(super) struct Fences {
    /// The checkpoint's, until the start takes those above its position.
    saved: BTreeMap<String, String>,
    /// Namespace -> the version its events are fenced at.
    kept: HashMap<String, u64>,
}

impl Fences {
    /// The fences of a checkpoint entry, not in force until [`Fences::resume_from`].
    pub(super) fn saved(saved: BTreeMap<String, String>) -> Self {
        Self {
            saved,
            kept: HashMap::new(),
        }
    }

    /// At a start resuming from position `at`: the checkpoint's fences above it fence their
    /// namespaces' watch events again, so that what was published past the position is not
    /// published twice. Those at or below it fence nothing the watch replays.
    pub(super) fn resume_from(&mut self, at: &str) {
        let saved = std::mem::take(&mut self.saved);
        let Some(at) = comparable(at) else {
            return;
        };
        for (ns, fence) in saved {
            if let Some(fence) = comparable(&fence).filter(|f| *f > at) {
                self.fence(ns, fence);
            }
        }
    }

    /// Fences namespace `ns`'s watch events at or below `at`, or keeps a higher fence.
    pub(super) fn fence(&mut self, ns: String, at: u64) {
        let kept = self.kept.entry(ns).or_insert(at);
        *kept = (*kept).max(at);
    }

    /// Namespace `ns` left the stream's scope: its events are no longer the stream's.
    pub(super) fn lift(&mut self, ns: &str) {
        self.kept.remove(ns);
    }

    /// A sync announced the whole state as of a list above every fence: nothing fenced is
    /// kept in the checkpoints from now on.
    pub(super) fn clear(&mut self) {
        self.saved.clear();
        self.kept.clear();
    }

    /// Whether a live event of `namespace` at `rv` is published: not when its namespace is
    /// fenced at or above it.
    pub(super) fn admits(&self, namespace: Option<&str>, rv: &str) -> bool {
        let fence = namespace.and_then(|ns| self.kept.get(ns));
        match (fence, comparable(rv)) {
            (Some(fence), Some(rv)) => rv > *fence,
            _ => true,
        }
    }

    /// The fences, to keep in the stream's checkpoints (those above each one's position).
    pub(super) fn all(&self) -> BTreeMap<String, u64> {
        self.kept.iter().map(|(ns, f)| (ns.clone(), *f)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoints_fences_above_its_position_fence_their_namespaces() {
        // position -> whether `a`'s events at 150 and at 151 are published, and whether the
        // next checkpoint at the position keeps the fence.
        let rows: [(&str, bool, bool, bool); 4] = [
            // Published past the position up to 150: only what came after.
            ("100", false, true, true),
            // The position passed the fence: nothing is fenced.
            ("150", true, true, false),
            ("200", true, true, false),
            // A position that is no integer fences nothing.
            ("x1", true, true, false),
        ];
        for (i, (at, at_fence, after, kept)) in rows.into_iter().enumerate() {
            let mut fences = Fences::saved(BTreeMap::from([("a".into(), "150".into())]));
            assert!(
                fences.admits(Some("a"), "150"),
                "row {i}: not before the start"
            );
            fences.resume_from(at);
            assert_eq!(fences.admits(Some("a"), "150"), at_fence, "row {i}");
            assert_eq!(fences.admits(Some("a"), "151"), after, "row {i}");
            assert!(
                fences.admits(Some("b"), "120"),
                "row {i}: another namespace"
            );
            assert!(
                fences.admits(None, "120"),
                "row {i}: a cluster-scoped object"
            );
            let stamped = crate::outbox::Stamp::fences_above(&fences.all(), Some(at));
            assert_eq!(stamped.contains_key("a"), kept, "row {i}");
        }
    }

    #[test]
    fn a_fence_keeps_the_higher_version_until_its_namespace_leaves_or_a_sync() {
        let mut fences = Fences::saved(BTreeMap::from([("a".into(), "150".into())]));
        fences.resume_from("100");
        // Taken in by a list at 120 after the switch's fence at 150: fenced at 150.
        fences.fence("a".into(), 120);
        assert!(!fences.admits(Some("a"), "150"));
        fences.fence("a".into(), 200);
        assert!(!fences.admits(Some("a"), "200"));
        fences.lift("a");
        assert!(fences.admits(Some("a"), "110"));
        fences.fence("a".into(), 200);
        fences.clear();
        assert!(fences.admits(Some("a"), "110"));
        assert!(fences.all().is_empty());
    }
}
