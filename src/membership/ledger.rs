//! One stream's membership ledger: its members, the joins pending and the tombstones owed.
//!
//! The ledger decides which membership records a change needs and when an entry may go; the
//! outbox produces those records and tells the ledger what became of them. Pure bookkeeping:
//! nothing here sends or waits (see the crate's [`membership`](super) for the order it keeps).
//!
//! | change | member already | with a topic | without one (dry run) |
//! |---|---|---|---|
//! | join / announced | [`Admission::Free`] | [`Admission::Join`] (first time), then [`Admission::Waits`] while pending | becomes a member, [`Admission::Free`] |
//! | leave | the uid leaves once its entry is delivered ([`Ledger::left`]); one whose join is still pending leaves once the join is delivered | its tombstone is owed | nothing owed |
//! | none | [`Admission::Free`] | | |

use std::collections::HashMap;

use super::gate::Gate;
use super::{record, Change, Known, Members, Owner};
use crate::config::KeyTemplate;
use crate::event::Meta;
use crate::producer::Record;

/// What an entry needs before it may go.
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "consumed at once by the caller; boxing would allocate for every join"
)]
pub enum Admission {
    /// Nothing: its object is a member already, or it announces none.
    Free,
    /// Its object's join is pending: the entry waits behind it.
    Waits,
    /// Its object's membership record must be produced first; the entry waits behind it. Once
    /// the producer took the record, [`Ledger::joined`] says so.
    Join(Join),
}

/// A membership record to produce before what announces its object.
#[derive(Debug)]
pub struct Join {
    /// The number its report comes back with ([`Ledger::settle_join`]).
    pub n: u64,
    pub record: Record,
    uid: String,
    known: Known,
}

/// What a join's report meant.
#[derive(Debug, PartialEq, Eq)]
pub enum Settled {
    /// Not a pending join (settled already).
    Unknown,
    /// Its object is a member: what waited for it may go.
    Member,
    /// It failed: nothing announcing its object may be sent.
    Failed,
}

/// A membership tombstone to produce: `uid` left the stream.
#[derive(Debug)]
pub struct Tombstone {
    /// The number its report comes back with ([`Ledger::settle_leave`]).
    pub n: u64,
    pub uid: String,
    pub record: Record,
}

/// One stream's membership bookkeeping. `T` is what waits behind pending joins.
pub struct Ledger<T> {
    stream: String,
    owner: Owner,
    /// The membership topic; without one (a dry run) members are kept in memory only.
    topic: Option<String>,
    members: Members,
    gate: Gate<T>,
    /// Members that left whose tombstone is still to be handed to the producer.
    leaving: Vec<String>,
    /// Objects that left while their join was pending (its report may come after their
    /// DELETED's, when both are committed in one transaction): the number of that join, and
    /// whether they left as members (their tombstone is owed already). Once it is delivered,
    /// it does not make them members again.
    left_joining: HashMap<String, (u64, bool)>,
    /// Tombstones handed to the producer, by number, until reported.
    leaves_out: HashMap<u64, String>,
    next_leave: u64,
}

impl<T> Ledger<T> {
    /// The ledger of `owner`'s `stream`, resuming with `members`.
    pub fn new(stream: &str, owner: Owner, topic: Option<String>, members: Members) -> Self {
        Self {
            stream: stream.to_string(),
            owner,
            topic,
            members,
            gate: Gate::new(),
            leaving: Vec::new(),
            left_joining: HashMap::new(),
            leaves_out: HashMap::new(),
            next_leave: 0,
        }
    }

    /// The objects the stream announced and has not seen leave.
    pub fn members(&self) -> &Members {
        &self.members
    }

