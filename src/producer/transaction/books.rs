//! The bookkeeping of a transactional producer, apart from its I/O: which reports wait for
//! their transaction's outcome ([`Hold`]), and which streams' records and positions the open
//! transaction holds ([`Books`]).
//!
//! # States of the open transaction
//! | state | a send | a position | a report |
//! |---|---|---|---|
//! | *open* | taken, its receipt held by the open [`Hold`] | kept for the commit, the latest of its key | held until the outcome |
//! | *closed* (a commit or an abort under way) | taken for the next transaction, sent once it began | kept for the next transaction | held until the outcome |
//! | after an abort (from its decision, while the next one opens too) | refused for the streams it held, until each rewound | ignored for those streams | forwarded as failed |
//!
//! A record in its stream's order (an entry, a join) belongs to its stream; a record in no
//! stream's order (a membership tombstone, a mark) to none, and is never refused for a replay.
//! A stream may pin the open transaction for its next record (a DELETED for its tombstone): it
//! is not closed until that one is taken, or for a commit interval at most. A stream that
//! rewinds for a cause of its own while it has records in the open transaction dooms it: it
//! aborts instead of committing; so does a transaction being committed, if its commit has not
//! begun yet. A send changes the books only once the producer took the record.
//!
//! # Contract
//! - A report reaches its stream only once its transaction's outcome is known: as it is when
//!   committed; when aborted, with its own error if it failed, else as a retriable failure. So
//!   an outbox's checkpoint never covers a record a `read_committed` consumer may not see, and
//!   a membership join counts only once it is committed.
//! - A position record commits with the records its stream handed before it, never without
//!   them: a record and its position are taken in one step; after an abort, a stream that had
//!   records in it may send nothing, and its positions are dropped, until it rewound (replays
//!   from its checkpoint). Positions it handed while the aborted transaction was closing are
//!   dropped too.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::producer::{DeliveryError, Holds, ProduceError, Record, Report, StreamKey};

/// What became of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Committed,
    /// Aborted, and why.
    Aborted(String),
}

/// The reports of one transaction, held until its outcome is known.
#[derive(Debug, Default)]
pub(crate) struct Hold {
    state: Mutex<HoldState>,
}

#[derive(Debug, Default)]
struct HoldState {
    outcome: Option<Outcome>,
    held: Vec<Report>,
    /// Where Kafka wrote the first of its membership records (positions, joins, tombstones) it
    /// acknowledged, and the first of its entries: the relay may read the membership topic,
    /// and with sharding a shard's partition of it has no other writer.
    witness: Option<Witness>,
    entry_witness: Option<Witness>,
}

/// Where Kafka wrote a record of a transaction: a `read_committed` reader sees it there once
/// the transaction committed, and never if it aborted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Witness {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

impl Holds for Hold {
    fn witness(&self, topic: &str, partition: i32, offset: i64, entry: bool) {
        let mut state = self.state.lock().expect("hold lock poisoned");
        let slot = if entry {
            &mut state.entry_witness
        } else {
            &mut state.witness
        };
        if slot.is_none() {
            *slot = Some(Witness {
                topic: topic.to_string(),
                partition,
                offset,
            });
        }
    }

    /// A report of a record of this transaction: held while the outcome is unknown, forwarded
    /// (as it is, or failed) once it is known.
    fn report(&self, report: Report) {
        let outcome = {
            let mut state = self.state.lock().expect("hold lock poisoned");
            match &state.outcome {
                None => {
                    state.held.push(report);
                    return;
                }
                Some(outcome) => outcome.clone(),
            }
        };
        forward(report, &outcome);
    }
}

impl Hold {
    /// The transaction's outcome: every held report is forwarded, and so is any that comes
    /// later. Decided once; a second decision is ignored.
    pub(crate) fn decide(&self, outcome: Outcome) {
        let held = {
            let mut state = self.state.lock().expect("hold lock poisoned");
            if state.outcome.is_some() {
                return;
            }
            state.outcome = Some(outcome.clone());
            std::mem::take(&mut state.held)
        };
        for report in held {
            forward(report, &outcome);
        }
    }

