//! Who gets which line: the pure state of one collection's subscribers.
//!
//! # A seat's phases
//! ```text
//!  join(None) ──► Waiting ──begin_catch_up──► Listing ──caught_up(L)──► Live
//!                    ▲                          │  held lines > L after the
//!                    │                          │  end of its state, then live lines
//!                    │       catch_up_failed: expired (its part restarts its sync)
//!                    │                          │ too much held: its held lines dropped
//!                    │                          ▼
//!                    │                  Listing (overflowed) ──caught_up(L)──► Resuming{L}
//!  join(Some(P)) ──► Resuming{P} ──opened(at ≤ P)──► Live, lines > P only
//!                        └──── reopen_gone(at ≥ P): expired (P no longer held) ────►
//!  Listing or Live ──gap / L below its start / missed──► expired (gone)
//! ```
//! - **Waiting**: joined, its state not listed yet; it receives nothing.
//! - **Resuming**: joined at a position `P` its part already published up to (a checkpoint,
//!   the position its last subscription reached): it needs no list, only every line after
//!   `P`. The main watch is reopened from the lowest position it must serve (its own, or the
//!   lowest a resuming seat asks for); once opened, every resuming seat goes live.
//! - **Listing**: a catch-up (a list of the whole collection) deals it the items of its shard.
//!   Live lines of its shard that arrive meanwhile on the main watch are held (up to
//!   [`HELD_BYTES`]), with the main watch's position when the catch-up began (`since`).
//!   A seat that would hold more (a busy shard during a long list of the whole collection)
//!   drops what it held and holds nothing more: its list still ends its initial state, and it
//!   then resumes from the list's position like a new owner's part (the main watch is reopened
//!   from there), so it goes live without a list again and memory stays bounded.
//! - **Live**: it receives its shard's live lines and every bookmark.
//!
//! Every seat has a floor (`seen`): the highest resourceVersion it was given or already holds
//! (its resume position, its list's end, its last line). A line at or below its floor is not
//! given to it again, so a main watch reopened from below (to serve a resuming seat) and a main
//! watch behind a list's end give nothing twice and nothing older than what a part holds.
//!
//! At the end of a catch-up at resourceVersion `L`, each listing seat receives the end of its
//! initial state (a bookmark at `L`), then the lines it held that are newer than `L`: the list
//! holds every change up to `L`, the held lines every change after `since`, so when `since` is
//! not above `L` nothing is missed and nothing is given twice. A seat whose `since` is above
//! `L` (a list older than the watch), or whose lines the
//! main watch can no longer continue (a gap: 410, a failed reopen), or whose shard's lines were
//! missed (the server, filtering by shard, was not asked for a namespace of it), is expired: it
//! gets a 410 and leaves, and its stream relists as after any 410. So is a seat whose catch-up
//! failed midway: its part announced part of a list already, and only a sync started over
//! reconciles what that part announced with what exists.
//!
//! Resource versions compare as integers (etcd's revisions); a position that does not parse
//! cannot be resumed from, and its seat is expired (its part relists).

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

/// What a seat may hold while it is listed, in bytes of lines: past it, the seat drops what it
/// held and resumes from its list's position once the list ends.
pub const HELD_BYTES: usize = 8 << 20;
/// What all the seats of a hub may hold together: past it, the seat holding the most drops
/// what it held (as past [`HELD_BYTES`]), so that many shards claimed at once cannot hold a
/// replica's memory.
pub const HUB_HELD_BYTES: usize = 64 << 20;

/// Where a line goes: one shard's seats, or every seat (bookmarks, undecodable lines).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum To {
    Shard(u32),
    All,
}

/// A line of the collection, with where it goes and its resourceVersion when it compares.
#[derive(Clone, Debug)]
pub struct Line {
    pub to: To,
    pub rv: Option<u64>,
    pub bytes: Bytes,
}

/// What the loop does for the board: hand a seat a line, or expire it (a 410, then it is gone).
#[derive(Debug, PartialEq, Eq)]
pub enum Out {
    Send(u64, Bytes),
    /// The seat's end of initial state, a bookmark at this resourceVersion.
    End(u64, String),
    Expire(u64),
}

