//! Ordered acknowledgement of one stream's events, and the set of objects the stream knows.
//!
//! Kafka acknowledges records out of order (they go to different partitions), but a
//! resourceVersion is a position in one totally ordered stream. The checkpoint is therefore the
//! position of the longest *prefix* of events that Kafka has acknowledged: an event acked early
//! waits until everything before it is acked too. The known-object set is advanced by the same
//! prefix, so a persisted checkpoint and its known set always describe the same moment.

use std::collections::{HashMap, VecDeque};

/// The compact identity the relay keeps per object to infer deletions after a 410.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Known {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub rv: String,
}

/// How an event changes the known set once it is delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Upsert {
        uid: String,
        known: Known,
    },
    Remove {
        uid: String,
    },
    /// The whole current state has been announced (a list or resync ended): from here on the
    /// set holds every object, not only those seen since a resume without a saved set.
    Complete,
}

#[derive(Debug)]
struct Entry {
    /// Stream position once this entry is delivered; `None` while listing, when no position
    /// exists until the list completes.
    rv: Option<String>,
    change: Option<Change>,
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
    known: HashMap<String, Known>,
    /// Whether `known` holds every object of the stream (see [`Change::Complete`]).
    complete: bool,
}

impl Tracker {
    /// A tracker resuming from a persisted checkpoint. Without a saved set (`None`) the set
    /// starts empty and stays incomplete until the stream next announces its whole state.
    pub fn resume(checkpoint: Option<String>, known: Option<HashMap<String, Known>>) -> Self {
        Self {
            checkpoint,
            complete: known.is_some(),
            known: known.unwrap_or_default(),
            ..Self::default()
        }
    }

    /// Registers an event awaiting delivery and returns its sequence number.
    pub fn push(&mut self, rv: Option<String>, change: Option<Change>) -> u64 {
        self.pending.push_back(Entry {
            rv,
            change,
            done: false,
        });
        self.base + self.pending.len() as u64 - 1
    }

    /// Registers a position that needs no delivery (a bookmark, a filtered event): it becomes
    /// the checkpoint as soon as everything before it is delivered.
    /// Returns true when the checkpoint moved.
    pub fn push_done(&mut self, rv: Option<String>, change: Option<Change>) -> bool {
        self.pending.push_back(Entry {
            rv,
            change,
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
            match e.change {
                Some(Change::Upsert { uid, known }) => {
                    self.known.insert(uid, known);
                }
                Some(Change::Remove { uid }) => {
                    self.known.remove(&uid);
                }
                Some(Change::Complete) => self.complete = true,
                None => {}
            }
        }
        before != self.checkpoint
    }

    /// Whether `seq` awaits acknowledgement (not yet acknowledged, nor forgotten by a reset).
    pub fn is_pending(&self, seq: u64) -> bool {
        seq.checked_sub(self.base)
            .and_then(|i| self.pending.get(i as usize))
            .is_some_and(|e| !e.done)
    }

    /// Events sent but not yet acknowledged (entries behind them included).
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    pub fn checkpoint(&self) -> Option<&str> {
        self.checkpoint.as_deref()
    }

    pub fn known(&self) -> &HashMap<String, Known> {
        &self.known
    }

    /// The known set, when it holds every object at the checkpoint; what is worth persisting.
    pub fn complete_known(&self) -> Option<&HashMap<String, Known>> {
        self.complete.then_some(&self.known)
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

    fn up(uid: &str, rv: &str) -> Option<Change> {
        Some(Change::Upsert {
            uid: uid.into(),
            known: Known {
                name: uid.into(),
                namespace: None,
                rv: rv.into(),
            },
        })
    }

    #[test]
    fn checkpoint_is_the_longest_acknowledged_prefix() {
        let mut t = Tracker::default();
        let a = t.push(Some("1".into()), up("a", "1"));
        let b = t.push(Some("2".into()), up("b", "2"));
        let c = t.push(Some("3".into()), up("c", "3"));
        assert!(!t.ack(c));
        assert_eq!(t.checkpoint(), None);
        assert!(t.known().is_empty());
        assert!(t.ack(a));
        assert_eq!(t.checkpoint(), Some("1"));
        assert!(t.ack(b));
        assert_eq!(t.checkpoint(), Some("3"));
        assert_eq!(t.known().len(), 3);
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn positions_without_delivery_wait_their_turn() {
        let mut t = Tracker::default();
        let a = t.push(Some("5".into()), up("a", "5"));
        t.push_done(Some("9".into()), None);
        assert_eq!(t.checkpoint(), None);
        t.ack(a);
        assert_eq!(t.checkpoint(), Some("9"));
    }

    #[test]
    fn list_entries_have_no_position_until_the_list_ends() {
        let mut t = Tracker::resume(Some("100".into()), None);
        let a = t.push(None, up("a", "90"));
        t.ack(a);
        assert_eq!(t.checkpoint(), Some("100"));
        assert_eq!(t.complete_known(), None, "resumed without a saved set");
        t.push_done(Some("120".into()), Some(Change::Complete));
        assert_eq!(t.checkpoint(), Some("120"));
        assert_eq!(t.complete_known().map(HashMap::len), Some(1));
    }

    #[test]
    fn removals_apply_in_order_and_reset_forgets_pending() {
        let mut t = Tracker::default();
        let a = t.push(Some("1".into()), up("a", "1"));
        let d = t.push(Some("2".into()), Some(Change::Remove { uid: "a".into() }));
        t.ack(a);
        assert!(t.known().contains_key("a"));
        t.ack(d);
        assert!(!t.known().contains_key("a"));
        let e = t.push(Some("3".into()), up("e", "3"));
        assert!(t.is_pending(e));
        t.reset();
        assert!(!t.is_pending(e));
        assert!(!t.ack(e));
        assert_eq!(t.checkpoint(), Some("2"));
        assert_eq!(t.in_flight(), 0);
    }
}