    /// Where Kafka wrote one of its records it acknowledged, if any: a membership record's
    /// place first, else an entry's.
    pub(crate) fn witness(&self) -> Option<Witness> {
        let state = self.state.lock().expect("hold lock poisoned");
        state
            .witness
            .clone()
            .or_else(|| state.entry_witness.clone())
    }

    /// Reports waiting for the outcome.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.state.lock().expect("hold lock poisoned").held.len()
    }
}

/// Hands `report` to its stream: as it is once committed; once aborted, failed (retriable)
/// unless it failed by itself, when it keeps its own error, since nothing of an aborted
/// transaction is delivered.
fn forward(report: Report, outcome: &Outcome) {
    let Report { receipt, result } = report;
    let result = match (outcome, result) {
        (Outcome::Committed, result) => result,
        (Outcome::Aborted(_), Err(own)) => Err(own),
        (Outcome::Aborted(why), Ok(())) => Err(DeliveryError::Failed(ProduceError::retriable(
            format!("the record's transaction was aborted: {why}"),
        ))),
    };
    // The receipt left its hold when it reported into it: this reaches the stream.
    receipt.report(result);
}

/// Why a send is refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A commit or an abort is under way: offer it again shortly.
    Closed,
    /// The stream had records in an aborted transaction and has not rewound yet.
    Replay,
}

/// The open transaction: its hold, the streams that sent into it, the positions it makes
/// durable; and the streams that must replay before sending again.
#[derive(Debug, Default)]
pub(crate) struct Books {
    hold: Arc<Hold>,
    closed: bool,
    /// Records taken in this transaction.
    records: usize,
    /// Streams that sent records in this transaction.
    sending: HashSet<StreamKey>,
    /// The latest position record of each key handed in this transaction, and its stream.
    marks: HashMap<String, (StreamKey, Record)>,
    /// Streams whose records an abort dropped, until they rewind.
    replaying: HashSet<StreamKey>,
    /// Streams whose last record said the next one goes in the same transaction: it is not
    /// closed before that one is taken (or the pin is older than a commit interval), and since
    /// when the first of them pinned it.
    pinned: HashSet<StreamKey>,
    pinned_at: Option<std::time::Instant>,
    /// A stream rewound with records in the open transaction: it must abort, or they would be
    /// committed and replayed.
    doomed: bool,
    /// The streams of the transaction being committed, and whether one of them rewound since
    /// it closed (then it aborts, if its commit has not begun).
    closing: HashSet<StreamKey>,
    closing_doomed: bool,
}

/// A transaction once closed: what its commit writes and settles.
#[derive(Debug)]
pub(crate) struct Closed {
    pub(crate) hold: Arc<Hold>,
    /// The position records to write before committing.
    pub(crate) positions: Vec<Record>,
    /// Streams that sent records in it.
    pub(crate) streams: HashSet<StreamKey>,
}

impl Books {
    /// Whether a record of `stream` (`None`: a record in no stream's order, such as a
    /// membership tombstone) may be sent now: the hold its receipt goes to, or why not. Nothing
    /// changes until it is [`Books::taken`].
    ///
    /// A replay comes first: from the moment an abort is decided, a stream it dropped records
    /// of sends nothing until it rewound, even while the transaction after it is still being
    /// opened; taken for that one, its newer records would commit ahead of its replay. While a
    /// transaction closes, every record (a pinned stream's second one too) is for the next:
    /// none may join the closing one behind its back.
    pub(crate) fn admit(&self, stream: Option<StreamKey>) -> Result<Arc<Hold>, Refusal> {
        if stream.is_some_and(|s| self.replaying.contains(&s)) {
            return Err(Refusal::Replay);
        }
        if self.closed {
            return Err(Refusal::Closed);
        }
        Ok(self.hold.clone())
    }

