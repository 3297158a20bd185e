//! The hub's decisions, pure: what its loop does next, given what happened. The loop
//! ([`super::Reader`]) performs the effects (opens and closes the connections, hands the seats
//! their lines) and reports their results back as inputs; nothing here does I/O or reads the
//! clock: every input comes with the time it happened at.
//!
//! ```text
//!             parts join ─────────────────────┐ quiet for JOIN_QUIET (at most JOIN_MAX), and
//!                                             │ the shards claimed here started (at most
//!                                             ▼ START_MAX)
//!   waiting seats ──► BeginCatchUp ──CatchBegun──► catch-up runs ──CaughtUp──► seats live
//!                        │                           │ (its watch goes on as the main one
//!                        └──CatchFailed──► backoff   │  when no main position is there)
//!                                                    └──CatchFailed: its seats expire
//!   resuming seats, or a main position without a watch
//!        └──► Open{from: the lowest position to serve} ──Opened──► main watch runs
//!                  ├──OpenFailed{gone}: the seats that needed it expire; reopen for the rest
//!                  └──OpenFailed: backoff (1 s doubling to 30 s, or Retry-After)
//!   main watch: lines ──► live seats (above their floors)
//!               ended, cut, silent for `idle` ──► reopened from its position
//!               error event before its first line ──► as OpenFailed{gone}: the open undone
//!               error event ──► gap: the seats it fed expire
//!   a part leaves ──► the main watch, asking the server for its shard, narrows a moment later
//!   namespaces the reads were not asked for ──► their shards' seats expire (they relist)
//!   heartbeat ──► a bookmark at the main position to the live seats, only while a main watch runs
//!   a catch-up due while the main position is not an integer ──► the main watch closes and its
//!       seats relist with the waiting ones: that catch-up goes on as the main watch
//!   a part with no room for a line ──► stalled: its lines queue; room again ──► as many go
//!       out as fit (Drain), the head of its queue first
//!       its queue too long ──► LetGo: its subscription closes and its part resumes later
//!       every live part stalled ──► the main watch is not read until one has room
//!       a part being listed stalled ──► the catch-up is not read; after slow_list ──► LetGo
//! ```
//!
//! The board ([`super::board`]) decides who gets which line, the backlogs
//! ([`super::backlog`]) when a stalled part's lines go out; this machine decides when the reads
//! open, close, retry and pause, and when a part is let go.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

use super::backlog::Backlogs;
use super::board::{Board, Line, Out, To};
use super::cover::{self, Cover, Points};
use crate::event::comparable;

/// How long the hub waits, and for what.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// After the last part joined, before a catch-up (a list of the collection).
    pub join_quiet: Duration,
    /// After the last part joined, before a reopen for resuming parts: a watch re-reading a
    /// window costs less than a list, and a new owner's parts wait for it.
    pub resume_quiet: Duration,
    /// After the first part waiting joined, at most.
    pub join_max: Duration,
    /// After the first part waiting joined, at most, while shards claimed by the replica are
    /// still starting their streams (restoring, building their producers), and until
    /// `join_quiet` after the last of them started: their parts will join, and a catch-up begun
    /// without them is read again for them.
    pub start_max: Duration,
    /// The first wait after a failed request; it doubles with each failure in a row.
    pub retry: Duration,
    pub retry_max: Duration,
    /// A main watch that delivered nothing for this long is reopened.
    pub idle: Duration,
    /// How long a part being listed may hold the catch-up up with no room before it is let go.
    pub slow_list: Duration,
}

/// What a read asked the server for: the shards and the ranges covering their namespaces;
/// `None` for the whole collection.
pub type Asked = Option<(BTreeSet<u32>, Cover)>;

