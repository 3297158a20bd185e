//! A cluster-wide stream filtered to some namespaces (the `clusterWide` watch strategy): one
//! watch of the cluster-wide collection instead of one per namespace, the objects of namespaces
//! out of scope dropped before anything else is done with them.
//!
//! # What the consumer sees
//! Exactly what one stream per namespace would give it:
//! - A namespace entering scope has its objects announced: the stream lists that namespace
//!   (at resourceVersion L) and announces every object, then drops the namespace's watch events
//!   at or below L (the list already holds them: its fence, see `stream::fences`), so each key
//!   keeps its order. This compares
//!   resourceVersions as integers (KEP-5504); where L is not one, the stream resyncs instead.
//! - A namespace leaving scope has its members deleted (inferred, flagged `synthetic`), in the
//!   stream's order, after everything the stream published about them.
//! - The stream's query fingerprint includes its namespaces, and is stamped on its checkpoints
//!   only once everything announced under them is acknowledged. A restart under the same
//!   namespaces resumes the watch from the position. Under others (namespaces entered or left
//!   while it was down) it resumes too when the members' namespaces, with some of the
//!   namespaces in scope now that hold no member, tell which ones the position covered
//!   ([`Scoped::resume_under`]; the set-sum saved beside the fingerprint tells which of many,
//!   see [`super::scope_sum`]), and takes the difference in as a move of its scope: those
//!   that left have their members deleted, and those that entered are taken in from the
//!   position ([`Scoped::floor`]), so every change after it is published. The sum also tells
//!   a member too many (members of a namespace the position did not cover: a crash lost the
//!   tombstones of a leave already stamped), whose namespace then enters or leaves as any
//!   other. A namespace in scope then without an object and out of scope now, which no name
//!   tells, is read back from the invertible table saved beside the sum (see
//!   [`super::scope_table`]) while few namespaces moved, and otherwise (under a selector)
//!   named by the API server's list of the namespaces it matched at exactly the position.
//!   Otherwise (the server no longer holds the position, the selectors changed, a member too
//!   many under an entry without a sum, or a crash before a move was acknowledged, which
//!   forgot the position) the position is dropped and the stream reconciles its members with
//!   a list of the whole collection under the new scope: objects re-announced, members out of
//!   scope deleted.
//! - A failed delivery replays its watch from the checkpoint, as any stream's does, once its
//!   scope is settled (the checkpoints carry the namespaces applied): every change is published
//!   again in order. During a scope change not acknowledged yet it resyncs whole instead: what
//!   it announced of entering namespaces (a list) and leaving ones (inferred DELETEDs) is not on
//!   its watch, so replaying the watch would not announce it again.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use tokio::sync::watch;

use super::scope_sum::{self, chosen, Solutions};
use super::scope_table;
use crate::event::comparable;

/// The namespaces in scope; `None` until they are known (a selector not listed yet).
pub type Namespaces = Option<Arc<BTreeSet<String>>>;

/// At a start whose namespaces moved, how many namespaces in scope without a member
/// [`Scoped::resume_under`] tries in every combination (2^10 fingerprints at most), where the
/// saved set-sum leaves them untold or there is none.
const UNTOLD_MAX: usize = 10;

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
        learned
            .iter()
            .filter(|ns| self.keeps(ns))
            .cloned()
            .collect()
    }

    /// Whether the filter keeps `namespace` when it learns it.
    fn keeps(&self, namespace: &str) -> bool {
        self.within.as_ref().is_none_or(|keep| keep(namespace))
    }
}

/// A filtered stream's view of its scope.
pub(super) struct Scoped {
    filter: NamespaceFilter,
    /// The query fingerprint of the collection, without the namespaces.
    base: String,
    /// The fingerprint the stream's checkpoint was saved under.
    saved_query: Option<String>,
    /// The set-sum of the namespaces it was saved under (see [`super::scope_sum`]); absent in
    /// older entries.
    saved_sum: Option<String>,
    /// The invertible table of those namespaces (see [`super::scope_table`]); absent in older
    /// entries.
    saved_table: Option<String>,
    /// The namespaces whose objects the stream has announced (or is announcing).
    applied: BTreeSet<String>,
    /// Set by a start that resumed from a position under other namespaces, until its first live
    /// read took the move in: the position, which the namespaces entering then are taken in from
    /// (see [`Scoped::floor`]).
    floor: Option<u64>,
}

