//! The books of a transactional producer, as a table of what each step does to sends,
//! positions and reports.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::books::{Books, Hold, Outcome, Refusal};
use crate::producer::{Holds, Inbox, Receipt, Record, Report, Sent, StreamKey};

fn position(stream: &str, rv: &str) -> Record {
    Record {
        topic: "members".into(),
        key: format!("o/~/pos:{stream}"),
        value: rv.as_bytes().to_vec(),
        headers: Default::default(),
        tombstone: false,
        partition: None,
    }
}

/// A send of a record of `stream` that the producer takes: admitted, then taken.
fn take(books: &mut Books, stream: Option<StreamKey>, more: bool) -> Result<Arc<Hold>, Refusal> {
    let hold = books.admit(stream)?;
    books.taken(stream, more);
    Ok(hold)
}

/// A report of entry `seq` into `inbox`, through `hold`.
fn report_through(hold: &Hold, inbox: &Arc<Inbox>, seq: u64) {
    hold.report(Report {
        receipt: Receipt::new(inbox.clone(), seq, Sent::Join),
        result: Ok(()),
    });
}

/// The reports ready in `inbox`, taken without waiting: (seq, delivered).
fn ready(inbox: &Arc<Inbox>) -> Vec<(u64, bool)> {
    let mut out = std::collections::VecDeque::new();
    {
        let fut = inbox.take(&mut out);
        tokio::pin!(fut);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let _ = std::future::Future::poll(fut, &mut cx);
    }
    out.into_iter()
        .map(|r| (r.receipt.seq, r.result.is_ok()))
        .collect()
}

/// The keys and values of position records, to compare.
fn written(records: Vec<Record>) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = records.into_iter().map(|r| (r.key, r.value)).collect();
    out.sort();
    out
}

#[test]
fn reports_wait_for_the_outcome_and_come_back_as_it_says() {
    let inbox = Inbox::new();
    // (outcome, what the stream gets)
    let rows = [
        (Outcome::Committed, vec![(1, true), (2, true), (3, true)]),
        (
            Outcome::Aborted("timed out".into()),
            vec![(1, false), (2, false), (3, false)],
        ),
    ];
    for (outcome, expected) in rows {
        let hold = Hold::default();
        report_through(&hold, &inbox, 1);
        report_through(&hold, &inbox, 2);
        assert_eq!(hold.held(), 2);
        assert!(ready(&inbox).is_empty(), "nothing before the outcome");
        hold.decide(outcome.clone());
        // A report that comes after the outcome follows it at once.
        report_through(&hold, &inbox, 3);
        assert_eq!(ready(&inbox), expected, "{outcome:?}");
        // A second decision changes nothing.
        hold.decide(Outcome::Committed);
        assert_eq!(hold.held(), 0);
    }
}

#[test]
fn an_acknowledged_entry_awaiting_its_commit_is_counted_apart_until_the_outcome() {
    let inbox = Inbox::new();
    let hold = Arc::new(Hold::default());
    let entry = |seq| {
        let mut r = Receipt::new(
            inbox.clone(),
            seq,
            Sent::Entry {
                arrived: std::time::Instant::now(),
                bytes: 10,
                alone: false,
            },
        );
        r.hold = Some(hold.clone());
        r
    };
    entry(1).report(Ok(()));
    entry(2).report(Ok(()));
    // A join's report is held too, but it is no entry of the stream's in-flight bound.
    let mut join = Receipt::new(inbox.clone(), 7, Sent::Join);
    join.hold = Some(hold.clone());
    join.report(Ok(()));
    assert_eq!(inbox.awaiting(), 2);
    {
        // Each hold woke whoever waits for room.
        let fut = inbox.held_more();
        tokio::pin!(fut);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(std::future::Future::poll(fut, &mut cx).is_ready());
    }
    hold.decide(Outcome::Committed);
    assert_eq!(inbox.awaiting(), 0, "forwarded");
    assert_eq!(ready(&inbox), [(1, true), (2, true), (7, true)]);
}

#[test]
fn a_closed_transaction_takes_nothing_until_the_next_one_opens() {
    let mut books = Books::default();
    assert!(books.is_empty());
    let first = take(&mut books, Some(1), false).expect("open");
    books.mark(1, position("a", "5"));
    assert!(!books.is_empty());
    let closed = books.close();
    assert!(Arc::ptr_eq(&closed.hold, &first));
    assert_eq!(closed.positions.len(), 1);
    assert_eq!(closed.streams, HashSet::from([1]));
    assert_eq!(
        take(&mut books, Some(1), false).err(),
        Some(Refusal::Closed)
    );
    // A position handed while it closes belongs to the next transaction.
    books.mark(2, position("b", "7"));
    books.open();
    let second = take(&mut books, Some(1), false).expect("open again");
    assert!(!Arc::ptr_eq(&first, &second), "a new hold");
    let next = books.close();
    assert_eq!(written(next.positions), written(vec![position("b", "7")]));
}

