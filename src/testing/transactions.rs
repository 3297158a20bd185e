//! Kafka's transactions in memory, for tests of `delivery: exactlyOnce` over a [`Memory`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Memory;
use crate::producer::{
    Client, Connect, DeliveryError, FlushError, ProduceError, Producer, Receipt, Record, Refused,
    TxnError, TxnSource, Unread, Witness,
};

/// How long a commit waits for its records' acknowledgements before its transaction fails.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(1);
/// How often a commit looks whether its records were acknowledged.
const COMMIT_POLL: Duration = Duration::from_millis(10);

/// Transactions over a shared [`Memory`], as a transaction coordinator keeps them: each
/// transactional id has an epoch, raised by every new instance's `init_transactions` (which
/// aborts what the id left open and fences the older instances: their calls fail fatally, their
/// sends are refused). A transaction's records reach the memory's log (readable) only when it
/// commits, each at the place in the send order it was given when sent, as a `read_committed`
/// reader finds records at their offsets; aborted, they never do. A record's place is its
/// offset, where a relay reads whether its transaction committed.
///
/// Faults: [`Transactions::hold_to`] leaves records unacknowledged (a stalled partition), so a
/// commit waits for them and, past its timeout, fails, its transaction aborted;
/// [`Transactions::away`] takes the brokers away (a restart);
/// [`Transactions::lose_commit_answers`] loses commits' answers, so the relay must learn their
/// outcome (they alternate: committed, then not); [`Transactions::deny`] refuses the relay's
/// principal transactional ids (a missing ACL).
pub struct Transactions {
    memory: Arc<Memory>,
    state: Mutex<State>,
    /// Each producer's queue bound, in bytes ([`Connect::queue_bytes`]).
    queue_bytes: std::sync::atomic::AtomicUsize,
}

#[derive(Default)]
struct State {
    epochs: HashMap<String, u64>,
    /// The open transaction of each id.
    open: HashMap<String, Open>,
    /// Whether the transaction of the record at each place committed, once settled.
    settled: HashMap<u64, bool>,
    hold_topic: Option<String>,
    /// The brokers are away: nothing is acknowledged, no instance initialized, no outcome read.
    away: bool,
    lost_answers: usize,
    lost_so_far: u64,
    /// Transactional ids refused to the relay's principal: those starting with the text, or
    /// with `true` that one alone.
    denied: Option<(String, bool)>,
}

/// An open transaction: its epoch, the records acknowledged in it and those not yet, and
/// whether one of its records was purged (it can only abort).
#[derive(Default)]
struct Open {
    epoch: u64,
    records: Vec<(u64, Record)>,
    unacked: Vec<(u64, Record, Box<Receipt>)>,
    doomed: bool,
}