    /// What `change` means for the entry it comes with, announced on `topic` and keyed by
    /// `key`: the object that leaves once the entry is delivered, and what the entry needs
    /// first. [`Change::Announced`] takes its object from `meta`, the announcement's.
    pub fn change(
        &mut self,
        change: Option<Change>,
        meta: Option<&Meta>,
        topic: &str,
        key: &KeyTemplate,
    ) -> (Option<String>, Admission) {
        match change {
            Some(Change::Join { uid, known }) => (None, self.join(uid, known, topic)),
            Some(Change::Announced) => match meta {
                Some(m) if !self.members.contains(m.uid()) => {
                    let known = Known {
                        name: m.name().to_string(),
                        namespace: m.namespace().map(str::to_string),
                        rv: m.resource_version().to_string(),
                        topic: None,
                        key: Some(key.render(m)),
                    };
                    (None, self.join(m.uid().to_string(), known, topic))
                }
                _ => (None, Admission::Free),
            },
            Some(Change::Leave { uid }) => (Some(uid), Admission::Free),
            None => (None, Admission::Free),
        }
    }

    fn join(&mut self, uid: String, mut known: Known, topic: &str) -> Admission {
        if self.members.contains(&uid) {
            return Admission::Free;
        }
        if self.gate.joining(&uid) {
            return Admission::Waits;
        }
        known.topic = Some(topic.to_string());
        let Some(membership) = &self.topic else {
            self.members.insert(&uid, &known);
            return Admission::Free;
        };
        let record = record(membership, &self.owner, &self.stream, &uid, Some(&known));
        Admission::Join(Join {
            n: self.gate.next_number(),
            record,
            uid,
            known,
        })
    }

    /// The producer took `join`'s record: what comes next waits for its report.
    pub fn joined(&mut self, join: Join) {
        self.gate.joined(join.uid, join.known);
    }

    /// Join `n` was reported, `delivered` or not.
    pub fn settle_join(&mut self, n: u64, delivered: bool) -> Settled {
        let stale = self.gate.stale(n);
        match self.gate.settled(n) {
            None => Settled::Unknown,
            Some((uid, known)) if delivered => {
                match self.left_joining.get(&uid) {
                    Some(&(j, owed)) if j == n => {
                        self.left_joining.remove(&uid);
                        // A join let go at a rewind may have made it a member meanwhile.
                        self.members.remove(&uid);
                        if !owed {
                            self.leaving.push(uid);
                        }
                    }
                    _ => self.members.insert(&uid, &known),
                }
                Settled::Member
            }
            Some((uid, _)) => {
                if self.left_joining.get(&uid).is_some_and(|&(j, _)| j == n) {
                    self.left_joining.remove(&uid);
                }
                // Let go at a rewind: the replay joins its object again.
                if stale {
                    Settled::Unknown
                } else {
                    Settled::Failed
                }
            }
        }
    }

    /// Whether any join awaits its report.
    pub fn joins_pending(&self) -> bool {
        self.gate.pending()
    }

    /// `entry` back when it may go now; otherwise it waits (see [`Gate::admit`]).
    pub fn admit(&mut self, entry: T, waits: bool) -> Option<T> {
        self.gate.admit(entry, waits)
    }

    /// Whether any entry waits.
    pub fn holding(&self) -> bool {
        self.gate.holding()
    }

    /// The first waiting entry, once every join before it is settled.
    pub fn next_released(&mut self) -> Option<T> {
        self.gate.next_released()
    }

    /// Forgets every waiting entry (a rewind replays them); pending joins stay.
    pub fn clear_held(&mut self) {
        self.gate.clear_held();
    }

    /// Forgets every waiting entry, and lets the pending joins go (see [`Gate::let_go`]): a
    /// rewind whose failed joins would otherwise each cause a replay of their own (a
    /// transaction's abort fails them all at once).
    pub fn clear_all(&mut self) {
        self.gate.clear_held();
        self.gate.let_go();
    }

    /// `uids` left: their DELETEDs were delivered. Each member among them owes a tombstone;
    /// so does each whose join is pending, once that join is delivered.
    pub fn left(&mut self, uids: impl IntoIterator<Item = String>) {
        for uid in uids {
            let owed = self.members.remove(&uid) && self.topic.is_some();
            if let Some(n) = self.gate.joining_number(&uid) {
                self.left_joining.insert(uid.clone(), (n, owed));
            }
            if owed {
                self.leaving.push(uid);
            }
        }
    }

