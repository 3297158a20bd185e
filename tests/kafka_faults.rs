//! Bad input and failing dependencies: each is counted, none loses data or stops other streams.

mod common;

use common::bed::{assert_covers, eventually, Bed, Relay};
use common::kafka;
use watchrelay_sim::{objects, Fault};

fn create_pods(bed: &Bed, ns: &str, prefix: &str, n: usize) {
    for i in 0..n {
        bed.sim
            .create("pods", Some(ns), objects::pod(ns, &format!("{prefix}-{i}")))
            .unwrap();
    }
}

/// Waits until every armed request failure has been served (to the stream or to a checkpoint
/// write; either must be survived).
async fn wait_failures_served(bed: &Bed) {
    eventually(
        || bed.sim.pending_failures() == 0,
        || "armed failures were never requested".into(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_lines_garbage_and_server_errors_lose_nothing() {
    let bed = Bed::new(&["a"]).await;
    let topic = kafka::unique("faults");
    kafka::create_topics(&[&topic], 3).await;
    let relay = Relay::start(
        &bed,
        bed.config(
            &format!(
                "  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: {topic}\n"
            ),
            "",
        ),
    );
    relay.wait_up(1).await;
    create_pods(&bed, "a", "ok", 5);

    // Each fault is armed only after the previous one has played out: armed together, a cut
    // connection could swallow the malformed line that was queued just before it.
    let s = "watchNamespacedPods.a";
    bed.sim.cut_next_watch_line();
    create_pods(&bed, "a", "cut", 5);
    relay.wait_counter("watch_restarts_total", s, 1).await;
    bed.sim.inject_malformed_line();
    create_pods(&bed, "a", "garbage", 5);
    relay.wait_counter("malformed_lines_total", s, 1).await;
    bed.sim.fail_next(3, Fault::ServerError);
    bed.sim.drop_watches();
    create_pods(&bed, "a", "errors", 5);
    wait_failures_served(&bed).await;
    bed.sim.fail_next(
        2,
        Fault::TooManyRequests {
            retry_after_secs: 1,
        },
    );
    bed.sim.drop_watches();
    create_pods(&bed, "a", "throttled", 5);
    wait_failures_served(&bed).await;

    let expected = bed.journal("pods", Some("a"));
    let msgs = bed.read_covering(&topic, &expected).await;
    assert_covers(&msgs, &expected);
    assert!(
        msgs.iter()
            .all(|m| m.value["type"].is_string() && m.value["object"].is_object()),
        "only envelopes are published"
    );
    // The cut line restarted the watch; the garbage line was skipped without a restart.
    assert!(relay.counter("watch_restarts_total", s) >= 1);
    assert_eq!(relay.counter("malformed_lines_total", s), 1);
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_object_goes_to_the_dead_letter_topic_as_a_reference() {
    let bed = Bed::new(&["a"]).await;
    let topic = kafka::unique("big");
    let dlq = kafka::unique("dlq");
    kafka::create_topics(&[&topic, &dlq], 3).await;
    let cfg = bed.config(
        &format!("  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: {topic}\n"),
        &format!("  oversize: deadLetter\n  deadLetterTopic: {dlq}\n  maxMessageBytes: 1000000\n"),
    );
    let relay = Relay::start(&bed, cfg);
    relay.wait_up(1).await;
    let mut big = objects::pod("a", "huge");
    big["metadata"]["annotations"]["blob"] = serde_json::Value::String("x".repeat(1_200_000));
    bed.sim.create("pods", Some("a"), big).unwrap();
    create_pods(&bed, "a", "after", 3);

    let small: Vec<_> = bed
        .journal("pods", Some("a"))
        .into_iter()
        .filter(|e| e.name != "huge")
        .collect();
    let msgs = bed.read_covering(&topic, &small).await;
    assert_covers(&msgs, &small);
    assert!(
        msgs.iter().all(|m| m.key.as_deref() != Some("a/huge")),
        "the oversized event is not in the channel topic"
    );
    let refs = bed.read_until(&dlq, |m| !m.is_empty()).await;
    assert_eq!(refs.len(), 1);
    let r = &refs[0];
    assert_eq!(r.key.as_deref(), Some("a/huge"));
    assert_eq!(r.value["type"], "ADDED");
    assert_eq!(r.value["object"]["metadata"]["name"], "huge");
    assert!(
        r.value["object"].get("spec").is_none(),
        "a reference carries identity only"
    );
    assert!(r.value["watchrelay"]["truncatedBytes"].as_u64().unwrap() > 1_000_000);
    assert!(r.raw_len < 4096);
    assert_eq!(
        relay.counter("oversize_events_total", "watchNamespacedPods.a"),
        1
    );
    // The checkpoint moves past it.
    bed.wait_checkpoint_current("watchNamespacedPods.a").await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_channel_waits_for_its_crd_and_a_denied_channel_does_not_block_others() {
    let bed = Bed::new(&["a"]).await;
    let widgets = kafka::unique("widgets");
    let pods = kafka::unique("pods");
    let services = kafka::unique("services");
    kafka::create_topics(&[&widgets, &pods, &services], 1).await;
    bed.sim.deny("services");
    let channels = format!(
        "  - path: /apis/example.com/v1/namespaces/{{namespace}}/widgets\n    name: widgets\n    message: WidgetWatchEvent\n    namespaces: [a]\n    topic: {widgets}\n\
         \x20 - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: {pods}\n\
         \x20 - operationId: watchNamespacedServices\n    namespaces: [a]\n    topic: {services}\n"
    );
    let relay = Relay::start(&bed, bed.config(&channels, ""));
    create_pods(&bed, "a", "p", 3);
    let expected = bed.journal("pods", Some("a"));
    let msgs = bed.read_covering(&pods, &expected).await;
    assert_covers(&msgs, &expected);
    assert!(
        !relay.stream_up("watchNamespacedServices.a"),
        "the denied channel cannot be watching"
    );
    assert!(!relay.stream_up("widgets.a"), "the CRD does not exist yet");
    eventually(
        || relay.counter("api_errors_total", "watchNamespacedServices.a") >= 1,
        || "the denied channel's error was never counted".into(),
    )
    .await;

    bed.sim
        .register_crd("example.com", "v1", "widgets", "Widget", true);
    for i in 0..3 {
        let w = serde_json::json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": format!("w{i}"), "namespace": "a"}, "spec": {"size": i}
        });
        bed.sim.create("widgets.example.com", Some("a"), w).unwrap();
    }
    let expected = bed.journal("widgets.example.com", Some("a"));
    assert_eq!(expected.len(), 3);
    // Created before or after the stream's first list: either way each widget arrives at its
    // current version.
    let msgs = bed.read_until(&widgets, |m| m.len() >= 3).await;
    let mut names: Vec<&str> = msgs
        .iter()
        .map(|m| m.value["object"]["metadata"]["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["w0", "w1", "w2"]);
    assert!(msgs
        .iter()
        .all(|m| m.value["watchrelay"]["message"] == "WidgetWatchEvent"
            && m.value["object"]["kind"] == "Widget"));
    // Still refused when it tries again: the denied channel is still not watching.
    let refused = relay.counter("api_errors_total", "watchNamespacedServices.a");
    relay
        .wait_counter("api_errors_total", "watchNamespacedServices.a", refused + 1)
        .await;
    assert!(!relay.stream_up("watchNamespacedServices.a"));
    relay.stop().await;
}