/// What happened, for the hub.
#[derive(Debug)]
pub enum Input {
    /// A part joined (resuming after `from`, or to be listed).
    Join {
        id: u64,
        shard: u32,
        from: Option<String>,
    },
    /// A part went away.
    Leave(u64),
    /// The clock reached [`Hub::deadline`].
    Due,
    /// The main watch opened from `at`.
    Opened { at: String, asked: Asked },
    /// Opening the main watch from `at` failed: the server no longer holds it (`gone`), or it
    /// is tried again, after `retry_after` when the server said so.
    OpenFailed {
        at: String,
        gone: bool,
        retry_after: Option<Duration>,
    },
    /// A catch-up began.
    CatchBegun { asked: Asked },
    /// A catch-up could not begin (`begun` false) or failed midway.
    CatchFailed {
        begun: bool,
        retry_after: Option<Duration>,
    },
    /// A line of the main watch, with its resourceVersion when it has one.
    Main(Line, Option<String>),
    /// The main watch sent an error event: it cannot go on from its position.
    MainError,
    /// The main watch ended or was cut.
    MainEnded,
    /// An item of the catch-up's state.
    Listed(Line),
    /// The catch-up's state ended at `rv`; `watch` when its connection can go on as a watch.
    CaughtUp { rv: String, watch: bool },
    /// The namespaces the replica knows now.
    Namespaces(std::sync::Arc<Points>),
    /// The heartbeat; `gone` the seats whose parts went away unnoticed.
    Beat { gone: Vec<u64> },
    /// Shards claimed by the replica are starting their streams (`true`), or none is any more.
    Starting(bool),
    /// A seat's subscription had no room for this line (or its part's earlier lines still
    /// wait): the seat is stalled.
    NoRoom(Out),
    /// A stalled seat's subscription has room again, for `free` lines.
    Room { id: u64, free: usize },
    /// A line of a stalled seat's queue, handed out for its room, found none after all: it
    /// goes back to the head of the queue.
    NoRoomAhead(Out),
}

/// What the loop does.
#[derive(Debug, PartialEq, Eq)]
pub enum Effect {
    /// Hand a seat a line, or expire it.
    Seat(Out),
    /// A bookmark to each of these live seats, at its position.
    Bookmark(Vec<(u64, String)>),
    /// Close the main watch.
    CloseMain,
    /// The main watch delivered nothing, not even a bookmark, for the idle timeout (said in
    /// the log; a [`Effect::CloseMain`] follows).
    Silent,
    /// Open the main watch from `from`, for `shards` (every seat's).
    Open { from: String, shards: BTreeSet<u32> },
    /// Begin a catch-up of `shards`.
    BeginCatchUp { shards: BTreeSet<u32> },
    /// The catch-up's connection goes on as the main watch.
    CatchBecomesMain,
    /// Close the catch-up.
    CloseCatch,
    /// The reads were not asked for namespaces of these shards (created since): their seats
    /// relist (said in the log).
    Missed(BTreeSet<u32>),
    /// Close the seat's subscription: its part, stalled too long, resumes from its position.
    LetGo(u64),
    /// Hand a stalled seat a line from the head of its queue, for which it has room (see
    /// [`Input::Room`]): ahead of what still waits there.
    Drain(Out),
}

/// The hub's state beside its board.
#[derive(Debug)]
pub struct Hub {
    board: Board,
    backlogs: Backlogs,
    timing: Timing,
    /// A main watch runs, and what it asked for.
    main: Option<Asked>,
    /// A catch-up runs, and what it asked for.
    catch: Option<Asked>,
    first_waiting: Option<Instant>,
    last_join: Instant,
    retry_at: Instant,
    /// Failed requests in a row.
    failures: u32,
    /// When the main watch, asking for shards no seat reads any more, narrows.
    narrow_at: Option<Instant>,
    last_line: Instant,
    /// Shards claimed by the replica are starting their streams.
    starting: bool,
    /// When the last of them started.
    started: Option<Instant>,
}

impl Hub {
    pub fn new(timing: Timing, now: Instant) -> Self {
        Self {
            board: Board::default(),
            backlogs: Backlogs::default(),
            timing,
            main: None,
            catch: None,
            first_waiting: None,
            last_join: now,
            retry_at: now,
            failures: 0,
            narrow_at: None,
            last_line: now,
            starting: false,
            started: None,
        }
    }

    /// The board, to read.
    pub fn board(&self) -> &Board {
        &self.board
    }

    /// Whether seat `id` is stalled: a line for it is to be reported as [`Input::NoRoom`], to
    /// go behind the others it waits for.
    pub fn stalled(&self, id: u64) -> bool {
        self.backlogs.stalled(id)
    }

