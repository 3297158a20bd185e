//! What a list that failed midway announced, so that the list starting over after it does not
//! announce the same versions again.
//!
//! A list cut midway (a page refused, a connection reset) is started over from the same
//! position: a delta resync skips only members unchanged since that position, so every object
//! the first attempt announced would be announced again, with the same id and version (a
//! duplicate even for a `read_committed` consumer of an exactly-once relay). [`Relist`] keeps
//! the versions an unfinished list announced (those a delta skipped need no memory: the next
//! delta skips them too). The next list of the stream
//! skips those objects while they still have that version, but only if nothing in between could
//! have undone them:
//! - the stream's acknowledged position is the same (no other sync finished meanwhile),
//! - no delivery failed (a failure rewinds the stream, which replays everything after its
//!   position, the failed list's records among them), and
//! - the stream is in the same era and the list is not a full resync: after an etcd restore
//!   the same version may stand for other content, so everything is announced again.
//!
//! A record the first attempt handed over that fails later rewinds the stream in turn, so a
//! skip never stands in for a record that was lost. Memory is bounded: past [`CAP`] objects a
//! relist keeps nothing and the next list announces as before.

use std::collections::HashMap;

/// The most objects a [`Relist`] remembers (a few MB); a list longer than that starts over
/// announcing.
pub(super) const CAP: usize = 100_000;

/// The objects an unfinished list announced, by uid, at their versions.
#[derive(Debug, Default)]
pub(super) struct Relist {
    /// The stream's acknowledged position when the list began.
    from: Option<String>,
    /// The outbox's rewinds when the list began.
    rewinds: u64,
    /// The stream's era when the list began.
    era: u64,
    announced: HashMap<Box<str>, Box<str>>,
    /// More than [`CAP`] objects: nothing is kept.
    overflowed: bool,
}

impl Relist {
    /// A list beginning at the acknowledged position `from`, after `rewinds` rewinds, in
    /// `era`.
    pub(super) fn new(from: Option<&str>, rewinds: u64, era: u64) -> Self {
        Self {
            from: from.map(str::to_string),
            rewinds,
            era,
            ..Self::default()
        }
    }

    /// The object `uid` at `rv` was announced by this list (or by the list it carries on).
    pub(super) fn note(&mut self, uid: &str, rv: &str) {
        if self.overflowed {
            return;
        }
        if self.announced.len() >= CAP && !self.announced.contains_key(uid) {
            self.overflowed = true;
            self.announced = HashMap::new();
            return;
        }
        self.announced.insert(uid.into(), rv.into());
    }

    /// Whether it still keeps what it is told: past [`CAP`] objects it keeps nothing, and
    /// callers need not copy an object's identity for it.
    pub(super) fn keeps(&self) -> bool {
        !self.overflowed
    }

    /// This unfinished list, for the next list of the stream, which begins at `from` after
    /// `rewinds` rewinds in `era`: kept only if nothing in between can have undone what it
    /// announced.
    pub(super) fn carried(self, from: Option<&str>, rewinds: u64, era: u64) -> Option<Self> {
        let same = self.from.as_deref() == from && self.rewinds == rewinds && self.era == era;
        (same && !self.overflowed && !self.announced.is_empty()).then_some(self)
    }

    /// Whether the object `uid` at `rv` was announced by the list this one carries on.
    pub(super) fn announced(&self, uid: &str, rv: &str) -> bool {
        self.announced.get(uid).is_some_and(|at| &**at == rv)
    }
}

/// A list under way: what the list it starts over after announced, and what it announces.
#[derive(Debug, Default)]
pub(super) struct Relisting {
    earlier: Option<Relist>,
    /// What this list announced so far.
    pub(super) now: Relist,
}

impl Relisting {
    /// A list beginning at the acknowledged position `from` after `rewinds` rewinds in `era`,
    /// carrying on from `earlier` (the stream's last list, if it failed midway) when that
    /// still holds.
    pub(super) fn begin(
        earlier: Option<Relist>,
        from: Option<&str>,
        rewinds: u64,
        era: u64,
    ) -> Self {
        Self {
            earlier: earlier.and_then(|r| r.carried(from, rewinds, era)),
            now: Relist::new(from, rewinds, era),
        }
    }

    /// The list turned into a full resync (the server's history went back): nothing is
    /// skipped for the list before it.
    pub(super) fn forget_earlier(&mut self) {
        self.earlier = None;
    }

    /// Whether the object `uid` at `rv` need not be announced: the list this one starts over
    /// after announced it at that version. Noted as this list's too.
    pub(super) fn again(&mut self, uid: &str, rv: &str) -> bool {
        let again = self.earlier.as_ref().is_some_and(|e| e.announced(uid, rv));
        if again {
            self.now.note(uid, rv);
        }
        again
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_started_over_skips_only_what_it_announced_at_the_same_version() {
        let mut first = Relist::new(Some("10"), 0, 1);
        first.note("a", "12");
        first.note("b", "9");
        let next = first.carried(Some("10"), 0, 1).expect("carried");
        // (uid, version listed now, skipped)
        let rows = [
            ("a", "12", true),
            ("a", "15", false),
            ("b", "9", true),
            ("c", "11", false),
        ];
        for (uid, rv, skipped) in rows {
            assert_eq!(next.announced(uid, rv), skipped, "{uid} at {rv}");
        }
    }

    #[test]
    fn nothing_is_carried_past_a_new_position_a_rewind_a_new_era_or_the_cap() {
        let list = || {
            let mut r = Relist::new(Some("10"), 2, 5);
            r.note("a", "12");
            r
        };
        // (position now, rewinds now, era now, carried)
        let rows = [
            (Some("10"), 2, 5, true),
            (Some("14"), 2, 5, false),
            (None, 2, 5, false),
            (Some("10"), 3, 5, false),
            (Some("10"), 2, 6, false),
        ];
        for (from, rewinds, era, carried) in rows {
            assert_eq!(
                list().carried(from, rewinds, era).is_some(),
                carried,
                "{from:?} {rewinds} {era}"
            );
        }
        assert!(
            Relist::new(Some("10"), 0, 1)
                .carried(Some("10"), 0, 1)
                .is_none(),
            "nothing announced, nothing to carry"
        );
        let mut long = Relist::new(None, 0, 1);
        for i in 0..=CAP {
            long.note(&i.to_string(), "1");
        }
        assert!(long.carried(None, 0, 1).is_none(), "past the cap");
        let mut full = Relisting::begin(Some(list()), Some("10"), 2, 5);
        assert!(full.again("a", "12"));
        full.forget_earlier();
        assert!(!full.again("a", "12"), "a full resync skips nothing");
    }
}
