//! Who gets which line: the pure state of one collection's subscribers.
//!
//! # A seat's phases
//! ```text
//!  join ──► Waiting ──begin_catch_up──► Listing ──caught_up(L)──► Live
//!              ▲                          │  held lines > L after the
//!              └──── catch_up_failed ─────┘  end of its state, then live lines
//!  Listing or Live ──gap / too much held / L below its start / missed──► expired (gone)
//! ```
//! - **Waiting**: joined, its state not listed yet; it receives nothing.
//! - **Listing**: a catch-up (a list of the whole collection) deals it the items of its shard.
//!   Live lines of its shard that arrive meanwhile on the main watch are held (up to
//!   [`HELD_BYTES`]), with the main watch's position when the catch-up began (`since`).
//! - **Live**: it receives its shard's live lines and every bookmark.
//!
//! At the end of a catch-up at resourceVersion `L`, each listing seat receives the end of its
//! initial state (a bookmark at `L`), then the lines it held that are newer than `L`: the list
//! holds every change up to `L`, the held lines every change after `since`, so when `since` is
//! not above `L` nothing is missed and nothing is given twice. A seat whose `since` is above
//! `L` (a list older than the watch), whose held lines outgrew their bound, or whose lines the
//! main watch can no longer continue (a gap: 410, a failed reopen), or whose shard's lines were
//! missed (the server, filtering by shard, was not asked for a namespace of it), is expired: it
//! gets a 410 and leaves, and its stream relists as after any 410.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

/// What a seat may hold while it is listed, in bytes of lines: past it, the seat is expired.
pub const HELD_BYTES: usize = 8 << 20;

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
    Listing {
        /// The main watch's position when the catch-up began; `None` when no main watch ran
        /// (the catch-up then becomes it).
        since: Option<u64>,
        held: Vec<(Option<u64>, Bytes)>,
        held_bytes: usize,
    },
    Live,
}

#[derive(Debug)]
struct Seat {
    shard: u32,
    phase: Phase,
}

impl Seat {
    fn takes(&self, to: To) -> bool {
        match to {
            To::All => true,
            To::Shard(k) => k == self.shard,
        }
    }
}

/// The seats of one collection and the main watch's position.
#[derive(Debug, Default)]
pub struct Board {
    seats: BTreeMap<u64, Seat>,
    /// Where the main watch is: every line up to it was dealt. `None` while none runs.
    position: Option<String>,
}

