//! Ordered acknowledgement of one stream's events.
//!
//! Kafka acknowledges records out of order (they go to different partitions), but a
//! resourceVersion is a position in one totally ordered stream. The checkpoint is therefore the
//! position of the longest *prefix* of events that Kafka has acknowledged: an event acked early
//! waits until everything before it is acked too. A DELETED's object leaves the stream's
//! membership by the same prefix (see [`Tracker::take_left`]).

use std::collections::VecDeque;

#[derive(Debug)]
struct Entry {
    /// Stream position once this entry is delivered; `None` while listing, when no position
    /// exists until the list completes.
    rv: Option<String>,
    /// The object that leaves the membership once this entry is delivered.
    leaves: Option<String>,
    done: bool,
}

/// Per-stream ordered delivery tracker.
#[derive(Debug, Default)]
pub struct Tracker {
    /// Sequence number of `pending[0]`.
    base: u64,
    pending: VecDeque<Entry>,
    /// Position of the longest acknowledged prefix.
    checkpoint: Option<String>,
    /// Objects whose DELETED joined the acknowledged prefix, not yet taken.
    left: Vec<String>,
}

impl Tracker {
    /// A tracker resuming from a persisted checkpoint.
    pub fn resume(checkpoint: Option<String>) -> Self {
        Self {
            checkpoint,
            ..Self::default()
        }
    }

    /// Registers an event awaiting delivery and returns its sequence number.
    pub fn push(&mut self, rv: Option<String>, leaves: Option<String>) -> u64 {
        self.pending.push_back(Entry {
            rv,
            leaves,
            done: false,
        });
        self.base + self.pending.len() as u64 - 1
    }

    /// Registers a position that needs no delivery (a bookmark, a filtered event): it becomes
    /// the checkpoint as soon as everything before it is delivered.
    /// Returns true when the checkpoint moved.
    pub fn push_done(&mut self, rv: Option<String>, leaves: Option<String>) -> bool {
        self.pending.push_back(Entry {
            rv,
            leaves,
            done: true,
        });
        self.advance()
    }

    /// Marks `seq` delivered. Returns true when the checkpoint moved.
    pub fn ack(&mut self, seq: u64) -> bool {
        if let Some(i) = seq.checked_sub(self.base) {
            if let Some(e) = self.pending.get_mut(i as usize) {
                e.done = true;
            }
        }
        self.advance()
    }

    fn advance(&mut self) -> bool {
        let before = self.checkpoint.clone();
        while self.pending.front().is_some_and(|e| e.done) {
            let e = self.pending.pop_front().expect("front exists");
            self.base += 1;
            if let Some(rv) = e.rv {
                self.checkpoint = Some(rv);
            }
            self.left.extend(e.leaves);
        }
        before != self.checkpoint
    }

    /// The objects whose DELETED joined the acknowledged prefix since the last call.
    pub fn take_left(&mut self) -> Vec<String> {
        std::mem::take(&mut self.left)
    }

    /// Whether `seq` awaits acknowledgement (not yet acknowledged, nor forgotten by a reset).
    pub fn is_pending(&self, seq: u64) -> bool {
        seq.checked_sub(self.base)
            .and_then(|i| self.pending.get(i as usize))
            .is_some_and(|e| !e.done)
    }

    /// The position entry `seq` moves the checkpoint to once delivered, if it has one and is
    /// pending.
    pub fn position_of(&self, seq: u64) -> Option<&str> {
        seq.checked_sub(self.base)
            .and_then(|i| self.pending.get(i as usize))
            .and_then(|e| e.rv.as_deref())
    }

    /// Events sent but not yet acknowledged (entries behind them included).
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    pub fn checkpoint(&self) -> Option<&str> {
        self.checkpoint.as_deref()
    }

    /// Forgets the position: entries delivered from now on move it again only when they carry
    /// one.
    pub fn forget_position(&mut self) {
        self.checkpoint = None;
    }

    /// Forgets everything not yet delivered; used when a delivery failed for good and the stream
    /// goes back to its checkpoint. Late acks of the forgotten entries are ignored.
    pub fn reset(&mut self) {
        self.base += self.pending.len() as u64;
        self.pending.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_is_the_longest_acknowledged_prefix() {
        let mut t = Tracker::default();
        let a = t.push(Some("1".into()), None);
        let b = t.push(Some("2".into()), None);
        let c = t.push(Some("3".into()), None);
        assert!(!t.ack(c));
        assert_eq!(t.checkpoint(), None);
        assert!(t.ack(a));
        assert_eq!(t.checkpoint(), Some("1"));
        assert!(t.ack(b));
        assert_eq!(t.checkpoint(), Some("3"));
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn positions_without_delivery_wait_their_turn() {
        let mut t = Tracker::default();
        let a = t.push(Some("5".into()), None);
        t.push_done(Some("9".into()), None);
        assert_eq!(t.checkpoint(), None);
        t.ack(a);
        assert_eq!(t.checkpoint(), Some("9"));
    }

    #[test]
    fn list_entries_have_no_position_until_the_list_ends() {
        let mut t = Tracker::resume(Some("100".into()));
        let a = t.push(None, None);
        t.ack(a);
        assert_eq!(t.checkpoint(), Some("100"));
        t.push_done(Some("120".into()), None);
        assert_eq!(t.checkpoint(), Some("120"));
    }

    #[test]
    fn objects_leave_in_order_and_reset_forgets_pending() {
        let mut t = Tracker::default();
        let a = t.push(Some("1".into()), None);
        let d = t.push(Some("2".into()), Some("a".into()));
        t.ack(d);
        assert!(t.take_left().is_empty(), "behind an unacknowledged entry");
        t.ack(a);
        assert_eq!(t.take_left(), ["a"]);
        let e = t.push(Some("3".into()), Some("e".into()));
        assert!(t.is_pending(e));
        t.reset();
        assert!(!t.is_pending(e));
        assert!(!t.ack(e));
        assert!(t.take_left().is_empty());
        assert_eq!(t.checkpoint(), Some("2"));
        assert_eq!(t.in_flight(), 0);
    }
}
