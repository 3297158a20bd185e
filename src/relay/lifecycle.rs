//! A shard's lifecycle on this replica, pure: its phases, what can happen to it, and the one
//! function that decides what follows. The shard loop (`shards/replica.rs`) feeds it what the
//! group, the clock and the shard's term report, and performs the [`Action`]s; nothing here
//! does I/O.
//!
//! ```text
//!             Claimed(e) ┌──────────────────────────────────────────────┐
//!   Ended ───────────────► Starting{e} ── every stream watches ──► Running{e}
//!     ▲ ▲                     │  │  │                                 │  │  │
//!     │ │           Revoked   │  │  │ Fence (deadline lapsed)         │  │  │
//!     │ │  ┌──────────────────┘  │  └─────────────┐  (the same from Running)
//!     │ │  ▼                     │ Lost           ▼
//!     │ │ Revoking{then} ──Lost──┼──────────► Lost{then}      Fenced{then, answer}
//!     │ │  │ term ended: Answer  ▼               │ term ended: Answer   │ term ended
//!     │ └──┴──────────── (then: Starting{e}) ◄───┴──────────────────────┘ (Answer if owed)
//!     │
//!     └── Revoked/Lost: Answer ── Claimed ◄── term ended unasked (failed, or its writer
//!                                   │          found a newer owner): claimed again when due
//!                                   └── ReclaimDue: Reclaim
//! ```
//!
//! - A claim that arrives while the shard's previous term still stops waits in `then` and
//!   starts once that term ended: two terms of one shard never run at once on a replica.
//! - A revoke is answered (the rebalance goes on) only once the shard's term ended: drained and
//!   written when revoked, purged when fenced or lost. A revoke of a shard with no term is
//!   answered at once.
//! - A revoke or a lost assignment drops a claim waiting in `then`: the group took it back.
//! - Fencing wins over a drain under way: a revoked term whose deadline lapses, or whose
//!   assignment is lost, stops without draining, and the revoke is still answered.

/// Where a shard stands on this replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not this replica's, or nothing runs for it.
    Ended,
    /// Assigned here with no term: its last term ended unasked; claimed again when due.
    Claimed,
    /// Its term runs under `epoch`; not every stream watches yet.
    Starting {
        /// The owner epoch.
        epoch: u64,
    },
    /// Its term runs under `epoch` and every stream has watched.
    Running {
        /// The owner epoch.
        epoch: u64,
    },
    /// Revoked: its term stops as at a shutdown (drained, final positions written); the revoke
    /// is answered once it ended. `then`: a claim to start after it.
    Revoking {
        /// A claim waiting for the term to end.
        then: Option<u64>,
    },
    /// Ownership could not be proven in time: its term stops without draining, its records
    /// purged. `answer`: a revoke came meanwhile, answered once the term ended.
    Fenced {
        /// A claim waiting for the term to end.
        then: Option<u64>,
        /// A revoke waits for the term to end.
        answer: bool,
    },
    /// The assignment was lost (the session expired): its term stops without draining, and the
    /// revoke is answered once it ended.
    Lost {
        /// A claim waiting for the term to end.
        then: Option<u64>,
    },
}

/// What happens to a shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// The group assigned it under `epoch` (a claim, or a claim again).
    Claimed(u64),
    /// The group takes it away; the rebalance waits for the answer.
    Revoked,
    /// The group says the assignment was lost; the rebalance waits for the answer.
    Lost,
    /// The ownership deadline lapsed (passed, and held for half the session's margin with no
    /// renewal): no record may be produced for it any more.
    Fence,
    /// Every stream of its term under this claimed epoch watches (the term said so).
    Watching(u64),
    /// Its term ended.
    TermEnded,
    /// The time to claim it again came.
    ReclaimDue,
}

/// What the shard loop does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Start a term under this epoch.
    Start(u64),
    /// Stop the term, draining.
    Stop,
    /// Stop the term without draining, purging.
    Fence,
    /// The shard's part of a revoke is done.
    Answer,
    /// Ask the group to claim it again now, under a new epoch, if it still assigns it here.
    Reclaim,
    /// Claim it again after a pause.
    ReclaimLater,
    /// Its takeover is complete (every stream watches since the claim).
    TakenOver,
}

