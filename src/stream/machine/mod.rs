//! A stream's state machine, pure: its states, what a step reports, and the one function that
//! decides where to go next. The driver ([`super::Stream`]) performs the steps; nothing here
//! does I/O.
//!
//! ```text
//!                 built-in channel                 custom channel (a CRD, maybe not installed)
//!                        │                                   │
//!                        │              ┌─── not served ─── AwaitResource
//!                        │              └──────────────────►   │ served
//!                        ▼                                     ▼
//!          no checkpoint ├──────────────► Sync{Start} ◄────────┤ no checkpoint
//!                        │                    │ synced at rv   │
//!          checkpoint rv ▼                    ▼                ▼ checkpoint rv
//!                      Watch{rv} ◄────────────┴────────────────┘
//!                       │   ▲  └─ closed, cut, stalled: Watch{last position read}
//!                       │   │     (closed having read nothing: through Backoff, like a failure)
//!                       │   └──── synced at rv (a resync, like a start)
//!   410 Gone, rewound, requested, ▼
//!   behind (504, after a backoff)
//!                   Sync{Resync} ── reconciles: inferred DELETED for known objects it lacks
//!
//! Every failure but a stall passes through Backoff{then} first; Cancelled leads anywhere to
//! Done. A failed delivery goes back to the checkpoint: Watch{checkpoint}, or Sync{Start}
//! without one; a filtered stream whose scope change is not acknowledged yet (Profile)
//! resyncs whole instead of replaying its watch.
//! Sync uses a `sendInitialEvents` watch (Via::InitialEvents), which goes on as the Watch on the
//! same connection once the initial state has ended; a server that refuses it is synced with
//! paginated lists (Via::Pages) from then on.
//! ```
//!
//! # What a consumer may rely on after a relist
//! A Sync announces every object that exists (as ADDED) — after a 410 (flagged `resync`) only
//! those that are not members of the stream or changed since its acknowledged position (a delta
//! resync; see [`super::sync`]) — then, after a 410, publishes an inferred DELETED (flagged
//! `synthetic`) for every object the stream had announced that the new state lacks, then a
//! BOOKMARK annotated `watchrelay.io/resync-end`. Applying a key's messages in order therefore
//! ends at the cluster's state as of the relist; changes after it follow on the watch.

use std::time::Duration;

use crate::kubeapi::ApiError;
use crate::outbox::{Failure, OutboxError};

/// How a stream gets the whole current state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// A watch with `sendInitialEvents=true` (the WatchList feature).
    InitialEvents,
    /// Paginated lists.
    Pages,
}

/// Why a stream syncs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// No usable position: announce the current state.
    Start,
    /// The position expired (410): re-announce, flagged as a resync, and infer deletions.
    Resync,
}

/// Where a stream reads from, and how it gets the whole state again when that fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cursor {
    pub rv: String,
    pub via: Via,
}

/// Where a stream stands. `C` is an open watch connection (the driver's; tests use `()`).
#[derive(Debug, PartialEq)]
pub enum State<C> {
    /// A custom channel whose resource discovery does not list (yet).
    AwaitResource { via: Via },
    /// Announcing the whole current state.
    Sync { reason: Reason, via: Via },
    /// Watching from `at`; `open` is a connection already reading there (the initial-events
    /// watch going on as a plain watch).
    Watch { at: Cursor, open: Option<C> },
    /// Waiting before `then`.
    Backoff {
        then: Box<State<C>>,
        delay: Duration,
    },
    /// Cancelled: drain and stop.
    Done,
}