    /// The stalled seats, whose room the loop waits for.
    pub fn stalled_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.backlogs.ids()
    }

    /// Whether the main watch is not to be read: every live seat is stalled, so reading on
    /// would only queue (see [`super::backlog`]). Seats being listed do not count: they hold
    /// the main watch's lines in the board, bounded, or resume from their list's end.
    pub fn main_paused(&self) -> bool {
        if self.backlogs.is_empty() {
            return false;
        }
        let mut live = self.board.live_ids().peekable();
        live.peek().is_some() && live.all(|id| self.backlogs.stalled(id))
    }

    /// Whether the catch-up is not to be read: a seat it lists is stalled (a list is not
    /// queued).
    pub fn catch_paused(&self) -> bool {
        !self.backlogs.is_empty() && self.board.listing_ids().any(|id| self.backlogs.stalled(id))
    }

    /// When the first seat being listed that is stalled has held the catch-up up too long.
    fn slow_list_due(&self) -> Option<Instant> {
        self.board
            .listing_ids()
            .filter_map(|id| self.backlogs.since(id))
            .min()
            .map(|since| since + self.timing.slow_list)
    }

    /// When the hub must be told [`Input::Due`]; `None` while it waits for something else.
    pub fn deadline(&self) -> Option<Instant> {
        [
            self.narrow_at,
            self.catch_up_due(),
            self.reopen_due(),
            self.slow_list_due(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// When joins have been `quiet` long enough to act on them.
    fn quiet_until(&self, quiet: Duration) -> Instant {
        let quiet = self.last_join + quiet;
        self.first_waiting
            .map_or(quiet, |f| quiet.min(f + self.timing.join_max))
    }

    /// When a catch-up is to begin, if one is: seats wait and none runs, once joins are quiet
    /// and no shard claimed here is still starting (or `start_max` passed), and the backoff
    /// allows.
    fn catch_up_due(&self) -> Option<Instant> {
        (self.board.waiting() && self.catch.is_none()).then(|| {
            let t = &self.timing;
            let quiet = match (self.first_waiting, self.started) {
                (Some(first), _) if self.starting => first + t.start_max,
                // The last shard claimed started while seats waited: its parts join a moment
                // later, so the quiet counts from its start too.
                (Some(first), Some(started)) if started >= first => {
                    let cap = (first + t.join_max)
                        .max(started + t.join_quiet)
                        .min(first + t.start_max);
                    (self.last_join.max(started) + t.join_quiet).min(cap)
                }
                _ => self.quiet_until(t.join_quiet),
            };
            quiet.max(self.retry_at)
        })
    }

    /// When the main watch is to be (re)opened, if it is: for resuming seats once joins are
    /// quiet, for a main position without a watch once the backoff allows.
    fn reopen_due(&self) -> Option<Instant> {
        if self.board.resuming() {
            Some(
                self.quiet_until(self.timing.resume_quiet)
                    .max(self.retry_at),
            )
        } else if self.main.is_none() && self.board.position().is_some() {
            Some(self.retry_at)
        } else {
            None
        }
    }

    /// Whether the main watch asks the server for a shard no seat reads any more.
    fn asks_too_much(&self) -> bool {
        matches!(&self.main, Some(Some((m, _))) if m.iter().any(|k| !self.board.has_shard(*k)))
    }

    fn backoff(&mut self, now: Instant, retry_after: Option<Duration>) {
        self.failures = self.failures.saturating_add(1);
        let doubled = self
            .timing
            .retry
            .saturating_mul(1 << (self.failures - 1).min(5))
            .min(self.timing.retry_max);
        self.retry_at = now + retry_after.unwrap_or(doubled);
    }

    fn close_main(&mut self, effects: &mut Vec<Effect>) {
        if self.main.take().is_some() {
            effects.push(Effect::CloseMain);
        }
    }

    /// What to do about `input`, which happened at `now`.
    pub fn step(&mut self, input: Input, now: Instant) -> Vec<Effect> {
        let paused = self.main_paused();
        let fx = self.decide(input, now);
        if paused && !self.main_paused() {
            // Not read, not silent: the idle timeout counts from when reading goes on.
            self.last_line = self.last_line.max(now);
        }
        fx
    }

    fn decide(&mut self, input: Input, now: Instant) -> Vec<Effect> {
        let mut fx = Vec::new();
        let out = match input {
            Input::Join { id, shard, from } => {
                self.last_join = now;
                self.first_waiting.get_or_insert(now);
                self.board.join(id, shard, from.as_deref())
            }
            Input::Leave(id) => {
                self.leave(id, now);
                Vec::new()
            }
            Input::NoRoom(out) => {
                for id in self.backlogs.no_room(out, now) {
                    self.let_go(id, now, &mut fx);
                }
                Vec::new()
            }
            // The head of its queue: ahead of whatever still waits there.
            Input::Room { id, free } => {
                let head = self.backlogs.room(id, free);
                fx.extend(head.into_iter().map(Effect::Drain));
                Vec::new()
            }
            Input::NoRoomAhead(out) => {
                self.backlogs.requeue(out, now);
                Vec::new()
            }
            Input::Due => {
                self.due(now, &mut fx);
                Vec::new()
            }
            Input::Opened { at, asked } => {
                self.main = Some(asked);
                self.last_line = now;
                self.failures = 0;
                self.board.opened(&at)
            }
            Input::OpenFailed {
                at,
                gone: true,
                retry_after: _,
            } => self.board.reopen_gone(&at),
            Input::OpenFailed { retry_after, .. } => {
                self.backoff(now, retry_after);
                Vec::new()
            }
            Input::CatchBegun { asked } => {
                // A main watch that the server filters for other shards reopens with these
                // too, from its position: below the list's.
                let wider = match (&self.main, &asked) {
                    (Some(Some((m, _))), Some((c, _))) => !c.is_subset(m),
                    (Some(Some(_)), None) => true,
                    _ => false,
                };
                if wider {
                    self.close_main(&mut fx);
                }
                self.catch = Some(asked);
                self.board.begin_catch_up();
                Vec::new()
            }
            Input::CatchFailed { begun, retry_after } => {
                self.backoff(now, retry_after);
                if begun {
                    self.catch = None;
                    fx.push(Effect::CloseCatch);
                    self.board.catch_up_failed()
                } else {
                    Vec::new()
                }
            }
            Input::Main(line, rv) => {
                self.last_line = now;
                self.board.live(&line, rv.as_deref())
            }
            Input::MainError => {
                self.close_main(&mut fx);
                // Before its first line, the error is the server's answer to where the watch
                // was opened from: only the seats that needed that position relist.
                match self.board.open_refused() {
                    Some(at) => self.board.reopen_gone(&at),
                    None => self.board.gap(),
                }
            }
            Input::MainEnded => {
                self.close_main(&mut fx);
                Vec::new()
            }
            // A bookmark of the list is not a position of the parts'.
            Input::Listed(line) if line.to == To::All && line.rv.is_some() => Vec::new(),
            Input::Listed(line) => self.board.listed(&line),
            Input::CaughtUp { rv, watch } => {
                // Only without a main position: a main watch down for a moment is reopened
                // from its own, or its live seats would miss what happened between it and
                // the list.
                let becomes_main = self.board.position().is_none();
                let asked = self.catch.take().flatten();
                if becomes_main && watch {
                    self.main = Some(asked);
                    self.last_line = now;
                    fx.push(Effect::CatchBecomesMain);
                } else {
                    fx.push(Effect::CloseCatch);
                }
                self.board.caught_up(&rv, becomes_main)
            }
            Input::Namespaces(points) => {
                let missed = self.missed(&points);
                let out = self.board.missed(&missed);
                if !missed.is_empty() {
                    fx.push(Effect::Missed(missed));
                }
                out
            }
            Input::Starting(starting) => {
                if std::mem::replace(&mut self.starting, starting) && !starting {
                    self.started = Some(now);
                }
                Vec::new()
            }
            Input::Beat { gone } => {
                for id in gone {
                    self.backlogs.forget(id);
                    self.board.leave(id);
                }
                self.beat(now, &mut fx)
            }
        };
        let (out, let_go) = self.backlogs.route(out);
        fx.extend(out.into_iter().map(Effect::Seat));
        for id in let_go {
            self.let_go(id, now, &mut fx);
        }
        fx
    }

    /// Seat `id` went away.
    fn leave(&mut self, id: u64, now: Instant) {
        self.backlogs.forget(id);
        self.board.leave(id);
        if self.asks_too_much() {
            self.narrow_at.get_or_insert(now + self.timing.join_quiet);
        }
    }

    /// Seat `id` queued too much: it goes, and its part resumes from its position.
    fn let_go(&mut self, id: u64, now: Instant, fx: &mut Vec<Effect>) {
        self.leave(id, now);
        fx.push(Effect::LetGo(id));
    }

    /// The clock reached the deadline: narrow, begin a catch-up, (re)open the main watch,
    /// whichever is due.
    fn due(&mut self, now: Instant, fx: &mut Vec<Effect>) {
        let slow: Vec<u64> = self
            .board
            .listing_ids()
            .filter(|id| {
                self.backlogs
                    .since(*id)
                    .is_some_and(|t| t + self.timing.slow_list <= now)
            })
            .collect();
        for id in slow {
            self.let_go(id, now, fx);
        }
        if self.narrow_at.is_some_and(|t| t <= now) {
            self.narrow_at = None;
            if self.asks_too_much() && !self.board.is_empty() {
                self.close_main(fx);
            }
        }
        if self.catch_up_due().is_some_and(|t| t <= now) {
            if self
                .board
                .position()
                .is_some_and(|p| comparable(p).is_none())
            {
                // The main watch's lines cannot be set against the list's position (a server
                // whose resourceVersions are not integers): the catch-up becomes the main watch
                // instead, and the seats it fed relist with it, rejoining meanwhile. A seat
                // listed while it ran would be expired at the list's end, again each time.
                self.close_main(fx);
                let (out, _) = self.backlogs.route(self.board.gap());
                fx.extend(out.into_iter().map(Effect::Seat));
                // Waits for them to rejoin, quiet again, whatever made this catch-up due.
                self.last_join = now;
                self.first_waiting = Some(now);
            } else {
                self.first_waiting = None;
                fx.push(Effect::BeginCatchUp {
                    shards: self.board.waiting_shards(),
                });
            }
        }
        if self.reopen_due().is_some_and(|t| t <= now) {
            // A main watch still running is closed: the new one starts at or below it.
            self.close_main(fx);
            // Seats waiting for a list keep their first join: resumes in a row, each reopening
            // sooner than a list is begun, must not put their catch-up off past `join_max`.
            if self.board.resuming() && !self.board.waiting() {
                self.first_waiting = None;
            }
            if let Some(from) = self.board.reopen_from() {
                fx.push(Effect::Open {
                    from,
                    shards: self.board.shards(),
                });
            }
        }
    }

    fn beat(&mut self, now: Instant, fx: &mut Vec<Effect>) -> Vec<Out> {
        if self.board.is_empty() {
            // Nobody reads: nothing is held open.
            self.close_main(fx);
            if self.catch.take().is_some() {
                fx.push(Effect::CloseCatch);
            }
            return self.board.gap();
        }
        if self.main_paused() {
            // Not read, not silent: the idle timeout counts from when reading goes on.
            self.last_line = now;
        }
        if self.main.is_some() && now.duration_since(self.last_line) >= self.timing.idle {
            fx.push(Effect::Silent);
            self.close_main(fx);
            return Vec::new();
        }
        // No bookmark while no main watch runs: a part that hears nothing for its idle
        // timeout stalls, and says so, rather than look healthy.
        if self.main.is_some() {
            // A stalled seat's bookmark would pass the lines it waits for.
            let mut beats = self.board.heartbeat();
            beats.retain(|(id, _)| !self.backlogs.stalled(*id));
            if !beats.is_empty() {
                fx.push(Effect::Bookmark(beats));
            }
        }
        Vec::new()
    }

    /// The shards whose namespaces (known now as `points`) the running reads were not asked
    /// for; they are no longer counted as asked for.
    fn missed(&mut self, points: &Points) -> BTreeSet<u32> {
        let mut missed = BTreeSet::new();
        for (shards, c) in [&mut self.main, &mut self.catch]
            .into_iter()
            .flatten()
            .flatten()
        {
            let lost = cover::uncovered(points, shards, c);
            shards.retain(|k| !lost.contains(k));
            missed.extend(lost);
        }
        missed
    }
}

#[cfg(test)]
mod tests;