    /// The next tombstone owed, numbered; hand it to the producer, then say
    /// [`Ledger::tombstone_taken`] or [`Ledger::tombstone_refused`].
    pub fn next_tombstone(&mut self) -> Option<Tombstone> {
        let topic = self.topic.as_ref()?;
        let uid = self.leaving.pop()?;
        Some(Tombstone {
            n: self.next_leave,
            record: record(topic, &self.owner, &self.stream, &uid, None),
            uid,
        })
    }

    /// The producer took `t`: its report settles it.
    pub fn tombstone_taken(&mut self, t: Tombstone) {
        self.next_leave += 1;
        self.leaves_out.insert(t.n, t.uid);
    }

    /// The producer could not take `t` now: it is owed still.
    pub fn tombstone_refused(&mut self, t: Tombstone) {
        self.leaving.push(t.uid);
    }

    /// Whether a tombstone waits to be handed to the producer.
    pub fn tombstones_owed(&self) -> bool {
        !self.leaving.is_empty()
    }

    /// Tombstone `n` was reported; one not `delivered` is owed again. Returns its uid when so.
    pub fn settle_leave(&mut self, n: u64, delivered: bool) -> Option<String> {
        let uid = self.leaves_out.remove(&n)?;
        if delivered {
            return None;
        }
        self.leaving.push(uid.clone());
        Some(uid)
    }

    /// Tombstones not yet delivered.
    pub fn leaves_pending(&self) -> usize {
        self.leaves_out.len() + self.leaving.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Identity;

    fn known(name: &str) -> Known {
        Known {
            name: name.into(),
            namespace: Some("a".into()),
            rv: "1".into(),
            topic: None,
            key: None,
        }
    }

    fn ledger(topic: bool) -> Ledger<&'static str> {
        let mut members = Members::default();
        members.insert("m", &known("m"));
        let topic = topic.then(|| "members".to_string());
        Ledger::new("pods.a", Owner::new("w", "cm"), topic, members)
    }

    fn join(uid: &str) -> Option<Change> {
        Some(Change::Join {
            uid: uid.into(),
            known: known(uid),
        })
    }

    /// The decision for `change` as a short word: what the entry needs, and who leaves.
    fn decide(l: &mut Ledger<&'static str>, change: Option<Change>, meta: Option<&Meta>) -> String {
        let key = KeyTemplate::default();
        let (leaves, admission) = l.change(change, meta, "pods", &key);
        let what = match admission {
            Admission::Free => "free".to_string(),
            Admission::Waits => "waits".to_string(),
            Admission::Join(j) => {
                let word = format!("join {} {}", j.n, j.record.key);
                l.joined(j);
                word
            }
        };
        match leaves {
            Some(uid) => format!("{what}, {uid} leaves"),
            None => what,
        }
    }