impl Board {
    /// A subscriber of `shard` joins; it waits for the next catch-up.
    pub fn join(&mut self, id: u64, shard: u32) {
        self.seats.insert(
            id,
            Seat {
                shard,
                phase: Phase::Waiting,
            },
        );
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
    /// seats being listed or live are expired; the waiting ones stay, their catch-up to come.
    pub fn missed(&mut self, shards: &BTreeSet<u32>) -> Vec<Out> {
        self.expire_where(|s| shards.contains(&s.shard) && !matches!(s.phase, Phase::Waiting))
    }

    /// The main watch's position.
    pub fn position(&self) -> Option<&str> {
        self.position.as_deref()
    }

    /// A catch-up begins: every waiting seat is listed by it.
    pub fn begin_catch_up(&mut self) {
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
    /// main watch, from `rv`.
    pub fn caught_up(&mut self, rv: &str, main: bool) -> Vec<Out> {
        let end = crate::event::comparable(rv);
        let mut out = Vec::new();
        for (id, seat) in &mut self.seats {
            let Phase::Listing { since, held, .. } = &mut seat.phase else {
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
            for (line_rv, bytes) in std::mem::take(held) {
                if line_rv.is_none_or(|r| end.is_none_or(|end| r > end)) {
                    out.push(Out::Send(*id, bytes));
                }
            }
            seat.phase = Phase::Live;
        }
        self.forget(&out);
        if main {
            self.position = Some(rv.to_string());
        }
        out
    }

    /// The catch-up failed: its seats wait for the next one.
    pub fn catch_up_failed(&mut self) {
        for seat in self.seats.values_mut() {
            if matches!(seat.phase, Phase::Listing { .. }) {
                seat.phase = Phase::Waiting;
            }
        }
    }

    /// A line of the main watch: to the live seats it is for, held for the listed ones that
    /// began under this watch. Its resourceVersion, if any, is the main watch's position.
    pub fn live(&mut self, line: &Line, rv: Option<&str>) -> Vec<Out> {
        if let Some(rv) = rv {
            // The position's buffer is reused: this runs for every line of the collection.
            let position = self.position.get_or_insert_with(String::new);
            position.clear();
            position.push_str(rv);
        }
        let mut out = Vec::new();
        for (id, seat) in &mut self.seats {
            if !seat.takes(line.to) {
                continue;
            }
            match &mut seat.phase {
                Phase::Live => out.push(Out::Send(*id, line.bytes.clone())),
                Phase::Listing {
                    since: Some(_),
                    held,
                    held_bytes,
                } => {
                    *held_bytes += line.bytes.len();
                    if *held_bytes > HELD_BYTES {
                        out.push(Out::Expire(*id));
                    } else {
                        held.push((line.rv, line.bytes.clone()));
                    }
                }
                Phase::Listing { since: None, .. } | Phase::Waiting => {}
            }
        }
        self.forget(&out);
        out
    }

    /// A bookmark at the main watch's position, for every live seat: nothing of their shards
    /// is pending up to it (their watches stay alive through a quiet collection).
    pub fn heartbeat(&self) -> Option<(Vec<u64>, String)> {
        let at = self.position.clone()?;
        let live: Vec<u64> = self
            .seats
            .iter()
            .filter(|(_, s)| matches!(s.phase, Phase::Live))
            .map(|(id, _)| *id)
            .collect();
        Some((live, at))
    }

    /// The main watch cannot go on from its position (a 410, an error event): every seat it
    /// fed, live or holding its lines, is expired; the waiting ones and those listed without
    /// a main watch stay. No main watch runs any more.
    pub fn gap(&mut self) -> Vec<Out> {
        self.position = None;
        self.expire_where(|s| {
            matches!(s.phase, Phase::Live | Phase::Listing { since: Some(_), .. })
        })
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
        b.join(1, 0);
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
        b.join(1, 0);
        b.join(2, 1);
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
        assert_eq!(b.heartbeat(), Some((vec![1, 2], "12".into())));
    }

    #[test]
    fn a_late_joiner_gets_its_state_then_what_it_held_past_the_list() {
        let mut b = live_one();
        b.join(2, 0);
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
        b.join(2, 0);
        b.begin_catch_up();
        assert_eq!(sent(&b.caught_up("15", false)), [(2, "expired".into())]);
        assert_eq!(b.heartbeat(), Some((vec![1], "20".into())));
    }

    #[test]
    fn a_gap_expires_what_the_main_watch_fed_and_keeps_the_rest() {
        let mut b = live_one();
        b.join(2, 1);
        b.begin_catch_up();
        b.join(3, 2);
        let out = b.gap();
        assert_eq!(sent(&out), [(1, "expired".into()), (2, "expired".into())]);
        assert_eq!(b.position(), None);
        assert!(b.waiting());
        assert_eq!(b.heartbeat(), None);
    }

    #[test]
    fn held_lines_are_bounded() {
        let mut b = live_one();
        b.join(2, 0);
        b.begin_catch_up();
        let big = Line {
            to: To::Shard(0),
            rv: Some(11),
            bytes: Bytes::from(vec![b'x'; HELD_BYTES / 2 + 1]),
        };
        assert_eq!(b.live(&big, Some("11")).len(), 1);
        let out = b.live(&big, Some("12"));
        assert!(out.contains(&Out::Expire(2)), "{out:?}");
        assert!(!b.listing());
    }

    #[test]
    fn a_failed_catch_up_leaves_its_seats_waiting() {
        let mut b = Board::default();
        b.join(1, 0);
        b.begin_catch_up();
        b.catch_up_failed();
        assert!(b.waiting());
        assert!(!b.listing());
    }

    #[test]
    fn a_missed_shard_expires_its_listed_and_live_seats_only() {
        let mut b = live_one();
        b.join(2, 1);
        b.begin_catch_up();
        b.join(3, 1);
        b.join(4, 2);
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
