//! The lines a part had no room for: a part that stops reading holds up no other part.
//!
//! A part's subscription buffers a few hundred lines. When it is full (the part's records wait
//! for Kafka, behind a stalled partition of its keys), the part is **stalled**: its lines queue
//! here, in order, and the hub goes on reading for the other parts. Once the part has room
//! again, its queue goes out in order, before any newer line of its.
//!
//! ```text
//!  flowing ──no room for a line──► stalled{queue: that line} ── its lines ──► queued behind
//!     ▲                              │   │
//!     └── room for all of the queue ─┘   └── queue past QUEUE_BYTES, or the largest when the
//!         (room for some: as many go         queues pass HUB_QUEUE_BYTES ──► let go
//!         out, in order, the rest wait)
//!  stalled ── expired (410) ──► its queue dropped, the 410 goes out; ── left ──► forgotten
//! ```
//!
//! A part **let go** has its subscription closed once it has read what it buffered: it reads
//! as a watch the server ended, and resumes from its position (the hub reopens from there), so
//! memory stays bounded; only one cut in its list syncs again. When every live part is
//! stalled, none is held up by waiting: the hub then stops reading its main watch (see
//! [`super::hub::Hub::main_paused`]), as a watch waits for a slow reader, and queues nothing.
//!
//! A list is not queued: a stalled part being listed pauses the catch-up (every part it lists
//! waits, as before a list's end they must), for [`super::hub::Timing::slow_list`] at most;
//! then it is let go, and the others' list goes on.

use std::collections::{BTreeMap, VecDeque};

use tokio::time::Instant;

use super::board::{Out, HELD_BYTES};

/// What a stalled part may queue, in bytes of lines: past it, the part is let go. Twice what a
/// part being listed may hold, so that one stalled at its list's end keeps what it held.
pub const QUEUE_BYTES: usize = 2 * HELD_BYTES;
/// What the stalled parts of a hub may queue together: past it, the part queueing the most is
/// let go, so that many stalled shards cannot hold a replica's memory.
pub const HUB_QUEUE_BYTES: usize = 64 << 20;
/// What an end-of-state bookmark is counted as, before the loop writes it.
const BOOKMARK_BYTES: usize = 160;

/// The queues of a hub's stalled parts.
#[derive(Debug, Default)]
pub struct Backlogs {
    queues: BTreeMap<u64, Queue>,
    /// Bytes queued in all of them.
    total: usize,
}

#[derive(Debug)]
struct Queue {
    outs: VecDeque<Out>,
    bytes: usize,
    /// When the seat stalled.
    since: Instant,
}

fn size(out: &Out) -> usize {
    match out {
        Out::Send(_, bytes) => bytes.len(),
        Out::End(_, rv) => rv.len() + BOOKMARK_BYTES,
        Out::Expire(_) => 0,
    }
}

fn seat(out: &Out) -> u64 {
    match out {
        Out::Send(id, _) | Out::End(id, _) | Out::Expire(id) => *id,
    }
}

impl Backlogs {
    /// Whether no seat is stalled.
    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    /// Whether seat `id` is stalled: a line for it goes behind its queue.
    pub fn stalled(&self, id: u64) -> bool {
        self.queues.contains_key(&id)
    }