impl Transactions {
    /// Transactions whose committed records go to `memory`'s log.
    pub fn new(memory: Arc<Memory>) -> Arc<Self> {
        Arc::new(Self {
            memory,
            state: Mutex::default(),
            queue_bytes: std::sync::atomic::AtomicUsize::new(usize::MAX),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("transactions lock poisoned")
    }

    /// Where a relay's terms connect their transactional producers
    /// ([`crate::Relay::with_transactions`]).
    pub fn source(self: &Arc<Self>) -> TxnSource {
        let store = self.clone();
        TxnSource(Arc::new(move |id: &str| {
            Arc::new(Connection {
                store: store.clone(),
                id: id.to_string(),
            }) as Arc<dyn Connect>
        }))
    }

    /// Bounds each producer's queue to `bytes` (unbounded by default).
    pub fn bound_queue(&self, bytes: usize) {
        self.queue_bytes.store(bytes, Ordering::Relaxed);
    }

    fn queue_bytes(&self) -> usize {
        self.queue_bytes.load(Ordering::Relaxed)
    }

    /// Leaves the records of topics starting with `prefix` unacknowledged (`None`: stops, and
    /// acknowledges those held, as a partition that comes back).
    pub fn hold_to(&self, prefix: Option<&str>) {
        let away = {
            let mut s = self.state();
            s.hold_topic = prefix.map(str::to_string);
            s.away
        };
        if prefix.is_none() && !away {
            self.acknowledge_held();
        }
    }

    /// Takes the brokers away (`true`): records stay unacknowledged, commits fail past their
    /// timeout, new instances cannot initialize and outcomes cannot be read; or brings them back,
    /// acknowledging what was held (as a producer's queue drains into a broker that restarted).
    pub fn away(&self, away: bool) {
        self.state().away = away;
        if !away {
            self.acknowledge_held();
        }
    }

    /// Refuses new instances of the transactional ids starting with `prefix` as an
    /// authorization failure would (`None`: grants them again).
    pub fn deny(&self, prefix: Option<&str>) {
        self.state().denied = prefix.map(|p| (p.to_string(), false));
    }

    /// Refuses transactional id `id` alone (see [`Transactions::deny`]).
    pub fn deny_id(&self, id: &str) {
        self.state().denied = Some((id.to_string(), true));
    }

    /// Loses the answers of the next `n` commits: the first lost one was committed, the next
    /// not, and so on.
    pub fn lose_commit_answers(&self, n: usize) {
        self.state().lost_answers = n;
    }

    /// Transactions settled so far: (committed, aborted), counted by their records.
    pub fn settled_records(&self) -> (usize, usize) {
        let s = self.state();
        let committed = s.settled.values().filter(|c| **c).count();
        (committed, s.settled.len() - committed)
    }

    fn acknowledge_held(&self) {
        let mut acknowledged = Vec::new();
        {
            let mut s = self.state();
            for open in s.open.values_mut() {
                for (place, record, receipt) in std::mem::take(&mut open.unacked) {
                    open.records.push((place, record.clone()));
                    acknowledged.push((place, record, receipt));
                }
            }
        }
        for (place, record, receipt) in acknowledged {
            acknowledge(place, &record, receipt);
        }
    }

    /// Settles `open` as `committed` (its records delivered) or aborted; returns the receipts of
    /// its unacknowledged records, to be reported failed.
    #[allow(
        clippy::vec_box,
        reason = "receipts travel boxed, as librdkafka's opaques"
    )]
    fn settle(&self, s: &mut State, open: Open, committed: bool) -> Vec<Box<Receipt>> {
        for (place, _) in &open.records {
            s.settled.insert(*place, committed);
        }
        for (place, _, _) in &open.unacked {
            s.settled.insert(*place, false);
        }
        if committed {
            self.memory.deliver(open.records);
        }
        open.unacked.into_iter().map(|(_, _, r)| r).collect()
    }
}

/// Reports `receipt`'s record acknowledged at `place`.
fn acknowledge(place: u64, record: &Record, receipt: Box<Receipt>) {
    let partition = record.partition.unwrap_or(0);
    receipt.witnessed(
        &record.topic,
        partition,
        i64::try_from(place).unwrap_or(i64::MAX),
    );
    receipt.report(Ok(()));
}

/// Reports each of `receipts` failed with `why`.
#[allow(
    clippy::vec_box,
    reason = "receipts travel boxed, as librdkafka's opaques"
)]
fn failed(receipts: Vec<Box<Receipt>>, why: &str) {
    for receipt in receipts {
        receipt.report(Err(DeliveryError::Failed(ProduceError::retriable(why))));
    }
}

fn fenced_error() -> TxnError {
    TxnError {
        fatal: true,
        ..TxnError::abortable("fenced: a newer producer with the same transactional id")
    }
}

/// One transactional id's connection to the [`Transactions`].
struct Connection {
    store: Arc<Transactions>,
    id: String,
}

impl Connect for Connection {
    fn client(&self) -> Result<Arc<dyn Client>, String> {
        Ok(Arc::new(Instance {
            store: self.store.clone(),
            id: self.id.clone(),
            epoch: AtomicU64::new(0),
        }))
    }

    fn committed_at(&self, w: &Witness, _timeout: Duration) -> Result<bool, Unread> {
        let place = u64::try_from(w.offset).unwrap_or(u64::MAX);
        let s = self.store.state();
        if s.away {
            return Err(Unread {
                message: "no broker answers".into(),
                fatal: false,
            });
        }
        match s.settled.get(&place) {
            Some(committed) => Ok(*committed),
            None => Err(Unread {
                message: format!("the transaction of the record at {place} is still open"),
                fatal: false,
            }),
        }
    }

    fn commit_timeout(&self) -> Duration {
        COMMIT_TIMEOUT
    }

    fn queue_bytes(&self) -> usize {
        self.store.queue_bytes()
    }
}

/// One instance (an epoch) under a transactional id.
struct Instance {
    store: Arc<Transactions>,
    id: String,
    /// 0 until initialized.
    epoch: AtomicU64,
}

impl Instance {
    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    fn fenced(&self, s: &State) -> bool {
        s.epochs.get(&self.id).copied() != Some(self.epoch())
    }

    /// The open transaction, settled as `committed` (or aborted), if it is this instance's.
    fn end(&self, committed: bool, why: &str) -> Result<(), TxnError> {
        let unacked = {
            let mut s = self.store.state();
            if self.fenced(&s) {
                return Err(fenced_error());
            }
            match s.open.remove(&self.id) {
                Some(open) => self.store.settle(&mut s, open, committed),
                None => Vec::new(),
            }
        };
        failed(unacked, why);
        Ok(())
    }
}

