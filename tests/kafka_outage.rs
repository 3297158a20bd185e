//! A broker outage is backpressure: with the network to the broker cut for 20 s during churn,
//! nothing is lost, memory stays bounded, and the checkpoint never moves past what Kafka
//! acknowledged. With `delivery: exactlyOnce`, neither a cut past the transaction timeout nor
//! requests held past their timeouts show a `read_committed` consumer a change twice.

mod common;

use std::time::Duration;

use common::bed::{assert_covers, assert_once, Bed, Relay};
use common::broker::{Options, OwnBroker};
use common::kafka;
use common::proxy::{Hold, Proxy, Wire};
use watchrelay_sim::ChurnSpec;

const STREAM: &str = "watchNamespacedPods.a";

/// A relay of pods in `a` to a topic of its own (named after `prefix`), with `kafka` added to
/// its Kafka settings, on a broker of its own (`broker_extra` in its settings) behind a proxy
/// the test cuts, relaying churn of 200 changes a second (see [`churn_rate`]).
struct Cut {
    proxy: Proxy,
    broker: OwnBroker,
    bed: Bed,
    topic: String,
    relay: Relay,
    churn: watchrelay_sim::ChurnHandle,
}

impl Cut {
    async fn churning(broker_extra: Vec<String>, prefix: &str, kafka: &str) -> Self {
        let (mut proxy, listener) = Proxy::bind().await;
        let broker = OwnBroker::start(Options {
            advertised: Some(proxy.port),
            extra: broker_extra,
            ..Options::default()
        });
        proxy.forward_to(listener, broker.port, Wire::Kafka);
        // The API server's history as long as any replay needs (50 s of churn), and no longer:
        // a run with a thousand held requests lasts most of an hour.
        let sim = watchrelay_sim::SimConfig {
            history_limit: 10_000,
            ..Default::default()
        };
        let mut bed = Bed::with(sim, &["a"]).await;
        bed.bootstrap = format!("127.0.0.1:{}", proxy.port);
        let topic = kafka::unique(prefix);
        kafka::create_topics_at(&bed.bootstrap, &[&topic], 3).await;
        let cfg = bed.config(
            &format!(
                "  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: {topic}\n"
            ),
            kafka,
        );
        let relay = Relay::start(&bed, cfg);
        relay.wait_up(1).await;
        let before = bed.journal("pods", Some("a")).len();
        let churn = bed.sim.start_churn(ChurnSpec {
            rate_per_sec: churn_rate(),
            namespaces: vec!["a".into()],
            resources: vec!["pods".into()],
            max_objects_per_kind: 30,
            total_events: None,
        });
        // The cut comes during churn the relay keeps up with.
        bed.wait_pods_relayed(STREAM, "a", before, 200).await;
        Self {
            proxy,
            broker,
            bed,
            topic,
            relay,
            churn,
        }
    }

    /// Stops the churn, then the relay: a `read_committed` consumer finds every change once,
    /// in order. How many changes there were, and the transactions aborted.
    async fn every_change_once(self) -> (usize, u64) {
        self.churn.stop().await;
        let expected = self.bed.journal("pods", Some("a"));
        let msgs = self.bed.read_covering(&self.topic, &expected).await;
        assert_covers(&msgs, &expected);
        assert_once(&msgs);
        let aborted = transactions(&self.relay, "aborted");
        self.relay.stop().await;
        (expected.len(), aborted)
    }
}

/// Changes a second the churn makes: 200, or `WATCHRELAY_CHURN_RATE` (a long run of held
/// requests, in which the relay publishes more slowly than at 200 a second, takes fewer).
fn churn_rate() -> f64 {
    std::env::var("WATCHRELAY_CHURN_RATE")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(200.0)
}