/// Why a step stopped.
#[derive(Debug)]
pub enum Stop {
    Cancelled,
    /// The watch ended cleanly (server timeout).
    Closed,
    /// The position expired.
    Gone,
    /// The server's history went back behind the position (an etcd restore): objects may
    /// be back at versions the stream already passed, so the relist re-announces every one.
    Rewound,
    /// The server has not reached the position (504 "Too large resource version"): its watch
    /// cache lags the one that served the position (an HA API server behind a load balancer),
    /// or its history went back. After a backoff the stream resyncs as a delta from its
    /// position, and the list tells the two apart: older than the position, it was a rewind
    /// and every object is re-announced; otherwise only what changed is.
    Behind,
    /// The server refused a `sendInitialEvents` watch.
    Refused,
    /// A custom resource is not served (any more).
    NotServed,
    /// A resync was requested (`watchrelay resync`).
    Requested,
    /// The watch delivered nothing for `watchIdleTimeoutSeconds` (a half-open connection).
    Stalled,
    Api(ApiError),
    /// Kafka gave up on a record; `checkpoint` is where the stream replays from.
    Delivery {
        failure: Failure,
        checkpoint: Option<String>,
    },
}

impl From<OutboxError> for Stop {
    /// What a failed hand-over means for the machine: the outbox rewound to its checkpoint, so
    /// the transition knows where the replay starts.
    fn from(e: OutboxError) -> Self {
        match e {
            OutboxError::Cancelled => Stop::Cancelled,
            OutboxError::Failed {
                failure,
                checkpoint,
            } => Stop::Delivery {
                failure,
                checkpoint,
            },
        }
    }
}

/// What a step reports.
#[derive(Debug)]
pub enum Outcome<C> {
    /// AwaitResource: the resource is served; `checkpoint` is the stream's saved position.
    Served { checkpoint: Option<String> },
    /// Sync: the whole state has been announced as of `rv`; `open` goes on watching from there.
    Synced { rv: String, open: Option<C> },
    /// The step stopped; `at` is the last position read, when it moved.
    Stopped { why: Stop, at: Option<String> },
    /// Backoff: the wait is over.
    Waited,
}

/// The next state, and what to count about the change.
#[derive(Debug, PartialEq)]
pub struct Transition<C> {
    pub next: State<C>,
    /// The `reason` label of `watch_restarts_total`, when a watch restarts.
    pub restart: Option<&'static str>,
    /// The next resync must re-announce every object, not only those changed since the
    /// position: the server's history went back, or a filtered stream's watch cannot replay
    /// what it announced of a scope change.
    pub full: bool,
}

/// What the machine must know of the stream it drives.
#[derive(Clone, Copy, Debug, Default)]
pub struct Profile {
    /// A cluster-wide watch filtered to some namespaces whose scope changed since everything it
    /// announced was last acknowledged: what it announced of namespaces entering or leaving
    /// (their lists, their inferred DELETEDs) is not on its watch, so replaying the watch after
    /// a failed delivery would not announce it again. It resyncs instead. Once the change is
    /// acknowledged its checkpoints are past it, and a failed delivery replays the watch from
    /// there, as any stream's does.
    pub unsettled: bool,
}

impl<C> State<C> {
    /// How a live state gets the whole state; `None` for a backoff or the end.
    fn via(&self) -> Option<Via> {
        match self {
            State::AwaitResource { via } | State::Sync { via, .. } => Some(*via),
            State::Watch { at, .. } => Some(at.via),
            State::Backoff { .. } | State::Done => None,
        }
    }
}

/// Why a sync runs, given whether the stream has members: without a position but with known
/// objects (a changed query, a failure before the first position), a sync reconciles like a
/// resync, inferring a DELETED for every known object the new state lacks.
pub fn sync_reason(reason: Reason, has_members: bool) -> Reason {
    match reason {
        Reason::Start if has_members => Reason::Resync,
        reason => reason,
    }
}

/// What an API error means for a stream whose resource is `builtin` (or a custom one).
pub fn api_stop(e: ApiError, builtin: bool) -> Stop {
    match e {
        ApiError::Gone(_) => Stop::Gone,
        // The position is ahead of the server: a lagging watch cache, or an etcd restore (a
        // copied checkpoint). Only a list can tell (see [`Stop::Behind`]).
        ApiError::Status {
            code: 504,
            ref message,
            ..
        } if message.contains("Too large resource version") => Stop::Behind,
        ApiError::Status { code: 404, .. } if !builtin => Stop::NotServed,
        e => Stop::Api(e),
    }
}

