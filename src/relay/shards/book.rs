//! The shards of one membership in the group, as a replica holds them ([`Book`]): each one's
//! phase, decided by the pure machine in `lifecycle.rs`, its term's handle, the revokes waiting
//! for their shards and the claims due again. The loop ([`super::replica`]) feeds it what
//! happened and performs what it leaves to the loop.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::relay::context::RETRY;
use crate::relay::lifecycle::{self, Action, Input, Phase};

/// A shard's term, as the loop keeps it.
pub(super) struct Running {
    pub(super) stop: CancellationToken,
    pub(super) fenced: CancellationToken,
    /// When it was claimed.
    pub(super) claimed: Instant,
    /// The epoch the group claimed it under.
    pub(super) epoch: u64,
    /// Which term of the membership this is (counted from 1): its report that every stream
    /// watches names it, so a report of an earlier term of the shard, still queued when that
    /// one ended, is not taken for this one's, even under the same epoch (the group's epochs
    /// start again when its offsets are lost).
    pub(super) term: u64,
}

/// A revocation waiting for its shards' terms to end.
struct Handover {
    /// Its shards whose part is not done yet.
    pending: BTreeSet<u32>,
    done: std::sync::mpsc::SyncSender<()>,
    revoked: Instant,
}

/// The shards of one membership in the group, as this replica holds them: each one's phase of
/// its lifecycle ([`lifecycle::step`] decides every change; nothing else does), the handle of
/// its term while one runs, the revokes waiting for their shards, and when to claim again the
/// shards whose term ended unasked.
#[derive(Default)]
pub(super) struct Book {
    phases: BTreeMap<u32, Phase>,
    terms: HashMap<u32, Running>,
    handovers: Vec<Handover>,
    reclaims: BTreeMap<u32, Instant>,
    /// Since when its ownership is unproven while terms may still produce (see
    /// [`crate::group::Deadline`]): they take and commit nothing until it is proven again.
    held: Option<Instant>,
}

/// A hold beginning or ending ([`Book::hold`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Hold {
    /// Ownership is unproven: the terms take and commit nothing.
    Began,
    /// Proven again after this long: the terms go on.
    Ended(std::time::Duration),
}

impl Book {
    /// `shard`'s term started as `run`.
    pub(super) fn started(&mut self, shard: u32, run: Running) {
        self.terms.insert(shard, run);
    }

    /// `shard`'s term ended (feed [`Input::TermEnded`] next).
    pub(super) fn ended(&mut self, shard: u32) {
        self.terms.remove(&shard);
    }

    /// A revoke of `shards`, answered on `done` once each is handed over (feed each its
    /// input next).
    pub(super) fn revoked(&mut self, shards: &[u32], done: std::sync::mpsc::SyncSender<()>) {
        self.handovers.push(Handover {
            pending: shards.iter().copied().collect(),
            done,
            revoked: Instant::now(),
        });
    }

    /// The epoch of `shard`'s running term when it is the `term`th of the membership: a
    /// report of an earlier term, still queued when that one ended, is not this claim's.
    pub(super) fn running_term(&self, shard: u32, term: u64) -> Option<u64> {
        self.terms
            .get(&shard)
            .filter(|r| r.term == term)
            .map(|r| r.epoch)
    }

    /// How many terms run (the shards owned).
    pub(super) fn running(&self) -> usize {
        self.terms.len()
    }

    /// Whether `shard` relays (its term runs under a claim).
    pub(super) fn relays(&self, shard: u32) -> bool {
        self.phases.get(&shard).is_some_and(|p| p.relaying())
    }

    /// Stops every term still running (a handover the group stopped waiting for).
    pub(super) fn stop_all(&self) {
        for run in self.terms.values() {
            run.stop.cancel();
        }
    }