    #[test]
    fn each_change_needs_what_the_table_says() {
        let meta = Meta::new(Identity {
            kind: "Pod",
            api_version: "v1",
            name: "x",
            namespace: Some("a"),
            uid: "x",
            resource_version: "5",
        });
        // (what, with a membership topic, the change, the announced object, the decision)
        type Case<'a> = (&'a str, bool, Option<Change>, Option<&'a Meta>, &'a str);
        let cases: [Case<'_>; 8] = [
            ("a member joins again", true, join("m"), None, "free"),
            (
                "a new object joins",
                true,
                join("n"),
                None,
                "join 0 w/cm/pods.a/n",
            ),
            ("its join is pending", true, join("n"), None, "waits"),
            (
                "announced, not a member",
                true,
                Some(Change::Announced),
                Some(&meta),
                "join 1 w/cm/pods.a/x",
            ),
            (
                "a leave",
                true,
                Some(Change::Leave { uid: "m".into() }),
                None,
                "free, m leaves",
            ),
            ("no change", true, None, None, "free"),
            (
                "without a topic a join is at once",
                false,
                join("n"),
                None,
                "free",
            ),
            (
                "announced without a topic",
                false,
                Some(Change::Announced),
                Some(&meta),
                "free",
            ),
        ];
        let (mut with, mut without) = (ledger(true), ledger(false));
        for (what, topic, change, meta, want) in cases {
            let l = if topic { &mut with } else { &mut without };
            assert_eq!(decide(l, change, meta), want, "{what}");
        }
        assert!(without.members().contains("n") && without.members().contains("x"));
        assert!(
            !with.members().contains("n"),
            "a member once its join is delivered"
        );
        assert_eq!(with.settle_join(0, true), Settled::Member);
        assert_eq!(with.settle_join(0, true), Settled::Unknown);
        assert_eq!(with.settle_join(1, false), Settled::Failed);
        assert!(with.members().contains("n") && !with.members().contains("x"));
        assert!(!with.joins_pending());
    }

    #[test]
    fn a_member_that_left_owes_a_tombstone_until_it_is_delivered() {
        let mut l = ledger(true);
        l.left(["m".to_string(), "never a member".to_string()]);
        assert!(!l.members().contains("m"));
        let t = l.next_tombstone().expect("m's tombstone");
        assert_eq!(
            (t.n, t.record.key.as_str(), t.record.tombstone),
            (0, "w/cm/pods.a/m", true)
        );
        l.tombstone_refused(t);
        assert_eq!(l.leaves_pending(), 1);
        let t = l.next_tombstone().expect("owed still");
        l.tombstone_taken(t);
        assert!(l.next_tombstone().is_none() && !l.tombstones_owed());
        assert_eq!(
            l.settle_leave(0, false).as_deref(),
            Some("m"),
            "produced again"
        );
        let t = l.next_tombstone().expect("owed again");
        assert_eq!(t.n, 1);
        l.tombstone_taken(t);
        assert_eq!(l.settle_leave(1, true), None);
        assert_eq!(l.leaves_pending(), 0);
        let mut dry = ledger(false);
        dry.left(["m".to_string()]);
        assert!(dry.next_tombstone().is_none() && dry.leaves_pending() == 0);
    }

    #[test]
    fn an_object_that_left_while_its_join_was_pending_leaves_once_the_join_is_delivered() {
        // In one transaction a DELETED's report may come before its object's join's.
        let mut l = ledger(true);
        assert_eq!(decide(&mut l, join("n"), None), "join 0 w/cm/pods.a/n");
        l.left(["n".to_string()]);
        assert!(l.next_tombstone().is_none(), "not a member yet");
        assert_eq!(l.settle_join(0, true), Settled::Member);
        assert!(!l.members().contains("n"), "it left already");
        let t = l.next_tombstone().expect("its tombstone, after its join");
        assert_eq!(t.record.key, "w/cm/pods.a/n");

        // A join let go at a rewind and delivered late does not undo a leave recorded for the
        // replay's join of the same object.
        assert_eq!(decide(&mut l, join("r"), None), "join 1 w/cm/pods.a/r");
        l.clear_all();
        assert_eq!(decide(&mut l, join("r"), None), "join 2 w/cm/pods.a/r");
        l.left(["r".to_string()]);
        assert_eq!(l.settle_join(1, true), Settled::Member);
        assert!(l.members().contains("r"), "the stale join made it a member");
        assert_eq!(l.settle_join(2, true), Settled::Member);
        assert!(!l.members().contains("r"), "the replay's join ends it");

        // A member (made so by a join let go at a rewind) that leaves while the replay's join
        // of it is pending: that join, delivered, does not bring it back, nor owe a second
        // tombstone.
        assert_eq!(decide(&mut l, join("s"), None), "join 3 w/cm/pods.a/s");
        l.clear_all();
        assert_eq!(decide(&mut l, join("s"), None), "join 4 w/cm/pods.a/s");
        assert_eq!(l.settle_join(3, true), Settled::Member);
        l.left(["s".to_string()]);
        assert_eq!(l.settle_join(4, true), Settled::Member);
        assert!(!l.members().contains("s"), "left for good");
        let owed: Vec<String> = std::iter::from_fn(|| l.next_tombstone().map(|t| t.uid)).collect();
        assert_eq!(owed.iter().filter(|u| *u == "s").count(), 1, "{owed:?}");

        // A leave recorded for a join that fails is forgotten.
        assert_eq!(decide(&mut l, join("f"), None), "join 5 w/cm/pods.a/f");
        l.left(["f".to_string()]);
        assert_eq!(l.settle_join(5, false), Settled::Failed);
        assert!(l.left_joining.is_empty());
    }
}