#[derive(Debug)]
enum Phase {
    Waiting,
    /// Resumes after `from` (its string form kept to reopen the main watch there).
    Resuming {
        from: u64,
        at: String,
    },
    Listing {
        /// The main watch's position when the catch-up began; `None` when no main watch ran
        /// (the catch-up then becomes it).
        since: Option<u64>,
        held: Vec<(Option<u64>, Bytes)>,
        held_bytes: usize,
        /// It held too much and dropped it: it holds nothing more, and resumes from the
        /// list's position once the list ends.
        overflowed: bool,
    },
    Live,
}

#[derive(Debug)]
struct Seat {
    shard: u32,
    phase: Phase,
    /// The highest resourceVersion given to it or already held by its part: no line at or
    /// below it is given again.
    seen: Option<u64>,
}

impl Seat {
    fn takes(&self, to: To) -> bool {
        match to {
            To::All => true,
            To::Shard(k) => k == self.shard,
        }
    }

    /// Whether a line at `rv` is new to the seat; if so, it is now seen.
    fn fresh(&mut self, rv: Option<u64>) -> bool {
        match (rv, self.seen) {
            (Some(rv), Some(seen)) if rv <= seen => false,
            (Some(rv), _) => {
                self.seen = Some(rv);
                true
            }
            (None, _) => true,
        }
    }

    fn raise(&mut self, to: Option<u64>) {
        self.seen = self.seen.max(to);
    }
}

/// The seats of one collection and the main watch's position.
#[derive(Debug, Default)]
pub struct Board {
    seats: BTreeMap<u64, Seat>,
    /// Where the main watch is: every line up to it was dealt. `None` while none runs.
    position: Option<String>,
    /// The last open of the main watch, until its first line: what it changed, to be undone
    /// if the server answers it with an error (see [`Board::open_refused`]).
    opening: Option<Opening>,
}

/// What [`Board::opened`] changed.
#[derive(Debug)]
struct Opening {
    /// Where the main watch was opened from.
    at: String,
    /// The main position before.
    before: Option<String>,
    /// The resuming seats it put live, with their positions.
    resumed: Vec<(u64, u64, String)>,
    /// The listed seats it made hold lines from `at` (listed without a main watch before).
    holding: Vec<u64>,
}

impl Board {
    /// A subscriber of `shard` joins: with `from`, it resumes after that position (see
    /// [`Board::reopen_from`]); without, it waits for the next catch-up. A position that does
    /// not compare cannot be resumed from: the seat is expired at once.
    pub fn join(&mut self, id: u64, shard: u32, from: Option<&str>) -> Vec<Out> {
        let phase = match from {
            None => Phase::Waiting,
            Some(at) => match crate::event::comparable(at) {
                Some(from) => Phase::Resuming {
                    from,
                    at: at.to_string(),
                },
                None => return vec![Out::Expire(id)],
            },
        };
        self.seats.insert(
            id,
            Seat {
                shard,
                phase,
                seen: None,
            },
        );
        Vec::new()
    }

    /// A subscriber went away.
    pub fn leave(&mut self, id: u64) {
        self.seats.remove(&id);
    }