    /// Steps `shard`'s lifecycle on `input` and performs what concerns its term and the
    /// revokes (stopping, fencing, answering, scheduling a claim); returns the actions the
    /// loop performs itself (starting a term, claiming again), each with its shard.
    pub(super) fn feed(
        &mut self,
        shard: u32,
        input: Input,
        metrics: &Metrics,
    ) -> Vec<(u32, Action)> {
        let phase = self.phases.get(&shard).copied().unwrap_or(Phase::Ended);
        let (next, actions) = lifecycle::step(phase, input);
        tracing::debug!(shard, ?phase, ?input, ?next, ?actions, "shard lifecycle");
        if next == Phase::Ended {
            self.phases.remove(&shard);
        } else {
            self.phases.insert(shard, next);
        }
        let mut loop_does = Vec::new();
        for action in actions {
            match action {
                Action::Stop => {
                    if let Some(run) = self.terms.get(&shard) {
                        run.stop.cancel();
                    }
                }
                Action::Fence => {
                    if let Some(run) = self.terms.get(&shard) {
                        run.fenced.cancel();
                        run.stop.cancel();
                    }
                }
                Action::Answer => {
                    for h in &mut self.handovers {
                        h.pending.remove(&shard);
                    }
                }
                Action::ReclaimLater => {
                    self.reclaims.insert(shard, Instant::now() + RETRY);
                }
                Action::TakenOver => {
                    if let Some(claimed) = self.terms.get(&shard).map(|r| r.claimed) {
                        metrics
                            .shard_takeover_seconds
                            .observe(claimed.elapsed().as_secs_f64());
                    }
                }
                Action::Start(_) | Action::Reclaim => loop_does.push((shard, action)),
            }
        }
        loop_does
    }

    /// The shards whose term may still produce: running, or draining at a revoke.
    pub(super) fn unfenced(&self) -> Vec<u32> {
        self.phases
            .iter()
            .filter(|(_, p)| p.relaying() || matches!(p, Phase::Revoking { .. }))
            .map(|(s, _)| *s)
            .collect()
    }