    /// The stalled seats.
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.queues.keys().copied()
    }

    /// Since when seat `id` is stalled, if it is.
    pub fn since(&self, id: u64) -> Option<Instant> {
        self.queues.get(&id).map(|q| q.since)
    }

    /// `out` found no room in its seat's subscription at `now`: the seat is stalled, `out`
    /// first in its queue (or behind it). Returns the seats to let go.
    pub fn no_room(&mut self, out: Out, now: Instant) -> Vec<u64> {
        let id = seat(&out);
        self.queues.entry(id).or_insert_with(|| Queue {
            outs: VecDeque::new(),
            bytes: 0,
            since: now,
        });
        self.push(id, out);
        self.over(id)
    }

    /// `out`, from the head of its seat's queue, found no room after all: back at the head.
    pub fn requeue(&mut self, out: Out, now: Instant) {
        let id = seat(&out);
        let n = size(&out);
        let q = self.queues.entry(id).or_insert_with(|| Queue {
            outs: VecDeque::new(),
            bytes: 0,
            since: now,
        });
        q.bytes += n;
        q.outs.push_front(out);
        self.total += n;
    }

    /// What to hand out now of `outs`, in order: a line for a stalled seat queues behind its
    /// others instead; an expiry drops a stalled seat's queue (its part relists) and goes out.
    /// Also returns the seats to let go.
    pub fn route(&mut self, outs: Vec<Out>) -> (Vec<Out>, Vec<u64>) {
        if self.queues.is_empty() {
            return (outs, Vec::new());
        }
        let mut now = Vec::with_capacity(outs.len());
        let mut let_go = Vec::new();
        for out in outs {
            let id = seat(&out);
            if !self.stalled(id) {
                now.push(out);
            } else if matches!(out, Out::Expire(_)) {
                self.forget(id);
                now.push(out);
            } else {
                self.push(id, out);
                let_go.extend(self.over(id));
            }
        }
        // A seat let go is gone: nothing more goes to it.
        now.retain(|o| !let_go.contains(&seat(o)));
        (now, let_go)
    }

    /// Seat `id` has room for `free` lines again: the first `free` of its queue, in order. It
    /// is no longer stalled once its queue is empty; until then the rest waits (and so does
    /// whatever comes for it), stalled since it first was.
    pub fn room(&mut self, id: u64, free: usize) -> Vec<Out> {
        let Some(q) = self.queues.get_mut(&id) else {
            return Vec::new();
        };
        let n = free.min(q.outs.len());
        let out: Vec<Out> = q.outs.drain(..n).collect();
        let bytes: usize = out.iter().map(size).sum();
        q.bytes -= bytes;
        self.total -= bytes;
        if q.outs.is_empty() {
            self.queues.remove(&id);
        }
        out
    }

    /// Seat `id` left (or was expired, or let go): its queue is dropped.
    pub fn forget(&mut self, id: u64) {
        if let Some(q) = self.queues.remove(&id) {
            self.total -= q.bytes;
        }
    }

    /// Queues `out` behind seat `id`'s lines; it is stalled.
    fn push(&mut self, id: u64, out: Out) {
        let n = size(&out);
        let Some(q) = self.queues.get_mut(&id) else {
            return;
        };
        q.bytes += n;
        q.outs.push_back(out);
        self.total += n;
    }

    /// The seats to let go after seat `id` queued more: it, past [`QUEUE_BYTES`]; the seat
    /// queueing the most (the earliest of equals), past [`HUB_QUEUE_BYTES`] for the hub. They
    /// are forgotten.
    fn over(&mut self, id: u64) -> Vec<u64> {
        let mut out = Vec::new();
        if self.queues.get(&id).is_some_and(|q| q.bytes > QUEUE_BYTES) {
            out.push(id);
            self.forget(id);
        }
        if self.total > HUB_QUEUE_BYTES {
            if let Some(largest) = self
                .queues
                .iter()
                .max_by_key(|(id, q)| (q.bytes, std::cmp::Reverse(**id)))
                .map(|(id, _)| *id)
            {
                out.push(largest);
                self.forget(largest);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn send(id: u64, n: usize) -> Out {
        Out::Send(id, Bytes::from(vec![b'x'; n]))
    }

    fn t0() -> Instant {
        Instant::now()
    }

    fn tag(id: u64, s: &str) -> Out {
        Out::Send(id, Bytes::from(s.to_string()))
    }

    #[test]
    fn a_seat_with_room_gets_its_lines_at_once() {
        let mut b = Backlogs::default();
        let outs = vec![tag(1, "a"), Out::End(2, "7".into()), Out::Expire(3)];
        assert_eq!(
            b.route(outs),
            (
                vec![tag(1, "a"), Out::End(2, "7".into()), Out::Expire(3)],
                vec![]
            )
        );
    }

    #[test]
    fn a_stalled_seat_gets_its_lines_in_order_once_it_has_room_and_the_others_go_on() {
        let mut b = Backlogs::default();
        let t = t0();
        assert_eq!(b.no_room(tag(1, "a"), t), Vec::<u64>::new());
        assert_eq!(b.since(1), Some(t));
        assert!(b.stalled(1));
        let (now, let_go) = b.route(vec![tag(1, "b"), tag(2, "x"), Out::End(1, "9".into())]);
        assert_eq!(now, vec![tag(2, "x")]);
        assert!(let_go.is_empty());
        assert_eq!(
            b.room(1, 512),
            vec![tag(1, "a"), tag(1, "b"), Out::End(1, "9".into())]
        );
        assert!(!b.stalled(1));
        assert_eq!(b.route(vec![tag(1, "c")]).0, vec![tag(1, "c")]);
    }

    #[test]
    fn a_seat_with_room_for_some_gets_that_many_and_stays_stalled_since_it_was() {
        let mut b = Backlogs::default();
        let t = t0();
        b.no_room(tag(1, "a"), t);
        b.route(vec![tag(1, "b"), tag(1, "c")]);
        assert_eq!(b.room(1, 1), vec![tag(1, "a")]);
        assert!(b.stalled(1));
        assert_eq!(b.since(1), Some(t));
        // What comes meanwhile waits behind the rest.
        assert_eq!(b.route(vec![tag(1, "d")]).0, vec![]);
        assert_eq!(b.room(1, 512), vec![tag(1, "b"), tag(1, "c"), tag(1, "d")]);
        assert!(!b.stalled(1));
        assert_eq!(b.total, 0);
    }

    #[test]
    fn a_head_handed_out_that_found_no_room_goes_back_ahead() {
        let mut b = Backlogs::default();
        b.no_room(tag(1, "a"), t0());
        b.route(vec![tag(1, "b")]);
        let head = b.room(1, 1);
        b.requeue(head.into_iter().next().unwrap(), t0());
        assert_eq!(b.room(1, 512), vec![tag(1, "a"), tag(1, "b")]);
        assert_eq!(b.total, 0);
    }

    #[test]
    fn an_expired_stalled_seat_drops_its_queue_and_gets_the_410() {
        let mut b = Backlogs::default();
        b.no_room(tag(1, "a"), t0());
        assert_eq!(
            b.route(vec![Out::Expire(1)]),
            (vec![Out::Expire(1)], vec![])
        );
        assert!(!b.stalled(1));
        assert_eq!(b.total, 0);
    }

    #[test]
    fn a_seat_queueing_past_its_bound_is_let_go_and_gets_nothing_more() {
        let mut b = Backlogs::default();
        b.no_room(send(1, QUEUE_BYTES / 2), t0());
        let (now, let_go) = b.route(vec![send(1, QUEUE_BYTES / 2 + 1), tag(2, "x")]);
        assert_eq!((now, let_go), (vec![tag(2, "x")], vec![1]));
        assert!(!b.stalled(1));
        assert_eq!(b.total, 0);
    }

    #[test]
    fn past_the_hubs_bound_the_seat_queueing_the_most_is_let_go() {
        let mut b = Backlogs::default();
        let each = QUEUE_BYTES - 1;
        let mut let_go = Vec::new();
        for id in 0..(HUB_QUEUE_BYTES / each) as u64 {
            let_go.extend(b.no_room(send(id, each - usize::from(id == 3)), t0()));
        }
        assert!(let_go.is_empty());
        // One more seat takes the hub past its bound: the largest goes, the earliest of equals.
        assert_eq!(b.no_room(send(100, each), t0()), vec![0]);
        assert!(b.stalled(100) && !b.stalled(0));
        assert!(b.total <= HUB_QUEUE_BYTES);
    }

    #[test]
    fn a_seat_that_left_is_forgotten() {
        let mut b = Backlogs::default();
        b.no_room(tag(1, "a"), t0());
        b.forget(1);
        assert!(!b.stalled(1));
        assert!(b.room(1, 512).is_empty());
        assert_eq!(b.ids().count(), 0);
    }
}
