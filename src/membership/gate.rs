//! The join gate: what an outbox sends waits, in order, behind the membership joins produced
//! before it, until Kafka has acknowledged them (see [`crate::membership`] for why). Pure
//! bookkeeping; the outbox produces the records.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::Known;

/// Joins in flight and the entries waiting behind them.
///
/// Joins are numbered in the order they are produced. An entry held while the next join's
/// number is `g` waits for every join numbered below `g`; entries leave in the order they came,
/// so one that need not wait still goes after those held before it.
pub(crate) struct Gate<T> {
    /// Joins produced and not yet acknowledged, by number: the object and its identity.
    joins: BTreeMap<u64, (String, Known)>,
    /// The number of each object's pending join.
    joining: HashMap<String, u64>,
    next: u64,
    held: VecDeque<(u64, T)>,
    /// Joins numbered below this were pending at a rewind that let them go (see
    /// [`Gate::let_go`]): a failure of one is no cause to replay again.
    stale_before: u64,
}

impl<T> Gate<T> {
    pub fn new() -> Self {
        Self {
            joins: BTreeMap::new(),
            joining: HashMap::new(),
            next: 0,
            held: VecDeque::new(),
            stale_before: 0,
        }
    }

    /// At a rewind: the pending joins no longer stand for their objects, whose replay joins
    /// them anew; each still makes its object a member if acknowledged, and its failure, which
    /// the replay already answers, asks for nothing more.
    pub fn let_go(&mut self) {
        self.joining.clear();
        self.stale_before = self.next;
    }

    /// Whether join `n` was let go at a rewind.
    pub fn stale(&self, n: u64) -> bool {
        n < self.stale_before
    }

    /// Whether `uid`'s join is pending.
    pub fn joining(&self, uid: &str) -> bool {
        self.joining_number(uid).is_some()
    }

    /// The number of `uid`'s pending join.
    pub fn joining_number(&self, uid: &str) -> Option<u64> {
        self.joining.get(uid).copied()
    }

    /// The number the next join's record carries.
    pub fn next_number(&self) -> u64 {
        self.next
    }

    /// The join of `uid`, numbered [`Gate::next_number`], was produced.
    pub fn joined(&mut self, uid: String, known: Known) {
        let n = self.next;
        self.next += 1;
        self.joining.insert(uid.clone(), n);
        self.joins.insert(n, (uid, known));
    }

    /// Whether any join awaits its acknowledgement.
    pub fn pending(&self) -> bool {
        !self.joins.is_empty()
    }

    /// Whether any entry is held.
    pub fn holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// `entry` back when it may go now (it need not `wait` and nothing is held before it);
    /// otherwise it is held.
    pub fn admit(&mut self, entry: T, wait: bool) -> Option<T> {
        if wait || self.holding() {
            self.held.push_back((self.next, entry));
            return None;
        }
        Some(entry)
    }

    /// Join `n` was reported (acknowledged or failed): its object and identity, once.
    pub fn settled(&mut self, n: u64) -> Option<(String, Known)> {
        let (uid, known) = self.joins.remove(&n)?;
        if self.joining.get(&uid) == Some(&n) {
            self.joining.remove(&uid);
        }
        Some((uid, known))
    }

    /// The first held entry, once every join it waits for is settled.
    pub fn next_released(&mut self) -> Option<T> {
        let gate = self.held.front()?.0;
        let clear = self.joins.first_key_value().is_none_or(|(&n, _)| n >= gate);
        clear.then(|| self.held.pop_front().map(|(_, entry)| entry))?
    }

    /// Forgets every held entry (a rewind replays them); pending joins stay, their reports
    /// still make members.
    pub fn clear_held(&mut self) {
        self.held.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(g: &mut Gate<&'static str>, uid: &str) -> u64 {
        let n = g.next_number();
        g.joined(uid.into(), Known::default());
        n
    }

    fn released(g: &mut Gate<&'static str>) -> Vec<&'static str> {
        std::iter::from_fn(|| g.next_released()).collect()
    }

    #[test]
    fn entries_wait_in_order_behind_the_joins_produced_before_them() {
        let mut g = Gate::new();
        assert_eq!(g.admit("free", false), Some("free"));
        let a = join(&mut g, "a");
        assert_eq!(g.admit("announces a", true), None);
        let b = join(&mut g, "b");
        assert_eq!(g.admit("announces b", true), None);
        // Needs no join, but goes after what came before it.
        assert_eq!(g.admit("member", false), None);
        assert!(g.joining("a") && g.joining("b"));
        // b acknowledged first: nothing goes, a's entry is still first in line.
        assert_eq!(g.settled(b).map(|(uid, _)| uid).as_deref(), Some("b"));
        assert_eq!(released(&mut g), Vec::<&str>::new());
        assert_eq!(g.settled(a).map(|(uid, _)| uid).as_deref(), Some("a"));
        assert_eq!(released(&mut g), ["announces a", "announces b", "member"]);
        assert!(!g.pending() && !g.holding() && !g.joining("a"));
        assert_eq!(g.settled(a), None, "a join settles once");
    }

    #[test]
    fn an_entry_waits_only_for_joins_before_it() {
        let mut g = Gate::new();
        let a = join(&mut g, "a");
        assert_eq!(g.admit("announces a", true), None);
        let b = join(&mut g, "b");
        assert_eq!(g.settled(a).map(|(uid, _)| uid).as_deref(), Some("a"));
        // b's join came after: the entry held before it goes.
        assert_eq!(released(&mut g), ["announces a"]);
        assert!(g.pending());
        g.admit("announces b", true);
        g.clear_held();
        assert!(
            !g.holding() && g.joining("b"),
            "a rewind keeps pending joins"
        );
        assert!(g.settled(b).is_some());
    }

    #[test]
    fn joins_let_go_at_a_rewind_make_members_but_ask_for_no_replay() {
        let mut g: Gate<&'static str> = Gate::new();
        let first = join(&mut g, "a");
        let second = join(&mut g, "b");
        g.let_go();
        assert!(
            !g.joining("a") && !g.joining("b"),
            "the replay joins them anew"
        );
        assert!(g.stale(first) && g.stale(second));
        let again = join(&mut g, "a");
        assert!(!g.stale(again));
        assert!(g.joining("a"));
        // The old join's report does not take the new one's place.
        assert!(g.settled(first).is_some());
        assert!(g.joining("a"), "the new join still stands for a");
        // An entry held behind the new join waits for the stale one still pending too.
        assert_eq!(g.admit("behind", true), None);
        assert!(g.settled(again).is_some());
        assert_eq!(released(&mut g), Vec::<&str>::new());
        assert!(g.settled(second).is_some());
        assert_eq!(released(&mut g), vec!["behind"]);
    }
}
