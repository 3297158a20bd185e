//! A broker outage is backpressure: with the network to the broker cut for 20 s during churn,
//! nothing is lost, memory stays bounded, and the checkpoint never moves past what Kafka
//! acknowledged.

mod common;

use std::time::Duration;

use common::bed::{assert_covers, Bed, Relay};
use common::broker::OwnBroker;
use common::kafka;
use common::proxy::Proxy;
use watchrelay_sim::ChurnSpec;

const STREAM: &str = "watchNamespacedPods.a";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_outage_loses_nothing_and_never_checkpoints_ahead() {
    let (mut proxy, listener) = Proxy::bind().await;
    let broker = OwnBroker::start_advertising(proxy.port);
    proxy.forward_to(listener, broker.port);
    let mut bed = Bed::new(&["a"]).await;
    bed.bootstrap = format!("127.0.0.1:{}", proxy.port);
    let topic = kafka::unique("outage");
    kafka::create_topics_at(&bed.bootstrap, &[&topic], 3).await;
    let cfg = bed.config(
        &format!("  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: {topic}\n"),
        "  maxInFlightPerStream: 64\n",
    );
    let relay = Relay::start(&bed, cfg);
    relay.wait_up(1).await;
    let before = bed.journal("pods", Some("a")).len();
    let churn = bed.sim.start_churn(ChurnSpec {
        rate_per_sec: 200.0,
        namespaces: vec!["a".into()],
        resources: vec!["pods".into()],
        max_objects_per_kind: 30,
        total_events: None,
    });
    // The cut comes during churn the relay keeps up with.
    bed.wait_pods_relayed(STREAM, "a", before, 200).await;

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