#[test]
fn only_the_latest_position_of_a_stream_is_written() {
    let mut books = Books::default();
    books.mark(1, position("a", "5"));
    books.mark(1, position("a", "6"));
    books.mark(2, position("b", "1"));
    let values: Vec<Vec<u8>> = written(books.close().positions)
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(
        values,
        vec![b"6".to_vec(), b"1".to_vec()],
        "by key: a, then b"
    );
}

#[test]
fn after_an_abort_its_streams_send_and_position_nothing_until_they_rewound() {
    let mut books = Books::default();
    take(&mut books, Some(1), false).expect("open");
    take(&mut books, Some(2), false).expect("open");
    let closed = books.close();
    // While it closed: stream 1 handed a position (after its aborted records), stream 3 too.
    books.mark(1, position("a", "9"));
    books.mark(3, position("c", "4"));
    books.aborted(&closed.streams);
    books.open();
    // (stream, send, position kept)
    let rows = [
        (1, Err(Refusal::Replay)),
        (2, Err(Refusal::Replay)),
        (3, Ok(())),
    ];
    for (stream, expected) in rows {
        assert_eq!(
            take(&mut books, Some(stream), false).map(|_| ()),
            expected,
            "stream {stream}"
        );
    }
    books.mark(2, position("b", "8"));
    let next = books.close();
    assert_eq!(
        written(next.positions),
        written(vec![position("c", "4")]),
        "the aborted streams' positions are dropped"
    );
    books.open();
    books.rewound(1);
    assert!(
        take(&mut books, Some(1), false).is_ok(),
        "a stream that rewound sends again"
    );
    assert_eq!(
        take(&mut books, Some(2), false).err(),
        Some(Refusal::Replay)
    );
    books.mark(1, position("a", "2"));
    assert_eq!(
        written(books.close().positions),
        written(vec![position("a", "2")])
    );
}

#[test]
fn a_pair_of_records_is_never_split_between_two_transactions() {
    let mut books = Books::default();
    // A DELETED, its tombstone to follow.
    take(&mut books, Some(1), true).expect("open");
    assert!(
        books.is_pinned(Duration::from_secs(1)),
        "the committer waits"
    );
    assert!(
        !books.is_pinned(Duration::ZERO),
        "a pin older than a commit interval holds no longer"
    );
    take(&mut books, Some(2), false).expect("open");
    take(&mut books, Some(1), false).expect("the tombstone");
    assert!(!books.is_pinned(Duration::from_secs(1)));
    let closed = books.close();
    assert_eq!(closed.streams, HashSet::from([1, 2]));
    // While closed, every record is for the next transaction, a pinned stream's second too:
    // none joins the closing one.
    assert_eq!(take(&mut books, Some(1), true).err(), Some(Refusal::Closed));
    books.taken(Some(1), true);
    assert_eq!(
        books.admit(Some(1)).err(),
        Some(Refusal::Closed),
        "the tombstone follows its DELETED into the next transaction"
    );
}

#[test]
fn once_an_abort_is_decided_its_streams_send_nothing_while_the_next_transaction_opens() {
    let mut books = Books::default();
    take(&mut books, Some(1), false).expect("open");
    let closed = books.close();
    books.aborted(&closed.streams);
    // Still closed: the new producer's transaction is being opened, what was taken meanwhile
    // sent into it. A newer record of stream 1 taken now would commit before its replay.
    assert_eq!(books.admit(Some(1)).err(), Some(Refusal::Replay));
    assert_eq!(
        books.admit(Some(2)).err(),
        Some(Refusal::Closed),
        "another stream's is for the next transaction"
    );
    books.open();
    assert_eq!(books.admit(Some(1)).err(), Some(Refusal::Replay));
    books.rewound(1);
    assert!(books.admit(Some(1)).is_ok(), "once it rewound");
}

#[test]
fn records_in_no_streams_order_are_never_kept_out() {
    let mut books = Books::default();
    take(&mut books, None, false).expect("open");
    take(&mut books, Some(1), false).expect("open");
    let closed = books.close();
    assert_eq!(
        closed.streams,
        HashSet::from([1]),
        "only ordered records count"
    );
    books.aborted(&closed.streams);
    books.open();
    assert!(
        take(&mut books, None, false).is_ok(),
        "a membership tombstone, a mark"
    );
    assert_eq!(
        take(&mut books, Some(1), false).err(),
        Some(Refusal::Replay)
    );
}