    /// The seats' ids.
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.seats.keys().copied()
    }

    /// Whether any seat is there at all.
    pub fn is_empty(&self) -> bool {
        self.seats.is_empty()
    }

    /// Whether a seat waits for a catch-up.
    pub fn waiting(&self) -> bool {
        self.seats
            .values()
            .any(|s| matches!(s.phase, Phase::Waiting))
    }

    /// Whether a seat waits for the main watch to be reopened from its position.
    pub fn resuming(&self) -> bool {
        self.seats
            .values()
            .any(|s| matches!(s.phase, Phase::Resuming { .. }))
    }

    /// The live seats.
    pub fn live_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.seats
            .iter()
            .filter(|(_, s)| matches!(s.phase, Phase::Live))
            .map(|(id, _)| *id)
    }

    /// The seats being listed.
    pub fn listing_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.seats
            .iter()
            .filter(|(_, s)| matches!(s.phase, Phase::Listing { .. }))
            .map(|(id, _)| *id)
    }

    /// Whether a seat is being listed.
    #[cfg(test)]
    pub fn listing(&self) -> bool {
        self.seats
            .values()
            .any(|s| matches!(s.phase, Phase::Listing { .. }))
    }

    /// The shards of every seat.
    pub fn shards(&self) -> BTreeSet<u32> {
        self.seats.values().map(|s| s.shard).collect()
    }

    /// The shards of the seats waiting for a catch-up.
    pub fn waiting_shards(&self) -> BTreeSet<u32> {
        self.seats
            .values()
            .filter(|s| matches!(s.phase, Phase::Waiting))
            .map(|s| s.shard)
            .collect()
    }

    /// Whether a seat reads shard `shard`.
    pub fn has_shard(&self, shard: u32) -> bool {
        self.seats.values().any(|s| s.shard == shard)
    }

    /// The lines of `shards` were missed (the reads left out one of their namespaces): their
    /// seats being listed or live are expired; the waiting ones stay, their catch-up to come,
    /// and so do the resuming ones, whose main watch is yet to be opened (for them too).
    pub fn missed(&mut self, shards: &BTreeSet<u32>) -> Vec<Out> {
        self.expire_where(|s| {
            shards.contains(&s.shard) && matches!(s.phase, Phase::Listing { .. } | Phase::Live)
        })
    }

    /// The main watch's position.
    pub fn position(&self) -> Option<&str> {
        self.position.as_deref()
    }

    /// Where the main watch must be opened from: the lowest of its own position and the
    /// positions resuming seats ask for; `None` when neither is there (a catch-up starts it).
    /// A main position that does not compare is kept as it is (resuming seats are then
    /// expired when it opens: see [`Board::opened`]).
    pub fn reopen_from(&self) -> Option<String> {
        let lowest = self
            .seats
            .values()
            .filter_map(|s| match &s.phase {
                Phase::Resuming { from, at } => Some((*from, at)),
                _ => None,
            })
            .min_by_key(|(from, _)| *from);
        match (self.position.as_deref(), lowest) {
            (Some(p), Some((from, at))) => match crate::event::comparable(p) {
                Some(p) if p <= from => self.position.clone(),
                Some(_) => Some(at.clone()),
                None => self.position.clone(),
            },
            (Some(p), None) => Some(p.to_string()),
            (None, lowest) => lowest.map(|(_, at)| at.clone()),
        }
    }

    /// The main watch was opened from `at` (what [`Board::reopen_from`] said): every line after
    /// it will be read. Seats that were fed up to the old position do not get those lines
    /// again; seats listed without a main watch hold lines from `at` on; resuming seats go live
    /// above their own positions. Resuming seats below `at` (a position that does not compare)
    /// are expired.
    pub fn opened(&mut self, at: &str) -> Vec<Out> {
        let to = crate::event::comparable(at);
        let old = self.position.as_deref().and_then(crate::event::comparable);
        let mut out = Vec::new();
        let mut opening = Opening {
            at: at.to_string(),
            before: self.position.clone(),
            resumed: Vec::new(),
            holding: Vec::new(),
        };
        for (id, seat) in &mut self.seats {
            match &mut seat.phase {
                Phase::Live | Phase::Listing { since: Some(_), .. } => seat.raise(old),
                // Held from `at` on (a position that does not compare: expired at the end).
                Phase::Listing { since, .. } => {
                    *since = Some(to.unwrap_or(u64::MAX));
                    opening.holding.push(*id);
                }
                Phase::Resuming { from, at } => {
                    if to.is_some_and(|to| to <= *from) {
                        opening.resumed.push((*id, *from, std::mem::take(at)));
                        seat.seen = Some(*from);
                        seat.phase = Phase::Live;
                    } else {
                        out.push(Out::Expire(*id));
                    }
                }
                Phase::Waiting => {}
            }
        }
        self.forget(&out);
        self.position = Some(at.to_string());
        self.opening = Some(opening);
        out
    }

    /// The main watch just opened ended with an error before its first line: the server does
    /// not hold the position it was opened from (a watch is answered so, an error event, where
    /// a position is gone). That open is undone: the seats it put live resume again, and the
    /// main position is the one before, so that [`Board::reopen_gone`] expires only the seats
    /// that needed that position. Returns where it was opened from; `None` once the main watch
    /// delivered a line, or a catch-up began or ended since the open (then the error is a gap:
    /// see [`Board::gap`]).
    pub fn open_refused(&mut self) -> Option<String> {
        let opening = self.opening.take()?;
        self.position = opening.before;
        for (id, from, at) in opening.resumed {
            if let Some(seat) = self.seats.get_mut(&id) {
                if matches!(seat.phase, Phase::Live) {
                    seat.phase = Phase::Resuming { from, at };
                }
            }
        }
        for id in opening.holding {
            if let Some(Seat {
                phase: Phase::Listing { since, .. },
                ..
            }) = self.seats.get_mut(&id)
            {
                *since = None;
            }
        }
        Some(opening.at)
    }

    /// The server no longer holds `at`, where the main watch was to be opened (a 410): the
    /// resuming seats at or below it relist (expired), and if the main watch's own position is
    /// at or below it too, its seats do (a gap). Another reopen follows for the rest.
    pub fn reopen_gone(&mut self, at: &str) -> Vec<Out> {
        let Some(gone) = crate::event::comparable(at) else {
            return self.gap_with_resuming();
        };
        let mut out =
            self.expire_where(|s| matches!(s.phase, Phase::Resuming { from, .. } if from <= gone));
        let own = self.position.as_deref().map(crate::event::comparable);
        if own.is_some_and(|p| p.is_none_or(|p| p <= gone)) {
            out.extend(self.gap());
        }
        out
    }

    /// A catch-up begins: every waiting seat is listed by it.
    pub fn begin_catch_up(&mut self) {
        // Its seats hold lines from the main position: an open undone later would move that
        // position back under them.
        self.opening = None;
        let since = self
            .position
            .as_deref()
            .map(|p| crate::event::comparable(p).unwrap_or(u64::MAX));
        for seat in self.seats.values_mut() {
            if matches!(seat.phase, Phase::Waiting) {
                seat.phase = Phase::Listing {
                    since,
                    held: Vec::new(),
                    held_bytes: 0,
                    overflowed: false,
                };
            }
        }
    }

    /// An item of the catch-up's list (or its undecodable line, to every listed seat).
    pub fn listed(&self, line: &Line) -> Vec<Out> {
        self.seats
            .iter()
            .filter(|(_, s)| matches!(s.phase, Phase::Listing { .. }) && s.takes(line.to))
            .map(|(id, _)| Out::Send(*id, line.bytes.clone()))
            .collect()
    }

    /// The catch-up ended at resourceVersion `rv`; with `main`, its connection goes on as the
    /// main watch, from `rv`. A seat going live holds everything up to `rv`: main-watch lines
    /// at or below it (a main watch behind the list) are not given to it.
    pub fn caught_up(&mut self, rv: &str, main: bool) -> Vec<Out> {
        let end = crate::event::comparable(rv);
        let mut out = Vec::new();
        for (id, seat) in &mut self.seats {
            let Phase::Listing {
                since,
                held,
                overflowed,
                ..
            } = &mut seat.phase
            else {
                continue;
            };
            let late = match (*since, end) {
                (None, _) => false,
                (Some(since), Some(end)) => since > end,
                (Some(_), None) => true,
            };
            if late {
                out.push(Out::Expire(*id));
                continue;
            }
            out.push(Out::End(*id, rv.to_string()));
            if *overflowed {
                // It holds none of the lines after the list: it resumes from the list's end,
                // which compares (a `None` end is late above).
                seat.phase = Phase::Resuming {
                    from: end.unwrap_or_default(),
                    at: rv.to_string(),
                };
                continue;
            }
            let held = std::mem::take(held);
            seat.phase = Phase::Live;
            seat.raise(end);
            for (line_rv, bytes) in held {
                if line_rv.is_none_or(|r| end.is_none_or(|end| r > end)) {
                    out.push(Out::Send(*id, bytes));
                }
            }
        }
        self.forget(&out);
        // The seats that went live hold everything up to `rv`, whatever the main watch does
        // next: an open undone now would leave them without one.
        self.opening = None;
        if main {
            self.position = Some(rv.to_string());
        }
        out
    }

    /// The catch-up failed midway: its seats are expired, since their parts announced part of
    /// a list that the next one may contradict (objects deleted between the two); each part
    /// starts its sync over and reconciles.
    pub fn catch_up_failed(&mut self) -> Vec<Out> {
        self.expire_where(|s| matches!(s.phase, Phase::Listing { .. }))
    }

    /// A line of the main watch: to the live seats it is for, held for the listed ones that
    /// began under this watch, each only above its floor. Its resourceVersion, if any, is the
    /// main watch's position.
    pub fn live(&mut self, line: &Line, rv: Option<&str>) -> Vec<Out> {
        self.opening = None;
        if let Some(rv) = rv {
            // The position's buffer is reused: this runs for every line of the collection.
            let position = self.position.get_or_insert_with(String::new);
            position.clear();
            position.push_str(rv);
        }
        let mut out = Vec::new();
        // What the listed seats hold together.
        let mut held_total = 0;
        for (id, seat) in &mut self.seats {
            if let Phase::Listing { held_bytes, .. } = &seat.phase {
                held_total += *held_bytes;
            }
            if !seat.takes(line.to)
                || matches!(seat.phase, Phase::Waiting | Phase::Resuming { .. })
                || matches!(
                    seat.phase,
                    Phase::Listing { since: None, .. }
                        | Phase::Listing {
                            overflowed: true,
                            ..
                        }
                )
                || !seat.fresh(line.rv)
            {
                continue;
            }
            match &mut seat.phase {
                Phase::Live => out.push(Out::Send(*id, line.bytes.clone())),
                Phase::Listing {
                    held, held_bytes, ..
                } => {
                    *held_bytes += line.bytes.len();
                    held_total += line.bytes.len();
                    held.push((line.rv, line.bytes.clone()));
                    if *held_bytes > HELD_BYTES {
                        held_total -= *held_bytes;
                        overflow(&mut seat.phase);
                    }
                }
                Phase::Waiting | Phase::Resuming { .. } => {}
            }
        }
        if held_total > HUB_HELD_BYTES {
            // Rare: the largest holder drops what it held.
            if let Some(seat) = self
                .seats
                .values_mut()
                .filter(|s| matches!(s.phase, Phase::Listing { .. }))
                .max_by_key(|s| match &s.phase {
                    Phase::Listing { held_bytes, .. } => *held_bytes,
                    _ => 0,
                })
            {
                overflow(&mut seat.phase);
            }
        }
        self.forget(&out);
        out
    }

    /// A bookmark for every live seat, at the main watch's position or at the seat's floor
    /// when that is further (after a reopen from below): nothing of its shard is pending up to
    /// it, so its watch stays alive through a quiet collection and its position never goes back.
    pub fn heartbeat(&self) -> Vec<(u64, String)> {
        let Some(at) = self.position.as_deref() else {
            return Vec::new();
        };
        let p = crate::event::comparable(at);
        self.seats
            .iter()
            .filter(|(_, s)| matches!(s.phase, Phase::Live))
            .map(|(id, s)| match (p, s.seen) {
                (Some(p), Some(seen)) if seen > p => (*id, seen.to_string()),
                _ => (*id, at.to_string()),
            })
            .collect()
    }

    /// The main watch cannot go on from its position (a 410, an error event): every seat it
    /// fed, live or holding its lines, is expired; the waiting ones, the resuming ones and
    /// those listed without a main watch stay. No main watch runs any more.
    pub fn gap(&mut self) -> Vec<Out> {
        self.position = None;
        self.opening = None;
        self.expire_where(|s| {
            matches!(s.phase, Phase::Live | Phase::Listing { since: Some(_), .. })
        })
    }

    /// A gap that takes the resuming seats too (nothing here compares).
    fn gap_with_resuming(&mut self) -> Vec<Out> {
        let mut out = self.expire_where(|s| matches!(s.phase, Phase::Resuming { .. }));
        out.extend(self.gap());
        out
    }

    /// Expires the seats `which` picks.
    fn expire_where(&mut self, which: impl Fn(&Seat) -> bool) -> Vec<Out> {
        let out: Vec<Out> = self
            .seats
            .iter()
            .filter(|(_, s)| which(s))
            .map(|(id, _)| Out::Expire(*id))
            .collect();
        self.forget(&out);
        out
    }

    /// Drops the seats `out` expires.
    fn forget(&mut self, out: &[Out]) {
        for o in out {
            if let Out::Expire(id) = o {
                self.seats.remove(id);
            }
        }
    }
}