impl Scoped {
    pub(super) fn new(
        filter: NamespaceFilter,
        base: String,
        saved_query: Option<String>,
        saved_sum: Option<String>,
        saved_table: Option<String>,
    ) -> Self {
        Self {
            filter,
            base,
            saved_query,
            saved_sum,
            saved_table,
            applied: BTreeSet::new(),
            floor: None,
        }
    }

    /// The stream's query fingerprint under the namespaces it applied.
    pub(super) fn fingerprint(&self) -> String {
        crate::config::Channel::scoped_fingerprint(
            self.applied.iter().map(String::as_str),
            &self.base,
        )
    }

    /// The set-sum of the namespaces it applied, stamped beside [`Scoped::fingerprint`].
    pub(super) fn sum(&self) -> String {
        scope_sum::sum(self.applied.iter().map(String::as_str), &self.base)
    }

    /// The invertible table of the namespaces it applied, stamped beside [`Scoped::sum`].
    pub(super) fn table(&self) -> String {
        scope_table::table(self.applied.iter().map(String::as_str), &self.base)
    }

    /// Whether the checkpoint was saved under this query but for its namespaces (the same
    /// collection and selectors), as its table says; `false` without a table.
    pub(super) fn saved_under_this_query(&self) -> bool {
        (self.saved_table.as_deref()).is_some_and(|t| scope_table::over(t, &self.base))
    }

    pub(super) fn saved_query(&self) -> Option<&String> {
        self.saved_query.as_ref()
    }