    /// The shards due to be claimed again at `now`, no longer scheduled.
    pub(super) fn due(&mut self, now: Instant) -> Vec<u32> {
        let due: Vec<u32> = self
            .reclaims
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(s, _)| *s)
            .collect();
        self.reclaims.retain(|s, _| !due.contains(s));
        due
    }

    /// When the clock next asks something of the loop: the ownership deadline (`lapse`) while a
    /// term may still produce, the first claim due again, and when the API server's silence
    /// reaches `sharding.apiUnreachableSeconds` (`unreachable`, when it applies) while terms
    /// run. `None`: nothing, until the group or a term says something.
    pub(super) fn next_look(
        &self,
        lapse: Instant,
        unreachable: Option<Instant>,
    ) -> Option<Instant> {
        let fence = (!self.unfenced().is_empty()).then_some(lapse);
        let reclaim = self.reclaims.values().min().copied();
        let leave = unreachable.filter(|_| !self.terms.is_empty());
        [fence, reclaim, leave].into_iter().flatten().min()
    }

    /// Whether the membership's ownership is `proven` at `now`, while terms may still produce:
    /// says when a hold begins or ends. Shards fenced end it.
    pub(super) fn hold(&mut self, proven: bool, now: Instant) -> Option<Hold> {
        let held = !proven && !self.unfenced().is_empty();
        match (self.held, held) {
            (None, true) => {
                self.held = Some(now);
                Some(Hold::Began)
            }
            (Some(since), false) => {
                self.held = None;
                Some(Hold::Ended(now.duration_since(since)))
            }
            _ => None,
        }
    }

    /// Answers every revoke whose shards are all handed over: the rebalance may go on. How
    /// long each took goes to `seconds`.
    pub(super) fn answer(&mut self, seconds: &prometheus::Histogram) {
        self.handovers.retain(|h| {
            if h.pending.is_empty() {
                seconds.observe(h.revoked.elapsed().as_secs_f64());
                let _ = h.done.send(());
            }
            !h.pending.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn running() -> Running {
        Running {
            stop: CancellationToken::new(),
            fenced: CancellationToken::new(),
            claimed: Instant::now(),
            epoch: 2,
            term: 1,
        }
    }

    /// The loop sleeps until the clock asks something of it, and not at all when it asks
    /// nothing: no poll.
    #[tokio::test(start_paused = true)]
    async fn the_loop_looks_at_the_clock_only_when_it_asks_something() {
        let now = Instant::now();
        let s = Duration::from_secs;
        let (lapse, silent) = (now + s(9), Some(now + s(30)));
        let book = |phases: &[(u32, Phase)], terms: &[u32], reclaims: &[(u32, u64)]| Book {
            phases: phases.iter().copied().collect(),
            terms: terms.iter().map(|t| (*t, running())).collect(),
            handovers: Vec::new(),
            reclaims: reclaims.iter().map(|(k, at)| (*k, now + s(*at))).collect(),
            held: None,
        };
        let running_one = [(1, Phase::Running { epoch: 2 })];
        // (case, book, unreachable, wakes at)
        let table: Vec<(&str, Book, Option<Instant>, Option<Instant>)> = vec![
            ("nothing held: no wake", book(&[], &[], &[]), silent, None),
            (
                "a running term: the deadline, before the silence's grace",
                book(&running_one, &[1], &[]),
                silent,
                Some(lapse),
            ),
            (
                "a draining term may still produce: the deadline",
                book(&[(1, Phase::Revoking { then: None })], &[1], &[]),
                None,
                Some(lapse),
            ),
            (
                "a fenced term produces nothing: no deadline, the grace while it stops",
                book(
                    &[(
                        1,
                        Phase::Fenced {
                            then: None,
                            answer: false,
                        },
                    )],
                    &[1],
                    &[],
                ),
                silent,
                silent,
            ),
            (
                "a claim due again first",
                book(&[(3, Phase::Claimed)], &[], &[(3, 4), (5, 6)]),
                silent,
                Some(now + s(4)),
            ),
            (
                "the grace first when the server went silent long ago",
                book(&running_one, &[1], &[]),
                Some(now + s(1)),
                Some(now + s(1)),
            ),
            (
                "no grace without terms",
                book(&[(3, Phase::Claimed)], &[], &[]),
                Some(now),
                None,
            ),
        ];
        for (case, book, unreachable, expected) in table {
            assert_eq!(book.next_look(lapse, unreachable), expected, "{case}");
        }
    }

    /// A hold begins once ownership is unproven while a term may still produce, ends once it
    /// is proven again (saying how long it lasted), and is no hold when every shard is fenced.
    #[tokio::test(start_paused = true)]
    async fn a_hold_begins_when_ownership_is_unproven_and_ends_when_proven() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        let mut book = Book::default();
        assert_eq!(book.hold(false, now), None, "nothing owned: no hold");
        book.phases.insert(1, Phase::Running { epoch: 2 });
        // (case, proven, at, says)
        let table = [
            ("proven: nothing", true, 0, None),
            ("unproven: it begins", false, 10, Some(Hold::Began)),
            ("still unproven: nothing more", false, 500, None),
            (
                "proven again: it ends",
                true,
                2_010,
                Some(Hold::Ended(ms(2_000))),
            ),
            ("proven still: nothing", true, 3_000, None),
            (
                "unproven again: a new hold",
                false,
                4_000,
                Some(Hold::Began),
            ),
        ];
        for (case, proven, at, says) in table {
            assert_eq!(book.hold(proven, now + ms(at)), says, "{case}");
        }
        book.phases.insert(
            1,
            Phase::Fenced {
                then: None,
                answer: false,
            },
        );
        assert_eq!(
            book.hold(false, now + ms(5_000)),
            Some(Hold::Ended(ms(1_000))),
            "fenced: the hold is over, the fence took its place"
        );
        assert_eq!(book.hold(false, now + ms(6_000)), None, "fenced: no hold");
    }
}