/// A listed seat that held too much drops it and holds nothing more (see [`HELD_BYTES`]).
fn overflow(phase: &mut Phase) {
    if let Phase::Listing {
        held,
        held_bytes,
        overflowed,
        ..
    } = phase
    {
        *held = Vec::new();
        *held_bytes = 0;
        *overflowed = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(to: To, rv: u64) -> Line {
        Line {
            to,
            rv: Some(rv),
            bytes: Bytes::from(format!("{to:?}@{rv}")),
        }
    }

    /// Seat 1 of shard 0, live on a main watch at 10.
    fn live_one() -> Board {
        let mut b = Board::default();
        b.join(1, 0, None);
        b.begin_catch_up();
        b.caught_up("10", true);
        b
    }

    fn sent(out: &[Out]) -> Vec<(u64, String)> {
        out.iter()
            .map(|o| match o {
                Out::Send(id, b) => (*id, String::from_utf8_lossy(b).into_owned()),
                Out::End(id, rv) => (*id, format!("end@{rv}")),
                Out::Expire(id) => (*id, "expired".into()),
            })
            .collect()
    }

    #[test]
    fn a_first_catch_up_becomes_the_main_watch() {
        let mut b = Board::default();
        b.join(1, 0, None);
        b.join(2, 1, None);
        b.begin_catch_up();
        // Items go to their shard's seat only.
        assert_eq!(
            sent(&b.listed(&line(To::Shard(1), 5))),
            [(2, "Shard(1)@5".into())]
        );
        let out = b.caught_up("10", true);
        assert_eq!(sent(&out), [(1, "end@10".into()), (2, "end@10".into())]);
        assert_eq!(b.position(), Some("10"));
        // Live lines to their shard; bookmarks to every seat.
        assert_eq!(
            sent(&b.live(&line(To::Shard(0), 11), Some("11"))),
            [(1, "Shard(0)@11".into())]
        );
        assert_eq!(sent(&b.live(&line(To::All, 12), Some("12"))).len(), 2);
        assert_eq!(b.heartbeat(), [(1, "12".into()), (2, "12".into())]);
    }

    #[test]
    fn a_late_joiner_gets_its_state_then_what_it_held_past_the_list() {
        let mut b = live_one();
        b.join(2, 0, None);
        assert!(b.waiting());
        // Nothing while waiting.
        assert_eq!(
            sent(&b.live(&line(To::Shard(0), 11), Some("11"))),
            [(1, "Shard(0)@11".into())]
        );
        b.begin_catch_up();
        // Held from here: the main watch is at 11.
        let held = b.live(&line(To::Shard(0), 12), Some("12"));
        assert_eq!(sent(&held), [(1, "Shard(0)@12".into())]);
        b.live(&line(To::Shard(0), 14), Some("14"));
        // The list is at 13: it holds 12, not 14.
        assert_eq!(
            sent(&b.listed(&line(To::Shard(0), 9))),
            [(2, "Shard(0)@9".into())]
        );
        let out = b.caught_up("13", false);
        assert_eq!(
            sent(&out),
            [(2, "end@13".into()), (2, "Shard(0)@14".into())]
        );
        // The main watch's position is its own.
        assert_eq!(b.position(), Some("14"));
        assert!(!b.listing());
    }

    #[test]
    fn a_list_older_than_the_main_watch_expires_its_seats() {
        let mut b = live_one();
        b.live(&line(To::All, 20), Some("20"));
        b.join(2, 0, None);
        b.begin_catch_up();
        assert_eq!(sent(&b.caught_up("15", false)), [(2, "expired".into())]);
        assert_eq!(b.heartbeat(), [(1, "20".into())]);
    }

    #[test]
    fn a_gap_expires_what_the_main_watch_fed_and_keeps_the_rest() {
        let mut b = live_one();
        b.join(2, 1, None);
        b.begin_catch_up();
        b.join(3, 2, None);
        let out = b.gap();
        assert_eq!(sent(&out), [(1, "expired".into()), (2, "expired".into())]);
        assert_eq!(b.position(), None);
        assert!(b.waiting());
        assert!(b.heartbeat().is_empty());
    }

    fn big(to: To, rv: u64, len: usize) -> Line {
        Line {
            to,
            rv: Some(rv),
            bytes: Bytes::from(vec![b'x'; len]),
        }
    }

    #[test]
    fn a_seat_that_holds_too_much_resumes_from_its_list_instead_of_relisting() {
        let mut b = live_one();
        b.join(2, 0, None);
        b.begin_catch_up();
        let half = HELD_BYTES / 2 + 1;
        // Seat 1 gets the lines live; seat 2 holds them, until they outgrow its bound.
        assert_eq!(b.live(&big(To::Shard(0), 11, half), Some("11")).len(), 1);
        assert_eq!(b.live(&big(To::Shard(0), 12, half), Some("12")).len(), 1);
        assert_eq!(b.live(&big(To::Shard(0), 13, half), Some("13")).len(), 1);
        // Its list still ends its state; it then resumes from there, not from a new list.
        let out = b.caught_up("12", false);
        assert_eq!(sent(&out), [(2, "end@12".into())]);
        assert!(!b.listing());
        assert!(b.resuming());
        assert_eq!(b.reopen_from().as_deref(), Some("12"));
        assert!(b.opened("12").is_empty());
        // The reopened watch gives it what it dropped, and seat 1 nothing twice.
        assert_eq!(
            sent(&b.live(&line(To::Shard(0), 13), Some("13"))),
            [(2, "Shard(0)@13".into())]
        );
        assert_eq!(
            sent(&b.live(&line(To::Shard(0), 14), Some("14"))),
            [(1, "Shard(0)@14".into()), (2, "Shard(0)@14".into())]
        );
    }

    #[test]
    fn what_all_seats_hold_is_bounded_by_the_largest_holder_dropping_it() {
        let mut b = live_one();
        let per_seat = HELD_BYTES - 1;
        let seats = (HUB_HELD_BYTES / per_seat) as u64 + 1;
        for k in 0..seats {
            b.join(10 + k, 1 + k as u32, None);
        }
        b.begin_catch_up();
        for k in 0..seats {
            let line = big(To::Shard(1 + k as u32), 11 + k, per_seat - k as usize);
            assert!(b.live(&line, Some(&(11 + k).to_string())).is_empty());
        }
        let end = (10 + seats).to_string();
        let out = b.caught_up(&end, false);
        // The first seat held the most when the hub went over its bound: it alone resumes
        // from the list's end; every other seat goes live (its held lines are older).
        assert_eq!(out.len() as u64, seats);
        assert!(out.iter().all(|o| matches!(o, Out::End(..))));
        assert_eq!(b.reopen_from().as_deref(), Some(end.as_str()));
        assert!(b.opened(&end).is_empty());
        assert!(!b.resuming());
    }

    #[test]
    fn an_open_is_not_undone_once_a_catch_up_began_or_ended_under_it() {
        // A seat listed without a main watch, another resuming from 7.
        let mut b = Board::default();
        b.join(1, 0, None);
        b.begin_catch_up();
        b.join(2, 1, Some("7"));
        assert!(b.opened("7").is_empty());
        // The list ends before the main watch's first line: seat 1 is live on that watch.
        assert_eq!(sent(&b.caught_up("10", false)), [(1, "end@10".into())]);
        assert_eq!(
            b.open_refused(),
            None,
            "seat 1 would be left without a main watch"
        );
        // Likewise a catch-up begun under the open holds lines from its position.
        let mut b = live_one();
        b.join(2, 1, Some("7"));
        b.opened("7");
        b.join(3, 1, None);
        b.begin_catch_up();
        assert_eq!(b.open_refused(), None);
    }

    #[test]
    fn a_failed_catch_up_expires_its_seats() {
        let mut b = live_one();
        b.join(2, 1, None);
        b.begin_catch_up();
        b.join(3, 1, None);
        // Seat 2 got part of a list: only a sync started over reconciles it.
        assert_eq!(sent(&b.catch_up_failed()), [(2, "expired".into())]);
        assert!(b.waiting(), "the seat that joined later still waits");
        assert!(!b.listing());
        assert_eq!(b.position(), Some("10"));
    }

    #[test]
    fn a_seat_live_after_its_list_gets_no_line_the_list_held() {
        // The main watch is behind the list's end (another API server's cache).
        let mut b = live_one();
        b.join(2, 0, None);
        b.begin_catch_up();
        b.caught_up("20", false);
        // 15 is older than what seat 2's list held: only seat 1 gets it.
        assert_eq!(
            sent(&b.live(&line(To::Shard(0), 15), Some("15"))),
            [(1, "Shard(0)@15".into())]
        );
        assert_eq!(sent(&b.live(&line(To::All, 18), Some("18"))).len(), 1);
        // Nor a heartbeat below it: its own floor instead.
        assert_eq!(b.heartbeat(), [(1, "18".into()), (2, "20".into())]);
        assert_eq!(
            sent(&b.live(&line(To::Shard(0), 21), Some("21"))),
            [(1, "Shard(0)@21".into()), (2, "Shard(0)@21".into())]
        );
    }

    #[test]
    fn a_resuming_seat_reopens_the_main_watch_from_its_position() {
        let mut b = live_one();
        b.live(&line(To::Shard(0), 20), Some("20"));
        // Two parts resume at positions their previous owners reached.
        assert!(b.join(2, 1, Some("14")).is_empty());
        assert!(b.join(3, 1, Some("25")).is_empty());
        assert!(b.resuming() && !b.waiting());
        assert_eq!(b.reopen_from().as_deref(), Some("14"));
        assert!(b.opened("14").is_empty());
        assert_eq!(b.position(), Some("14"));
        // Seat 1 already had everything up to 20; seat 3 everything up to 25.
        assert_eq!(sent(&b.live(&line(To::Shard(0), 16), Some("16"))), []);
        assert_eq!(
            sent(&b.live(&line(To::Shard(1), 17), Some("17"))),
            [(2, "Shard(1)@17".into())]
        );
        assert_eq!(
            sent(&b.live(&line(To::All, 22), Some("22"))),
            [(1, "All@22".into()), (2, "All@22".into())]
        );
        assert_eq!(
            sent(&b.live(&line(To::Shard(1), 26), Some("26"))),
            [(2, "Shard(1)@26".into()), (3, "Shard(1)@26".into())]
        );
        assert_eq!(
            b.heartbeat(),
            [(1, "26".into()), (2, "26".into()), (3, "26".into())]
        );
    }

    #[test]
    fn a_resuming_seat_above_the_main_watch_reopens_it_at_its_own_position() {
        let mut b = live_one();
        b.join(2, 1, Some("30"));
        assert_eq!(b.reopen_from().as_deref(), Some("10"));
        assert!(b.opened("10").is_empty());
        assert_eq!(sent(&b.live(&line(To::Shard(1), 29), Some("29"))), []);
        assert_eq!(
            sent(&b.live(&line(To::Shard(1), 31), Some("31"))),
            [(2, "Shard(1)@31".into())]
        );
    }

    #[test]
    fn a_first_resuming_seat_opens_the_main_watch_and_a_running_list_holds_from_it() {
        let mut b = Board::default();
        b.join(1, 0, None);
        b.begin_catch_up();
        b.join(2, 1, Some("7"));
        assert_eq!(b.reopen_from().as_deref(), Some("7"));
        assert!(b.opened("7").is_empty());
        // Seat 1's list, begun without a main watch, now holds the main watch's lines.
        assert!(b.live(&line(To::Shard(0), 9), Some("9")).is_empty());
        b.live(&line(To::Shard(0), 12), Some("12"));
        let out = b.caught_up("10", false);
        assert_eq!(
            sent(&out),
            [(1, "end@10".into()), (1, "Shard(0)@12".into())]
        );
        assert_eq!(b.position(), Some("12"));
    }

    #[test]
    fn a_position_the_server_no_longer_holds_expires_its_seats_only() {
        let mut b = live_one();
        b.live(&line(To::All, 20), Some("20"));
        b.join(2, 1, Some("5"));
        b.join(3, 1, Some("12"));
        assert_eq!(b.reopen_from().as_deref(), Some("5"));
        assert_eq!(sent(&b.reopen_gone("5")), [(2, "expired".into())]);
        assert_eq!(b.reopen_from().as_deref(), Some("12"));
        // The main watch's own position gone as well: a gap.
        assert_eq!(sent(&b.reopen_gone("12")), [(3, "expired".into())]);
        assert_eq!(b.position(), Some("20"));
        assert_eq!(sent(&b.reopen_gone("20")), [(1, "expired".into())]);
        assert_eq!(b.position(), None);
        // A position that does not compare cannot be resumed from.
        assert_eq!(sent(&b.join(4, 0, Some("x"))), [(4, "expired".into())]);
    }

    #[test]
    fn a_missed_shard_expires_its_listed_and_live_seats_only() {
        let mut b = live_one();
        b.join(2, 1, None);
        b.begin_catch_up();
        b.join(3, 1, None);
        b.join(4, 2, None);
        assert_eq!(b.shards(), BTreeSet::from([0, 1, 2]));
        assert_eq!(b.waiting_shards(), BTreeSet::from([1, 2]));
        // Shard 1 missed a namespace: its listed seat goes, its waiting one stays; shard 0 is
        // untouched.
        let out = b.missed(&BTreeSet::from([1]));
        assert_eq!(sent(&out), [(2, "expired".into())]);
        assert!(b.has_shard(1) && b.has_shard(0));
        assert_eq!(b.waiting_shards(), BTreeSet::from([1, 2]));
        assert_eq!(b.position(), Some("10"));
        // The same for a live seat.
        assert_eq!(
            sent(&b.missed(&BTreeSet::from([0]))),
            [(1, "expired".into())]
        );
        assert!(!b.has_shard(0));
    }
}