/// The transactions of `relay` that ended with `outcome`.
fn transactions(relay: &Relay, outcome: &str) -> u64 {
    relay
        .metrics
        .transactions
        .with_label_values(&[outcome])
        .get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_outage_loses_nothing_and_never_checkpoints_ahead() {
    let Cut {
        proxy,
        broker: _broker,
        bed,
        topic,
        relay,
        churn,
    } = Cut::churning(Vec::new(), "outage", "  maxInFlightPerStream: 64\n").await;

    proxy.cut();
    // From the cut on the checkpoint may not pass this: Kafka can acknowledge only what was sent
    // before the cut, changes older than this read. So it is checked at once, with no pause.
    let rv_at_kill = bed.sim.current_rv();
    let mut max_in_flight = 0;
    // 20 s without a network path to the broker: the outage's length is the test's, so this
    // loop lets that time pass, checking every 100 ms.
    for _ in 0..200 {
        let cp = bed.checkpoint_rv(STREAM).unwrap_or(0);
        assert!(
            cp <= rv_at_kill,
            "checkpoint {cp} moved past {rv_at_kill}, the last change before the network was cut"
        );
        max_in_flight = max_in_flight.max(relay.counter("in_flight", STREAM));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        bed.sim.current_rv() > rv_at_kill + 200,
        "churn went on during the outage"
    );
    assert!(
        max_in_flight <= 64,
        "in-flight records grew to {max_in_flight}, past the bound"
    );
    assert!(max_in_flight > 0, "nothing was waiting for the broker");

    proxy.restore();
    // Churn goes on until the relay delivers again: its checkpoint moves past the cut.
    bed.wait_checkpoint_past(STREAM, rv_at_kill).await;
    churn.stop().await;
    let expected = bed.journal("pods", Some("a"));
    let msgs = bed.read_covering(&topic, &expected).await;
    assert_covers(&msgs, &expected);
    bed.wait_checkpoint_current(STREAM).await;
    relay.stop().await;
}

/// With `delivery: exactlyOnce`, a cut between the relay and the broker that outlasts the
/// transaction timeout: the coordinator aborts the open transaction, the relay's commit fails,
/// it builds its producer again (a new epoch) and reads the outcome back, its stream replays
/// from the committed position, and a `read_committed` consumer reads every change once, in
/// order (it once caught a replaying stream's newer records committed ahead of its replay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_through_a_cut_past_the_transaction_timeout() {
    // The coordinator looks for timed-out transactions every second, not every 10 s.
    let every_second = "transaction.abort.timed.out.transaction.cleanup.interval.ms=1000";
    let cut = Cut::churning(
        vec![every_second.into()],
        "eos-cut",
        "    transaction.timeout.ms: \"3000\"\n  delivery: exactlyOnce\n",
    )
    .await;
    // A cut just after a commit's request left lets that commit complete, and holds no open
    // transaction: cut again until one is aborted (the first cut nearly always does).
    for _ in 0..3 {
        cut.proxy.cut();
        let rv_at_cut = cut.bed.sim.current_rv();
        // Past the transaction timeout and the coordinator's look for it: the cut's length is
        // the test's.
        tokio::time::sleep(Duration::from_secs(7)).await;
        cut.proxy.restore();
        cut.bed.wait_checkpoint_past(STREAM, rv_at_cut).await;
        if transactions(&cut.relay, "aborted") > 0 {
            break;
        }
    }
    let (changes, aborted) = cut.every_change_once().await;
    assert!(aborted > 0, "a cut aborted a transaction");
    eprintln!("{changes} changes, each once; {aborted} transactions aborted");
}

/// With `delivery: exactlyOnce`, Produce and EndTxn requests held past the client's timeouts
/// (`WATCHRELAY_TXN_TIMEOUTS` of them, 20 by default), each reaching the broker late, after the
/// client gave up on it: a Produce timed out makes its transaction abortable, an EndTxn timed
/// out leaves a commit's outcome unknown. Either way the producer is built again under a new
/// epoch (the late request is fenced), the outcome is read back, and an aborted transaction's
/// stream replays from its committed position. A `read_committed` consumer reads every change
/// once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_through_requests_held_past_their_timeouts() {
    const PRODUCE: i16 = 0;
    const END_TXN: i16 = 26;
    let timeouts: u64 = std::env::var("WATCHRELAY_TXN_TIMEOUTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20);
    let cut = Cut::churning(
        Vec::new(),
        "eos-timeouts",
        "    request.timeout.ms: \"400\"\n    socket.timeout.ms: \"400\"\n  delivery: exactlyOnce\n  commitIntervalMs: 50\n",
    )
    .await;
    // Held past the 400 ms the client waits, and past the next of its once-a-second looks
    // for requests that timed out; then half a second for the relay to get a transaction
    // through, or the history it must replay would outrun the API server's.
    cut.proxy.hold(Hold::new(
        &[PRODUCE, END_TXN],
        4,
        Duration::from_millis(1600),
        Duration::from_millis(500),
        timeouts,
    ));
    let rv_at_start = cut.bed.sim.current_rv();
    // Each hold costs its delay and the gap after it: the wait is bounded by the count.
    for _ in 0..timeouts * 50 {
        if cut.proxy.held() >= timeouts {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(cut.proxy.held(), timeouts, "every request to hold was held");
    cut.bed.wait_checkpoint_past(STREAM, rv_at_start).await;
    let committed = transactions(&cut.relay, "committed");
    let (changes, aborted) = cut.every_change_once().await;
    eprintln!(
        "{changes} changes, each once; {timeouts} requests held past their timeouts; transactions: {committed} committed, {aborted} aborted"
    );
    assert!(aborted > 0, "a held request aborted a transaction");
}