/// What a list page's failure means while paging through a snapshot.
#[derive(Debug)]
pub enum PageFailure {
    /// The continue token expired (the snapshot it pinned outlived its compaction window):
    /// fetch every page again, back to back, before announcing any.
    Refetch,
    Stop(Stop),
}

/// What the failure `e` of a list page means; `continuing` when the page was asked with a
/// continue token.
pub fn page_failed(e: ApiError, continuing: bool, builtin: bool) -> PageFailure {
    match e {
        ApiError::Gone(_) if continuing => PageFailure::Refetch,
        e => PageFailure::Stop(api_stop(e, builtin)),
    }
}

/// The first state of a stream.
pub fn start<C>(builtin: bool, checkpoint: Option<String>, via: Via) -> State<C> {
    if !builtin {
        return State::AwaitResource { via };
    }
    resume(checkpoint, via)
}

fn resume<C>(checkpoint: Option<String>, via: Via) -> State<C> {
    match checkpoint {
        Some(rv) => State::Watch {
            at: Cursor { rv, via },
            open: None,
        },
        None => State::Sync {
            reason: Reason::Start,
            via,
        },
    }
}

/// The one transition function: where a stream in `state` goes once its step reported `outcome`.
pub fn next<C>(
    state: State<C>,
    outcome: Outcome<C>,
    backoff: &mut Backoff,
    profile: Profile,
) -> Transition<C> {
    let go = |next| Transition {
        next,
        restart: None,
        full: false,
    };
    let Some(via) = state.via() else {
        // A backoff goes on to its state once waited; the end stays the end.
        return match (state, outcome) {
            (State::Done, _)
            | (
                _,
                Outcome::Stopped {
                    why: Stop::Cancelled,
                    ..
                },
            ) => go(State::Done),
            (State::Backoff { then, .. }, _) => go(*then),
            // A live state has a way to sync: not here.
            (state, _) => go(state),
        };
    };
    // Where to go back to after a failure: the state itself, or the position read so far.
    let retry = |state: State<C>, at: Option<String>| match (state, at) {
        (State::Watch { at: cursor, .. }, at) => State::Watch {
            at: Cursor {
                rv: at.unwrap_or(cursor.rv),
                via: cursor.via,
            },
            open: None,
        },
        (state, _) => state,
    };
    match (state, outcome) {
        (
            _,
            Outcome::Stopped {
                why: Stop::Cancelled,
                ..
            },
        ) => go(State::Done),
        (State::AwaitResource { via }, Outcome::Served { checkpoint }) => {
            backoff.reset();
            go(resume(checkpoint, via))
        }
        (State::Sync { .. }, Outcome::Synced { rv, open }) => {
            backoff.reset();
            go(State::Watch {
                at: Cursor { rv, via },
                open,
            })
        }
        (
            State::Sync { reason, .. },
            Outcome::Stopped {
                why: Stop::Refused, ..
            },
        ) => go(State::Sync {
            reason,
            via: Via::Pages,
        }),
        (
            _,
            Outcome::Stopped {
                why: Stop::NotServed,
                ..
            },
        ) => Transition {
            next: State::Backoff {
                then: Box::new(State::AwaitResource { via }),
                delay: backoff.next(),
            },
            restart: None,
            full: false,
        },
        (
            state,
            Outcome::Stopped {
                why: Stop::Stalled,
                at,
            },
        ) => Transition {
            next: retry(state, at),
            restart: Some("stalled"),
            full: false,
        },
        (
            state,
            Outcome::Stopped {
                why: Stop::Closed,
                at,
            },
        ) => {
            // A watch that read past where it started reopens at once (a server's timeout);
            // one closed before it read anything, or a sync cut before its state ended, waits
            // for the backoff first: a server that keeps closing is not hammered in a loop. A
            // sync starts over, reconciling what it announced.
            let progressed = match &state {
                State::Watch { at: cursor, .. } => at.as_ref().is_some_and(|a| *a != cursor.rv),
                _ => false,
            };
            let restart = matches!(state, State::Sync { .. }).then_some("sync_interrupted");
            let next = retry(state, at);
            if progressed {
                backoff.reset();
                Transition {
                    next,
                    restart,
                    full: false,
                }
            } else {
                Transition {
                    next: State::Backoff {
                        then: Box::new(next),
                        delay: backoff.next(),
                    },
                    restart,
                    full: false,
                }
            }
        }
        (
            _,
            Outcome::Stopped {
                why: Stop::Requested,
                ..
            },
        ) => Transition {
            next: State::Sync {
                reason: Reason::Resync,
                via,
            },
            restart: Some("requested"),
            full: false,
        },
        (
            _,
            Outcome::Stopped {
                why: why @ (Stop::Gone | Stop::Rewound),
                ..
            },
        ) => Transition {
            next: State::Sync {
                reason: Reason::Resync,
                via,
            },
            restart: Some(if matches!(why, Stop::Gone) {
                "expired"
            } else {
                "rewound"
            }),
            full: matches!(why, Stop::Rewound),
        },
        // Not a rewind until a list says so: a delta resync from the position, after a backoff
        // (a lagging cache may catch up meanwhile; a sync it refuses again is not hammered).
        (
            state,
            Outcome::Stopped {
                why: Stop::Behind, ..
            },
        ) => Transition {
            next: State::Backoff {
                then: Box::new(State::Sync {
                    reason: match state {
                        State::Sync { reason, .. } => reason,
                        _ => Reason::Resync,
                    },
                    via,
                }),
                delay: backoff.next(),
            },
            restart: Some("behind"),
            full: false,
        },
        (
            _,
            Outcome::Stopped {
                why: Stop::Delivery { checkpoint, .. },
                ..
            },
        ) => Transition {
            next: State::Backoff {
                // A filtered stream's watch cannot replay what it announced (see [`Profile`]).
                then: Box::new(match checkpoint {
                    Some(_) if profile.unsettled => State::Sync {
                        reason: Reason::Resync,
                        via,
                    },
                    checkpoint => resume(checkpoint, via),
                }),
                delay: backoff.next(),
            },
            restart: Some("delivery_failed"),
            full: profile.unsettled,
        },
        (
            state,
            Outcome::Stopped {
                why: Stop::Api(e),
                at,
            },
        ) => {
            let restart = matches!(e, ApiError::Body(_)).then_some("connection");
            Transition {
                next: State::Backoff {
                    then: Box::new(retry(state, at)),
                    delay: e.retry_after().unwrap_or_else(|| backoff.next()),
                },
                restart,
                full: false,
            }
        }
        // A step reported something its state cannot produce: start that state over.
        (state, _) => go(retry(state, None)),
    }
}

/// Exponential backoff with jitter, so streams that failed together retry apart.
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
    seed: u64,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration, seed: u64) -> Self {
        Self {
            initial,
            max,
            current: initial,
            seed: seed | 1,
        }
    }

    /// A pseudo-random number, for jitter.
    pub fn random(&mut self) -> u64 {
        // xorshift: jitter needs spread, not quality.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        self.seed
    }

    pub fn next(&mut self) -> Duration {
        let r = self.random();
        let base = self.current;
        self.current = (self.current * 2).min(self.max);
        base / 2 + base.mul_f64((r % 1000) as f64 / 2000.0)
    }

    pub fn reset(&mut self) {
        self.current = self.initial;
    }
}

#[cfg(test)]
mod tests;