/// The phase after `input`, and what to do. At most three actions.
pub fn step(phase: Phase, input: Input) -> (Phase, Vec<Action>) {
    use Action as A;
    use Input as I;
    use Phase as P;
    match (phase, input) {
        // Nothing runs.
        (P::Ended | P::Claimed, I::Claimed(epoch)) => {
            (P::Starting { epoch }, vec![A::Start(epoch)])
        }
        (P::Ended | P::Claimed, I::Revoked | I::Lost) => (P::Ended, vec![A::Answer]),
        (P::Claimed, I::ReclaimDue) => (P::Claimed, vec![A::Reclaim]),
        (P::Ended | P::Claimed, _) => (phase, vec![]),

        // A term runs.
        (P::Starting { epoch }, I::Watching(e)) if e == epoch => {
            (P::Running { epoch }, vec![A::TakenOver])
        }
        (P::Starting { .. } | P::Running { .. }, I::Revoked) => (REVOKED, vec![A::Stop]),
        (P::Starting { .. } | P::Running { .. }, I::Lost) => {
            (P::Lost { then: None }, vec![A::Fence])
        }
        (P::Starting { .. } | P::Running { .. }, I::Fence) => (
            P::Fenced {
                then: None,
                answer: false,
            },
            vec![A::Fence, A::Reclaim],
        ),
        // A newer claim while the term runs: the old epoch is over.
        (P::Starting { .. } | P::Running { .. }, I::Claimed(epoch)) => (
            P::Fenced {
                then: Some(epoch),
                answer: false,
            },
            vec![A::Fence],
        ),
        // Ended unasked: failed, or fenced by its writer finding a newer owner.
        (P::Starting { .. } | P::Running { .. }, I::TermEnded) => {
            (P::Claimed, vec![A::ReclaimLater])
        }
        (P::Starting { .. } | P::Running { .. }, I::Watching(_) | I::ReclaimDue) => (phase, vec![]),

        // A term stops.
        (P::Revoking { .. }, I::Claimed(epoch)) => (P::Revoking { then: Some(epoch) }, vec![]),
        (P::Revoking { .. }, I::Lost) => (P::Lost { then: None }, vec![A::Fence]),
        (P::Revoking { then }, I::Fence) => (P::Fenced { then, answer: true }, vec![A::Fence]),
        (P::Revoking { then }, I::TermEnded) => start_then(then, A::Answer),
        (P::Revoking { .. }, I::Revoked) => (REVOKED, vec![]),
        (P::Revoking { .. }, I::Watching(_) | I::ReclaimDue) => (phase, vec![]),

        (P::Fenced { answer, .. }, I::Claimed(epoch)) => (
            P::Fenced {
                then: Some(epoch),
                answer,
            },
            vec![],
        ),
        (P::Fenced { .. }, I::Revoked) => (
            P::Fenced {
                then: None,
                answer: true,
            },
            vec![],
        ),
        (P::Fenced { .. }, I::Lost) => (P::Lost { then: None }, vec![]),
        (P::Fenced { then, answer: true }, I::TermEnded) => start_then(then, A::Answer),
        (
            P::Fenced {
                then: Some(epoch),
                answer: false,
            },
            I::TermEnded,
        ) => (P::Starting { epoch }, vec![A::Start(epoch)]),
        (
            P::Fenced {
                then: None,
                answer: false,
            },
            I::TermEnded,
        ) => (P::Ended, vec![]),
        (P::Fenced { .. }, I::Fence | I::Watching(_) | I::ReclaimDue) => (phase, vec![]),

        (P::Lost { .. }, I::Claimed(epoch)) => (P::Lost { then: Some(epoch) }, vec![]),
        (P::Lost { .. }, I::Revoked | I::Lost) => (P::Lost { then: None }, vec![]),
        (P::Lost { then }, I::TermEnded) => start_then(then, A::Answer),
        (P::Lost { .. }, I::Fence | I::Watching(_) | I::ReclaimDue) => (phase, vec![]),
    }
}