    /// The admitted record was taken by the producer; `more`: the stream's next record must go
    /// in the same transaction.
    pub(crate) fn taken(&mut self, stream: Option<StreamKey>, more: bool) {
        self.records += 1;
        let Some(s) = stream else { return };
        self.sending.insert(s);
        if more {
            if self.pinned.is_empty() {
                self.pinned_at = Some(std::time::Instant::now());
            }
            self.pinned.insert(s);
        } else {
            self.pinned.remove(&s);
        }
    }

    /// Whether a stream's pair of records is half taken, for less than `bound`: the
    /// transaction does not close yet. A pin older than that (its stream stopped between the
    /// two) holds it no longer.
    pub(crate) fn is_pinned(&self, bound: std::time::Duration) -> bool {
        !self.pinned.is_empty() && self.pinned_at.is_some_and(|at| at.elapsed() < bound)
    }

    /// Whether a stream of the transaction being committed rewound since it closed.
    pub(crate) fn is_closing_doomed(&self) -> bool {
        self.closing_doomed
    }

    /// Whether the open transaction must abort (see [`Books::rewound`]).
    pub(crate) fn is_doomed(&self) -> bool {
        self.doomed
    }

    /// `stream` handed everything up to the position `record` writes: it commits with the next
    /// transaction that holds no record of the stream's that an abort dropped.
    pub(crate) fn mark(&mut self, stream: StreamKey, record: Record) {
        if self.replaying.contains(&stream) {
            return;
        }
        self.marks.insert(record.key.clone(), (stream, record));
    }

    /// `stream` forgot everything unacknowledged and replays from its checkpoint. Records it
    /// has in the open transaction (it rewound for a cause of its own, not an abort) doom the
    /// transaction: committed, they would be published again by the replay.
    pub(crate) fn rewound(&mut self, stream: StreamKey) {
        self.replaying.remove(&stream);
        self.pinned.remove(&stream);
        self.marks.retain(|_, (s, _)| *s != stream);
        if self.sending.contains(&stream) {
            self.doomed = true;
        }
        if self.closing.contains(&stream) {
            self.closing_doomed = true;
        }
    }

    /// Whether a commit now would write nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.records == 0 && self.marks.is_empty()
    }

    /// Whether a transaction is closing (a commit or an abort under way).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed
    }

    /// Closes the open transaction for its commit: sends are refused until [`Books::open`].
    /// Positions handed meanwhile belong to the next one.
    pub(crate) fn close(&mut self) -> Closed {
        self.closed = true;
        self.records = 0;
        self.doomed = false;
        self.pinned.clear();
        self.pinned_at = None;
        self.closing = std::mem::take(&mut self.sending);
        self.closing_doomed = false;
        Closed {
            hold: std::mem::take(&mut self.hold),
            positions: self.marks.drain().map(|(_, (_, r))| r).collect(),
            streams: self.closing.clone(),
        }
    }

    /// The closed transaction was aborted: its streams replay before sending again, and what
    /// they handed since it closed (positions, records) is dropped from the next one.
    pub(crate) fn aborted(&mut self, streams: &HashSet<StreamKey>) {
        self.marks.retain(|_, (s, _)| !streams.contains(s));
        self.sending.retain(|s| !streams.contains(s));
        self.pinned.retain(|s| !streams.contains(s));
        self.replaying.extend(streams.iter().copied());
    }

    /// The hold of the transaction after the one closing: what a record taken while it closes
    /// reports into.
    pub(crate) fn next_hold(&self) -> Arc<Hold> {
        self.hold.clone()
    }

    /// The open transaction must abort (a record it was to hold was refused).
    pub(crate) fn doom(&mut self) {
        self.doomed = true;
    }

    /// The next transaction began: sends are taken again.
    pub(crate) fn open(&mut self) {
        self.closed = false;
        self.closing.clear();
        self.closing_doomed = false;
    }
}