#[test]
fn a_stream_that_rewinds_with_records_in_the_open_transaction_dooms_it() {
    // (records of the stream in the open transaction, doomed)
    for (sent, doomed) in [(true, true), (false, false)] {
        let mut books = Books::default();
        take(&mut books, Some(2), false).expect("open");
        if sent {
            take(&mut books, Some(1), false).expect("open");
        }
        books.mark(1, position("a", "3"));
        books.rewound(1);
        assert_eq!(books.is_doomed(), doomed, "sent: {sent}");
        assert!(
            books.close().positions.is_empty(),
            "a rewound stream's positions go"
        );
        assert!(!books.is_doomed(), "the next transaction starts clean");
    }
}

#[test]
fn a_record_the_producer_did_not_take_changes_nothing() {
    let mut books = Books::default();
    books.admit(Some(1)).expect("open");
    assert!(books.is_empty(), "admitted, not taken");
    books.rewound(1);
    assert!(
        !books.is_doomed(),
        "nothing of the stream is in the transaction"
    );
}

#[test]
fn a_stream_that_rewinds_while_its_transaction_closes_dooms_it() {
    let mut books = Books::default();
    take(&mut books, Some(1), false).expect("open");
    let _closed = books.close();
    assert!(!books.is_closing_doomed());
    books.rewound(1);
    assert!(books.is_closing_doomed(), "aborted instead of committed");
    books.open();
    assert!(!books.is_closing_doomed(), "the next one starts clean");
}

#[test]
fn what_a_closing_transaction_takes_belongs_to_the_next_and_an_abort_drops_its_streams_share() {
    let mut books = Books::default();
    take(&mut books, Some(1), false).expect("open");
    let closed = books.close();
    // While it closes: streams 1 and 2 hand records over, for the next transaction.
    let next = books.next_hold();
    assert!(!Arc::ptr_eq(&next, &closed.hold));
    books.taken(Some(1), false);
    books.taken(Some(2), false);
    books.aborted(&closed.streams);
    books.open();
    books.rewound(1);
    assert!(
        !books.is_doomed(),
        "stream 1's records taken while it closed were dropped with the abort"
    );
    books.rewound(2);
    assert!(books.is_doomed(), "stream 2's are in the next transaction");
}

/// While a transaction commits, what the streams hand over waits for the next one, up to the
/// producer's queue bound: past it, a send is refused as by a full queue (its stream offers it
/// again), so a commit that hangs holds at most that much in memory. Once the next transaction
/// opened, the waiting records are sent and sends are taken again.
#[tokio::test]
async fn records_waiting_for_the_next_transaction_are_bounded_by_the_queue() {
    use crate::producer::{Producer, Refused};
    use crate::testing::{Memory, Transactions};

    let store = Transactions::new(Arc::new(Memory::new()));
    let record = |key: &str| Record {
        topic: "t".into(),
        key: key.into(),
        value: vec![b'x'; 1000],
        headers: Default::default(),
        tombstone: false,
        partition: None,
    };
    // Room for two records waiting, not three.
    store.bound_queue(2 * record("k1").size() + 10);
    store.hold_to(Some("t"));
    let connect = (store.source().0)("txn");
    let metrics = super::TxnMetrics {
        commits: prometheus::IntCounter::new("c", "c").unwrap(),
        aborts: prometheus::IntCounter::new("a", "a").unwrap(),
        commit_seconds: prometheus::Histogram::with_opts(prometheus::HistogramOpts::new("s", "s"))
            .unwrap(),
    };
    let txn = super::Transactional::start_with(
        connect,
        Duration::from_millis(5),
        tokio_util::sync::CancellationToken::new(),
        Arc::new(|| true),
        metrics,
    )
    .await
    .expect("starts");
    let inbox = Inbox::new();
    let receipt = |seq| {
        let sent = Sent::Entry {
            arrived: std::time::Instant::now(),
            bytes: 1000,
            alone: false,
        };
        Receipt::new(inbox.clone(), seq, sent)
    };
    txn.send(&record("k1"), receipt(1))
        .expect("the open transaction takes it");
    // Its commit waits for the held record's acknowledgement.
    while !txn.inside.lock().unwrap().books.is_closed() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    txn.send(&record("k2"), receipt(2))
        .expect("waits for the next");
    txn.send(&record("k3"), receipt(3))
        .expect("waits for the next");
    match txn.send(&record("k4"), receipt(4)) {
        Err(Refused::Full(back)) => assert_eq!(back.seq, 4),
        other => panic!("a third waiting record is refused as full, got {other:?}"),
    }
    assert_eq!(txn.inside.lock().unwrap().pending.len(), 2);
    // The commit ends, the next transaction opens with the waiting records in it.
    store.hold_to(None);
    while txn.inside.lock().unwrap().books.is_closed() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let inside = txn.inside.lock().unwrap();
    assert!(inside.pending.is_empty());
    assert_eq!(inside.pending_bytes, 0);
    drop(inside);
    txn.send(&record("k4"), receipt(4)).expect("taken again");
}