/// Revoking with no claim waiting.
const REVOKED: Phase = Phase::Revoking { then: None };

/// A stopped term's end: `first`, then the claim that waited for it, if any.
fn start_then(then: Option<u64>, first: Action) -> (Phase, Vec<Action>) {
    match then {
        Some(epoch) => (Phase::Starting { epoch }, vec![first, Action::Start(epoch)]),
        None => (Phase::Ended, vec![first]),
    }
}

impl Phase {
    /// Whether its term runs and may still produce: neither stopping nor stopped.
    pub fn relaying(self) -> bool {
        matches!(self, Phase::Starting { .. } | Phase::Running { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::Action as A;
    use super::Input as I;
    use super::Phase as P;
    use super::*;

    const REVOKING: P = P::Revoking { then: None };
    const FENCED: P = P::Fenced {
        then: None,
        answer: false,
    };

    #[test]
    fn transitions() {
        // (phase, input, next phase, actions)
        let table: Vec<(P, I, P, Vec<A>)> = vec![
            // Claims.
            (
                P::Ended,
                I::Claimed(3),
                P::Starting { epoch: 3 },
                vec![A::Start(3)],
            ),
            (
                P::Claimed,
                I::Claimed(4),
                P::Starting { epoch: 4 },
                vec![A::Start(4)],
            ),
            (
                P::Starting { epoch: 3 },
                I::Watching(3),
                P::Running { epoch: 3 },
                vec![A::TakenOver],
            ),
            (
                P::Running { epoch: 3 },
                I::Watching(3),
                P::Running { epoch: 3 },
                vec![],
            ),
            // A report of an earlier claim's term, come late, is not this term's.
            (
                P::Starting { epoch: 4 },
                I::Watching(3),
                P::Starting { epoch: 4 },
                vec![],
            ),
            // A revoke of nothing running is answered at once.
            (P::Ended, I::Revoked, P::Ended, vec![A::Answer]),
            (P::Ended, I::Lost, P::Ended, vec![A::Answer]),
            (P::Claimed, I::Revoked, P::Ended, vec![A::Answer]),
            // A handover: drained, answered once ended.
            (P::Running { epoch: 3 }, I::Revoked, REVOKING, vec![A::Stop]),
            (
                P::Starting { epoch: 3 },
                I::Revoked,
                REVOKING,
                vec![A::Stop],
            ),
            (REVOKING, I::TermEnded, P::Ended, vec![A::Answer]),
            // Claimed again while the old term stops: it waits, then starts.
            (
                REVOKING,
                I::Claimed(5),
                P::Revoking { then: Some(5) },
                vec![],
            ),
            (
                P::Revoking { then: Some(5) },
                I::TermEnded,
                P::Starting { epoch: 5 },
                vec![A::Answer, A::Start(5)],
            ),
            // Fencing wins over a drain, and the revoke is still answered.
            (
                REVOKING,
                I::Fence,
                P::Fenced {
                    then: None,
                    answer: true,
                },
                vec![A::Fence],
            ),
            (REVOKING, I::Lost, P::Lost { then: None }, vec![A::Fence]),
            (
                P::Fenced {
                    then: None,
                    answer: true,
                },
                I::TermEnded,
                P::Ended,
                vec![A::Answer],
            ),
            // The deadline lapsed: fenced, and claimed again at once if still assigned here.
            (
                P::Running { epoch: 3 },
                I::Fence,
                FENCED,
                vec![A::Fence, A::Reclaim],
            ),
            (
                FENCED,
                I::Claimed(6),
                P::Fenced {
                    then: Some(6),
                    answer: false,
                },
                vec![],
            ),
            (
                P::Fenced {
                    then: Some(6),
                    answer: false,
                },
                I::TermEnded,
                P::Starting { epoch: 6 },
                vec![A::Start(6)],
            ),
            (FENCED, I::TermEnded, P::Ended, vec![]),
            // A revoke or a loss drops a claim waiting for the term.
            (
                P::Fenced {
                    then: Some(6),
                    answer: false,
                },
                I::Revoked,
                P::Fenced {
                    then: None,
                    answer: true,
                },
                vec![],
            ),
            (
                P::Lost { then: Some(6) },
                I::Revoked,
                P::Lost { then: None },
                vec![],
            ),
            // Lost: purged, answered once ended.
            (
                P::Running { epoch: 3 },
                I::Lost,
                P::Lost { then: None },
                vec![A::Fence],
            ),
            (
                P::Lost { then: None },
                I::TermEnded,
                P::Ended,
                vec![A::Answer],
            ),
            (
                P::Lost { then: Some(7) },
                I::TermEnded,
                P::Starting { epoch: 7 },
                vec![A::Answer, A::Start(7)],
            ),
            // A newer claim while a term runs ends the old epoch first.
            (
                P::Running { epoch: 3 },
                I::Claimed(8),
                P::Fenced {
                    then: Some(8),
                    answer: false,
                },
                vec![A::Fence],
            ),
            // A term that ended unasked leaves the shard claimed: claimed again when due.
            (
                P::Running { epoch: 3 },
                I::TermEnded,
                P::Claimed,
                vec![A::ReclaimLater],
            ),
            (
                P::Starting { epoch: 3 },
                I::TermEnded,
                P::Claimed,
                vec![A::ReclaimLater],
            ),
            (P::Claimed, I::ReclaimDue, P::Claimed, vec![A::Reclaim]),
            (P::Ended, I::ReclaimDue, P::Ended, vec![]),
            // Late or repeated news changes nothing.
            (P::Ended, I::TermEnded, P::Ended, vec![]),
            (P::Ended, I::Fence, P::Ended, vec![]),
            (FENCED, I::Fence, FENCED, vec![]),
            (REVOKING, I::Revoked, REVOKING, vec![]),
            (
                P::Running { epoch: 3 },
                I::ReclaimDue,
                P::Running { epoch: 3 },
                vec![],
            ),
        ];
        for (phase, input, next, actions) in table {
            assert_eq!(
                step(phase, input),
                (next, actions),
                "{phase:?} on {input:?}"
            );
        }
    }

    /// Every phase and input: two terms of a shard never start while one runs, and every
    /// revoke is answered, at once or once the term ended.
    #[test]
    fn no_second_term_and_every_revoke_answered() {
        let phases = [
            P::Ended,
            P::Claimed,
            P::Starting { epoch: 1 },
            P::Running { epoch: 1 },
            P::Revoking { then: None },
            P::Revoking { then: Some(2) },
            P::Fenced {
                then: None,
                answer: false,
            },
            P::Fenced {
                then: Some(2),
                answer: true,
            },
            P::Lost { then: None },
            P::Lost { then: Some(2) },
        ];
        let inputs = [
            I::Claimed(9),
            I::Revoked,
            I::Lost,
            I::Fence,
            I::Watching(1),
            I::TermEnded,
            I::ReclaimDue,
        ];
        for phase in phases {
            for input in inputs {
                let (next, actions) = step(phase, input);
                let starts = actions.iter().any(|a| matches!(a, A::Start(_)));
                // A start only where no term runs any more.
                if starts {
                    assert!(
                        matches!(phase, P::Ended | P::Claimed) || input == I::TermEnded,
                        "{phase:?} on {input:?} starts a second term"
                    );
                }
                // A revoke leaves an answer owed or gives it.
                if matches!(input, I::Revoked | I::Lost) {
                    let owed = matches!(
                        next,
                        P::Revoking { .. } | P::Lost { .. } | P::Fenced { answer: true, .. }
                    );
                    assert!(
                        owed || actions.contains(&A::Answer),
                        "{phase:?} on {input:?}: the revoke is never answered"
                    );
                }
                // After a revoke or a loss, no claim waits.
                if matches!(input, I::Revoked | I::Lost) {
                    assert!(
                        !matches!(
                            next,
                            P::Revoking { then: Some(_) }
                                | P::Lost { then: Some(_) }
                                | P::Fenced { then: Some(_), .. }
                        ),
                        "{phase:?} on {input:?} keeps a claim the group took back"
                    );
                }
            }
        }
    }
}