impl Client for Instance {
    fn init_transactions(&self, _timeout: Duration) -> Result<(), TxnError> {
        let unacked = {
            let mut s = self.store.state();
            if s.away {
                return Err(TxnError::abortable(
                    "the transaction coordinator is not available",
                ));
            }
            let refused = |(p, alone): &(String, bool)| {
                if *alone {
                    self.id == *p
                } else {
                    self.id.starts_with(p.as_str())
                }
            };
            if s.denied.as_ref().is_some_and(refused) {
                return Err(TxnError::denied(
                    "Broker: Transactional Id authorization failed",
                ));
            }
            let epoch = s.epochs.get(&self.id).copied().unwrap_or(0) + 1;
            s.epochs.insert(self.id.clone(), epoch);
            self.epoch.store(epoch, Ordering::SeqCst);
            match s.open.remove(&self.id) {
                Some(open) => self.store.settle(&mut s, open, false),
                None => Vec::new(),
            }
        };
        failed(
            unacked,
            "fenced: a newer producer with the same transactional id",
        );
        Ok(())
    }

    fn begin_transaction(&self) -> Result<(), TxnError> {
        if self.fenced(&self.store.state()) {
            return Err(fenced_error());
        }
        Ok(())
    }

    fn commit_transaction(&self, timeout: Duration) -> Result<(), TxnError> {
        let until = Instant::now() + timeout.min(COMMIT_TIMEOUT);
        loop {
            let (waiting, doomed) = {
                let s = self.store.state();
                if self.fenced(&s) {
                    return Err(fenced_error());
                }
                s.open
                    .get(&self.id)
                    .map_or((0, false), |o| (o.unacked.len(), o.doomed))
            };
            if doomed {
                self.end(false, "a record was purged")?;
                return Err(TxnError::abortable(
                    "a record of the transaction was purged",
                ));
            }
            if waiting == 0 {
                break;
            }
            if Instant::now() >= until {
                let why = format!("{waiting} message(s) timed out");
                self.end(false, &why)?;
                return Err(TxnError::abortable(&why));
            }
            std::thread::sleep(COMMIT_POLL);
        }
        let lost = {
            let mut s = self.store.state();
            (s.lost_answers > 0).then(|| {
                s.lost_answers -= 1;
                s.lost_so_far += 1;
                s.lost_so_far % 2 == 1
            })
        };
        match lost {
            None => self.end(true, ""),
            Some(committed) => {
                self.end(committed, "the commit's answer was lost")?;
                Err(TxnError::abortable("the commit's answer was lost"))
            }
        }
    }

    fn abort_transaction(&self, _timeout: Duration) -> Result<(), TxnError> {
        self.end(false, "the transaction was aborted")
    }
}

impl Producer for Instance {
    fn send(&self, record: &Record, receipt: Box<Receipt>) -> Result<(), Refused> {
        let place = self.store.memory.next_place();
        {
            let mut s = self.store.state();
            if self.fenced(&s) {
                return Err(Refused::Failed(ProduceError::retriable(
                    "fenced: a newer producer with the same transactional id",
                )));
            }
            let held = s.away
                || s.hold_topic
                    .as_ref()
                    .is_some_and(|p| record.topic.starts_with(p.as_str()));
            let epoch = self.epoch();
            let open = s.open.entry(self.id.clone()).or_insert_with(|| Open {
                epoch,
                ..Open::default()
            });
            debug_assert_eq!(open.epoch, epoch);
            if held {
                open.unacked.push((place, record.clone(), receipt));
                return Ok(());
            }
            open.records.push((place, record.clone()));
        }
        acknowledge(place, record, receipt);
        Ok(())
    }

    fn flush(&self, _timeout: Duration) -> Result<(), FlushError> {
        let s = self.store.state();
        match s.open.get(&self.id).map_or(0, |o| o.unacked.len()) {
            0 => Ok(()),
            pending => Err(FlushError::Undelivered { pending }),
        }
    }

    fn purge(&self) {
        let purged = {
            let mut s = self.store.state();
            if self.fenced(&s) {
                return;
            }
            // Purged, never acknowledged: the transaction cannot commit without them.
            match s.open.get_mut(&self.id) {
                Some(open) if !open.unacked.is_empty() => {
                    open.doomed = true;
                    std::mem::take(&mut open.unacked)
                }
                _ => Vec::new(),
            }
        };
        failed(
            purged.into_iter().map(|(_, _, r)| r).collect(),
            "purged from the queue",
        );
    }
}