    /// Whether an object of `namespace` belongs to the state a sync announces.
    pub(super) fn holds(&self, namespace: Option<&str>) -> bool {
        namespace.is_some_and(|ns| self.applied.contains(ns))
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

    /// At a start whose checkpoint was saved under other namespaces (`saved`, its fingerprint)
    /// at position `at`: takes for applied the namespaces the position covers, if they can be
    /// told, so that the stream resumes from it and then takes the difference in as a move of
    /// its scope (those that left deleted, those that entered taken in, see [`Scoped::floor`]),
    /// instead of reconciling the whole scope with a list. The candidates are `held` (the
    /// namespaces of the stream's members) with some of the namespaces in scope now that hold
    /// no member (a namespace in scope then without an object): those the saved set-sum allows
    /// (see [`super::scope_sum`]), or without one every combination of at most [`UNTOLD_MAX`]
    /// of them; past that, none or all of them. The one whose fingerprint is `saved` is the
    /// position's. Failing that, the sum may tell members' namespaces the position did not
    /// cover (a member too many: its leave was stamped, and a crash lost its tombstone): one
    /// in scope now enters, as any namespace entering; one out of scope stays applied, so that
    /// its members are deleted again (a superfluous inferred DELETED each) as it leaves.
    /// Failing both, the saved invertible table reads back the namespaces that moved, those
    /// it cannot name too (in scope then without an object, out of scope now). `then` names
    /// more candidates: the namespaces the API server says were in scope at the position (its
    /// list at exactly that resourceVersion; empty when not asked), which names those too, so
    /// that the sum tells them among any number of moves. None tells (the selectors changed,
    /// such a namespace among more moves than the table reads and `then` does not name) and it
    /// is not resumed: false.
    pub(super) fn resume_under(
        &mut self,
        saved: &str,
        held: BTreeSet<String>,
        at: &str,
        then: &BTreeSet<String>,
    ) -> bool {
        let extra: Vec<&str> = (then.iter())
            .filter(|ns| {
                self.filter.keeps(ns) && !self.applied.contains(*ns) && !held.contains(*ns)
            })
            .map(String::as_str)
            .collect();
        let Some(covered) = self
            .told(saved, &held, &extra)
            .or_else(|| self.too_many(saved, &held, &extra))
            .or_else(|| self.read_back(saved, &held, &extra))
        else {
            return false;
        };
        let stale = held.difference(&covered);
        let leaving: Vec<String> = stale
            .filter(|ns| !self.applied.contains(*ns))
            .cloned()
            .collect();
        self.applied = covered;
        self.applied.extend(leaving);
        self.floor = comparable(at);
        true
    }

    /// The namespaces whose fingerprint is `saved`: `held` and some of the others applied or
    /// `extra`.
    fn told(
        &self,
        saved: &str,
        held: &BTreeSet<String>,
        extra: &[&str],
    ) -> Option<BTreeSet<String>> {
        let mut untold: Vec<&str> = self.applied.difference(held).map(String::as_str).collect();
        untold.extend_from_slice(extra);
        let n = untold.len();
        let solutions = self
            .solve(held, &untold)
            .or_else(|| (n <= UNTOLD_MAX).then(|| Solutions::any(n)));
        let tries: Vec<Vec<u64>> = match solutions {
            Some(s) if s.kernel.len() <= UNTOLD_MAX => s.each().collect(),
            _ => vec![vec![0; n.div_ceil(64)], vec![u64::MAX; n.div_ceil(64)]],
        };
        self.first_saved(saved, held, &untold, tries)
    }

    /// The namespaces whose fingerprint is `saved`, some of `held` not among them: those the
    /// saved set-sum allows, a member's namespace chosen meaning it is out. Only with a sum:
    /// without one, a member too many is not told.
    fn too_many(
        &self,
        saved: &str,
        held: &BTreeSet<String>,
        extra: &[&str],
    ) -> Option<BTreeSet<String>> {
        let mut candidates: Vec<&str> = self.applied.difference(held).map(String::as_str).collect();
        candidates.extend_from_slice(extra);
        candidates.extend(held.iter().map(String::as_str));
        let solutions = self.solve(held, &candidates)?;
        if solutions.kernel.len() > UNTOLD_MAX {
            return None;
        }
        self.first_saved(saved, held, &candidates, solutions.each())
    }

    /// The namespaces the saved invertible table holds, read back against those applied (the
    /// scope now): less those that entered, plus those that left, named by `held` where they
    /// had a member or `extra` names them. Those it cannot name (neither in scope now nor a
    /// member's: unlabelled or deleted while the stream was down, without an object of it) are
    /// left out: they hold nothing of the stream's, so they would only leave it. With none of
    /// those the answer is checked against `saved`; with some, whose names the fingerprint
    /// needs, against the saved set-sum, which needs only their seeds.
    fn read_back(
        &self,
        saved: &str,
        held: &BTreeSet<String>,
        extra: &[&str],
    ) -> Option<BTreeSet<String>> {
        let table = self.saved_table.as_deref()?;
        let moved =
            scope_table::difference(table, &self.base, self.applied.iter().map(String::as_str))?;
        let named: HashMap<u64, &str> = (self.applied.iter().chain(held).map(String::as_str))
            .chain(extra.iter().copied())
            .map(|ns| (scope_table::seed(ns), ns))
            .collect();
        let mut covered = self.applied.clone();
        let mut unnamed = Vec::new();
        for seed in moved {
            match named.get(&seed) {
                Some(ns) => {
                    if !covered.remove(*ns) {
                        covered.insert(ns.to_string());
                    }
                }
                None => unnamed.push(seed),
            }
        }
        let names = covered.iter().map(String::as_str);
        let told = if unnamed.is_empty() {
            crate::config::Channel::scoped_fingerprint(names, &self.base) == saved
        } else {
            (self.saved_sum.as_deref())
                .is_some_and(|sum| scope_sum::sums_to(sum, &self.base, names, &unnamed))
        };
        told.then_some(covered)
    }

    /// What the saved set-sum says of `candidates`, with `held` known to be in; `None` without
    /// a sum, or past its bits and ten more candidates (too many to tell).
    fn solve(&self, held: &BTreeSet<String>, candidates: &[&str]) -> Option<Solutions> {
        let sum = self.saved_sum.as_deref()?;
        if candidates.len() > sum.len() * 4 + UNTOLD_MAX {
            return None;
        }
        Solutions::of(sum, &self.base, held.iter().map(String::as_str), candidates)
    }

    /// The first of `tries` whose namespaces have fingerprint `saved`: `held`, each candidate
    /// a try chooses toggled (a namespace without a member in, a member's out).
    fn first_saved(
        &self,
        saved: &str,
        held: &BTreeSet<String>,
        candidates: &[&str],
        tries: impl IntoIterator<Item = Vec<u64>>,
    ) -> Option<BTreeSet<String>> {
        tries.into_iter().find_map(|bits| {
            let mut covered = held.clone();
            for ns in chosen(&bits, candidates) {
                if !covered.remove(ns) {
                    covered.insert(ns.to_string());
                }
            }
            let fingerprint = crate::config::Channel::scoped_fingerprint(
                covered.iter().map(String::as_str),
                &self.base,
            );
            (fingerprint == saved).then_some(covered)
        })
    }

    /// The position a start resumed from under other namespaces, while its first live read has
    /// not taken the move in (`None` otherwise). A namespace entering then is taken in from it,
    /// not from a list: the list announces only its objects at or below the position (they
    /// have not changed since), and its watch events above the position are published, as the
    /// resumed watch replays them. So every change after the position is published, whether the
    /// namespace was in scope then (without an object: the list holds nothing at or below it)
    /// or entered since.
    pub(super) fn floor(&self) -> Option<u64> {
        self.floor
    }

    /// The first live read took the move in (or had none to take): namespaces entering from now
    /// on are listed, as they enter while the stream watches.
    pub(super) fn floor_passed(&mut self) {
        self.floor = None;
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
    }

    /// Namespace `ns` entered: its objects are the stream's (the stream fences its events up to
    /// the list that took it in, see `stream::fences`).
    pub(super) fn enter(&mut self, ns: &str) {
        self.applied.insert(ns.to_string());
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
        self.floor = None;
    }
}

/// Waits for a filtered stream's scope to move (never for another stream).
pub(super) async fn changed(scoped: &mut Option<Scoped>) {
    match scoped {
        Some(s) => s.changed().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    /// A scope of `a` and `c` now, as a start takes it.
    async fn now() -> Scoped {
        let filter = NamespaceFilter::fixed(["a".to_string(), "c".to_string()]);
        let mut scoped = Scoped::new(filter, "base".into(), None, None, None);
        scoped.take_all().await;
        scoped
    }

    #[tokio::test]
    async fn a_start_resumes_under_the_namespaces_its_position_covered_when_they_can_be_told() {
        // (the selectors then, saved under, the members' namespaces, the position) -> applied,
        // or no resume; the floor, where it resumes.
        type Row = (
            &'static str,
            &'static [&'static str],
            &'static [&'static str],
            &'static str,
            Option<&'static [&'static str]>,
        );
        let rows: [Row; 9] = [
            // `c` entered while down, `b` left: the members tell the old scope.
            ("base", &["a", "b"], &["a", "b"], "100", Some(&["a", "b"])),
            // `b` left, nothing entered: the members and the scope now.
            (
                "base",
                &["a", "b", "c"],
                &["a", "b"],
                "100",
                Some(&["a", "b", "c"]),
            ),
            // `c` entered; `a` had no member but was in scope: the members and `a`.
            ("base", &["a"], &[], "100", Some(&["a"])),
            // `b` had members and left; `a` and `c` had none but were in scope: told by the
            // combination of both.
            (
                "base",
                &["a", "b", "c"],
                &["b"],
                "100",
                Some(&["a", "b", "c"]),
            ),
            // A namespace in scope then without a member, and not in scope now: not told.
            ("base", &["a", "x"], &["a"], "100", None),
            // A member too many (`y`, whose leave's tombstone was lost): not told.
            ("base", &["a"], &["a", "y"], "100", None),
            // The selectors changed: never resumed.
            ("other", &["a"], &["a"], "100", None),
            ("other", &["a"], &[], "100", None),
            // A position that is no integer still resumes; what enters is listed then.
            ("base", &["a", "b"], &["a", "b"], "x1", Some(&["a", "b"])),
        ];
        for (i, (base, saved, held, at, applied)) in rows.into_iter().enumerate() {
            let mut scoped = now().await;
            let saved = crate::config::Channel::scoped_fingerprint(saved.iter().copied(), base);
            let resumed = scoped.resume_under(&saved, set(held), at, &BTreeSet::new());
            assert_eq!(resumed, applied.is_some(), "row {i}");
            assert_eq!(
                scoped.applied,
                set(applied.unwrap_or(&["a", "c"])),
                "row {i}"
            );
            assert_eq!(
                scoped.floor(),
                (resumed && at == "100").then_some(100),
                "row {i}: what enters is taken in from the position"
            );
        }
    }

    #[tokio::test]
    async fn past_ten_namespaces_without_a_member_only_none_and_all_are_tried() {
        let scope: Vec<String> = (0..70).map(|i| format!("n{i:02}")).collect();
        for (saved, told) in [(&scope[..], true), (&scope[..1], false)] {
            let filter = NamespaceFilter::fixed(scope.clone());
            let mut scoped = Scoped::new(filter, "base".into(), None, None, None);
            scoped.take_all().await;
            let saved = crate::config::Channel::scoped_fingerprint(
                saved.iter().map(String::as_str),
                "base",
            );
            assert_eq!(
                scoped.resume_under(&saved, BTreeSet::new(), "7", &BTreeSet::new()),
                told
            );
        }
    }

    #[tokio::test]
    async fn past_ten_namespaces_without_a_member_the_saved_sum_tells_which() {
        let scope: Vec<String> = (0..70).map(|i| format!("n{i:02}")).collect();
        let names = |r: std::ops::Range<usize>, extra: &[&str]| -> Vec<String> {
            let mut v = scope[r].to_vec();
            v.extend(extra.iter().map(|s| s.to_string()));
            v.sort_unstable();
            v
        };
        // (the namespaces then, the selectors then, the members' namespaces) -> told; applied
        // are then the namespaces then, with any member's namespace out of scope and not then.
        let rows: [(Vec<String>, &str, &[&str], bool); 8] = [
            // Twenty entered while down, none with a member yet.
            (names(0..50, &[]), "base", &[], true),
            // The same with members in some, and one with members left.
            (
                names(0..50, &["gone"]),
                "base",
                &["n01", "n02", "gone"],
                true,
            ),
            // Nothing moved but the members.
            (names(0..70, &[]), "base", &["n03"], true),
            // One without a member then is out of scope now: not told.
            (names(0..50, &["gone"]), "base", &[], false),
            // The selectors changed.
            (names(0..50, &[]), "other", &[], false),
            // A member too many, its namespace in scope now but not then: told, and it enters.
            (names(0..50, &[]), "base", &["n60"], true),
            // A member too many, its namespace in scope neither then nor now: told, and it
            // stays applied until the first live read takes it out.
            (names(0..50, &[]), "base", &["n01", "stale"], true),
            // A member too many and one without a member then, out of scope now: not told.
            (names(0..50, &["gone"]), "base", &["n60"], false),
        ];
        for (i, (then, base, held, told)) in rows.into_iter().enumerate() {
            let query =
                crate::config::Channel::scoped_fingerprint(then.iter().map(String::as_str), base);
            let sum = scope_sum::sum(then.iter().map(String::as_str), base);
            let filter = NamespaceFilter::fixed(scope.clone());
            let mut scoped = Scoped::new(filter, "base".into(), None, Some(sum), None);
            scoped.take_all().await;
            assert_eq!(
                scoped.resume_under(&query, set(held), "7", &BTreeSet::new()),
                told,
                "row {i}"
            );
            if told {
                // A member's namespace in scope neither then nor now stays to be left.
                let stale = held
                    .iter()
                    .filter(|ns| {
                        !then.contains(&ns.to_string()) && !scope.contains(&ns.to_string())
                    })
                    .map(|ns| ns.to_string());
                let applied: BTreeSet<String> = then.iter().cloned().chain(stale).collect();
                assert_eq!(scoped.applied, applied, "row {i}");
            }
        }
    }

    #[tokio::test]
    async fn a_namespace_without_a_member_gone_from_the_scope_is_read_from_the_saved_table() {
        let scope: Vec<String> = (0..70).map(|i| format!("n{i:02}")).collect();
        let names = |r: std::ops::Range<usize>, extra: &[&str]| -> Vec<String> {
            let mut v = scope[r].to_vec();
            v.extend(extra.iter().map(|s| s.to_string()));
            v
        };
        // (the namespaces then, the selectors then, the members' namespaces, whether the entry
        // has a table) -> applied, or not told. Each row has a namespace in scope then without
        // a member, out of scope now (`gone`, `gone2`), which no name tells.
        type Row = (
            Vec<String>,
            &'static str,
            &'static [&'static str],
            bool,
            Option<Vec<String>>,
        );
        let rows: [Row; 7] = [
            // Two entered and one without a member left: read back, `gone` left out.
            (
                names(0..68, &["gone"]),
                "base",
                &[],
                true,
                Some(names(0..68, &[])),
            ),
            // The same, and a namespace with members left too: applied until it is taken out.
            (
                names(0..68, &["gone", "left"]),
                "base",
                &["n01", "left"],
                true,
                Some(names(0..68, &["left"])),
            ),
            // Two without a member left, nothing entered.
            (
                names(0..70, &["gone", "gone2"]),
                "base",
                &["n05"],
                true,
                Some(names(0..70, &[])),
            ),
            // A member too many (`stale`, in scope neither then nor now) beside `gone`: it stays
            // applied until the first live read takes it out.
            (
                names(0..70, &["gone"]),
                "base",
                &["stale"],
                true,
                Some(names(0..70, &["stale"])),
            ),
            // Fifty entered beside `gone`: more than the table reads, and the sum cannot name
            // `gone`.
            (names(0..20, &["gone"]), "base", &[], true, None),
            // The selectors changed.
            (names(0..68, &["gone"]), "other", &[], true, None),
            // An entry without a table (an older version's).
            (names(0..68, &["gone"]), "base", &[], false, None),
        ];
        for (i, (then, base, held, has_table, applied)) in rows.into_iter().enumerate() {
            let query =
                crate::config::Channel::scoped_fingerprint(then.iter().map(String::as_str), base);
            let sum = scope_sum::sum(then.iter().map(String::as_str), base);
            let table =
                has_table.then(|| scope_table::table(then.iter().map(String::as_str), base));
            let filter = NamespaceFilter::fixed(scope.clone());
            let mut scoped = Scoped::new(filter, "base".into(), None, Some(sum), table);
            scoped.take_all().await;
            let told = scoped.resume_under(&query, set(held), "7", &BTreeSet::new());
            assert_eq!(told, applied.is_some(), "row {i}");
            let applied: BTreeSet<String> = applied.unwrap_or(scope.clone()).into_iter().collect();
            assert_eq!(scoped.applied, applied, "row {i}");
        }
        // What the table reads with an unnamed namespace is checked against the sum: one
        // saved with another namespace besides (as a wrong read would be) tells nothing.
        let then = names(0..68, &["gone"]);
        let query =
            crate::config::Channel::scoped_fingerprint(then.iter().map(String::as_str), "base");
        let table = scope_table::table(then.iter().map(String::as_str), "base");
        let other = names(0..68, &["gone", "more"]);
        let sum = scope_sum::sum(other.iter().map(String::as_str), "base");
        let filter = NamespaceFilter::fixed(scope.clone());
        let mut scoped = Scoped::new(filter, "base".into(), None, Some(sum), Some(table));
        scoped.take_all().await;
        assert!(!scoped.resume_under(&query, set(&[]), "7", &BTreeSet::new()));
    }

    #[tokio::test]
    async fn the_servers_namespaces_at_the_position_name_what_no_table_reads() {
        let scope: Vec<String> = (0..70).map(|i| format!("n{i:02}")).collect();
        // Fifty entered beside `gone` (in scope then without a member, out of scope now): more
        // than the table reads. The server's list at the position names `gone` (and more
        // namespaces of the cluster), so the sum tells it among the fifty; the list's names out
        // of the filter (another shard's) are no candidates.
        let then: BTreeSet<String> = (scope[0..20].iter().cloned())
            .chain(["gone".to_string()])
            .collect();
        let query =
            crate::config::Channel::scoped_fingerprint(then.iter().map(String::as_str), "base");
        let sum = scope_sum::sum(then.iter().map(String::as_str), "base");
        let table = scope_table::table(then.iter().map(String::as_str), "base");
        let listed = |extra: &[&str]| -> BTreeSet<String> {
            then.iter()
                .cloned()
                .chain(extra.iter().map(|s| s.to_string()))
                .collect()
        };
        // (the server's list at the position, whether the filter keeps `gone`) -> told.
        let cases = [
            (BTreeSet::new(), true, false),
            (listed(&["other", "more"]), true, true),
            (listed(&[]), true, true),
            // Named, but out of the filter (another shard's): no candidate, not told.
            (set(&["gone"]), false, false),
        ];
        for (i, (listed, keeps_gone, want)) in cases.into_iter().enumerate() {
            let mut filter = NamespaceFilter::fixed(scope.clone());
            if !keeps_gone {
                filter = filter.within(Arc::new(|ns: &str| ns != "gone"));
            }
            let mut scoped = Scoped::new(
                filter,
                "base".into(),
                None,
                Some(sum.clone()),
                Some(table.clone()),
            );
            scoped.take_all().await;
            let told = scoped.resume_under(&query, set(&["n00"]), "7", &listed);
            assert_eq!(told, want, "case {i}");
            let applied = if want {
                then.clone()
            } else {
                scope.iter().cloned().collect()
            };
            assert_eq!(scoped.applied, applied, "case {i}");
        }
    }

    #[tokio::test]
    async fn the_floor_holds_until_the_first_live_read_or_a_sync() {
        let saved = crate::config::Channel::scoped_fingerprint(["a"], "base");
        for sync in [false, true] {
            let mut scoped = now().await;
            assert!(scoped.resume_under(&saved, set(&[]), "7", &BTreeSet::new()));
            assert_eq!(scoped.floor(), Some(7));
            if sync {
                scoped.take_all().await;
            } else {
                scoped.floor_passed();
            }
            assert_eq!(scoped.floor(), None, "sync: {sync}");
        }
    }
}
