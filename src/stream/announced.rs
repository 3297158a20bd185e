//! What a Sync has announced so far, against what the stream knew before it: the bookkeeping
//! of delta resyncs and of names taken by another uid (see [`super::sync`]).

use std::collections::HashSet;
use std::hash::{Hash, Hasher};

use crate::event::{comparable, Meta};
use crate::membership::{Key, Known, Members};

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
    pub(super) incomparable: bool,
}

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

    /// Whether the new state holds no object so far.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Identity;

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
