//! At-least-once across crashes, outages and expired positions.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::bed::{assert_covers, assert_once, event_id, Bed, Relay};
use common::kafka;
use watchrelay_sim::{objects, ChurnSpec, SimConfig};

fn pods_channel(topic: &str, namespaces: &str) -> String {
    format!("  - operationId: watchNamespacedPods\n    namespaces: [{namespaces}]\n    topic: {topic}\n")
}

fn pod_churn(rate: f64, namespaces: &[&str]) -> ChurnSpec {
    ChurnSpec {
        rate_per_sec: rate,
        namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
        resources: vec!["pods".into()],
        max_objects_per_kind: 40,
        total_events: None,
    }
}

/// Relays pods in `a` and `b` with `cfg` under 400 changes a second, crashing the relay four
/// times (the first `pause.0` ms in, each next one `pause.1` ms later than the last) and
/// starting another each time, after `killed` looked at what the crash left. Returns once the
/// last one relayed, on both streams, changes made since it started, and churn stopped.
async fn crash_four_times(
    bed: &Bed,
    cfg: &watchrelay::config::Config,
    pause: (u64, u64),
    mut killed: impl FnMut(&Bed),
) -> Relay {
    let mut relay = Relay::start(bed, cfg.clone());
    relay.wait_up(2).await;
    let churn = bed.sim.start_churn(pod_churn(400.0, &["a", "b"]));
    for round in 0..4u64 {
        // Not a wait: the crash instants are the test's, a different one each round, wherever the
        // relay is then (starting, restoring, relaying).
        tokio::time::sleep(Duration::from_millis(pause.0 + pause.1 * round)).await;
        relay.kill().await;
        killed(bed);
        relay = Relay::start(bed, cfg.clone());
    }
    let restarted = bed.sim.current_rv();
    for stream in ["watchNamespacedPods.a", "watchNamespacedPods.b"] {
        bed.wait_checkpoint_past(stream, restarted).await;
    }
    churn.stop().await;
    relay
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_during_churn_lose_nothing_and_duplicate_only_the_unacknowledged_tail() {
    let bed = Bed::new(&["a", "b"]).await;
    let topic = kafka::unique("crash");
    kafka::create_topics(&[&topic], 3).await;
    let cfg = bed.config(&pods_channel(&topic, "a, b"), "");

    // The checkpoint each restart resumed from, per stream.
    let mut resumed_from: Vec<HashMap<String, u64>> = Vec::new();
    let relay = crash_four_times(&bed, &cfg, (600, 250), |bed| {
        let cps = bed.checkpoints();
        resumed_from.push(
            cps.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.rv.as_ref()?.parse().ok()?)))
                .collect(),
        );
    })
    .await;

    let expected = bed.journal("pods", None);
    assert!(
        expected.len() > 500,
        "churn produced {} changes",
        expected.len()
    );
    let msgs = bed.read_covering(&topic, &expected).await;
    assert_covers(&msgs, &expected);

    let mut count: HashMap<String, usize> = HashMap::new();
    for m in &msgs {
        *count
            .entry(m.value["watchrelay"]["id"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    let mut duplicated = 0;
    for e in &expected {
        let n = count[&event_id(e)];
        if n > 1 {
            duplicated += 1;
            let stream = format!("watchNamespacedPods.{}", e.namespace.as_deref().unwrap());
            // A change is delivered again only by a restart that resumed from before it.
            let replays = resumed_from
                .iter()
                .filter(|cp| cp.get(&stream).is_none_or(|rv| e.rv > *rv))
                .count();
            assert!(
                n - 1 <= replays,
                "{} delivered {n} times but only {replays} restarts resumed before it",
                event_id(e)
            );
        }
    }
    eprintln!(
        "{} changes, {duplicated} delivered more than once over 4 crashes",
        expected.len()
    );
    relay.stop().await;
}

/// With `delivery: exactlyOnce`, a `read_committed` consumer (the test's reader) sees every
/// change once, in order, across crashes at arbitrary instants: what a crashed relay left
/// uncommitted is aborted when the next one fences it, and the next one resumes from the
/// position committed with the records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_crashes_during_churn_publish_every_change_once() {
    let bed = Bed::new(&["a", "b"]).await;
    let topic = kafka::unique("exactly");
    kafka::create_topics(&[&topic], 3).await;
    let cfg = bed.config(
        &pods_channel(&topic, "a, b"),
        "  delivery: exactlyOnce\n  commitIntervalMs: 50\n",
    );

    let relay = crash_four_times(&bed, &cfg, (700, 230), |_| {}).await;
    let expected = bed.journal("pods", None);
    assert!(
        expected.len() > 500,
        "churn made {} changes",
        expected.len()
    );
    let msgs = bed.read_covering(&topic, &expected).await;
    assert_covers(&msgs, &expected);
    assert_once(&msgs);
    eprintln!(
        "{} changes, {} records, none twice over 4 crashes",
        expected.len(),
        msgs.len()
    );
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletions_while_down_past_the_history_window_become_synthetic_deletes() {
    deletions_while_down(true).await;
}

/// The same against a server without the WatchList feature: the relay falls back to paginated
/// lists (pages of 7 objects here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_send_initial_events_paginated_lists_do_the_same() {
    deletions_while_down(false).await;
}

async fn deletions_while_down(watch_list: bool) {
    let sim_cfg = SimConfig {
        watch_list,
        ..Default::default()
    };
    let bed = Bed::with(sim_cfg, &["a"]).await;
    let topic = kafka::unique("gone");
    kafka::create_topics(&[&topic], 3).await;
    let cfg = bed.config(&pods_channel(&topic, "a"), "");
    for i in 0..10 {
        bed.sim
            .create("pods", Some("a"), objects::pod("a", &format!("p{i}")))
            .unwrap();
    }
    let relay = Relay::start(&bed, cfg.clone());
    relay.wait_up(1).await;
    bed.sim
        .create("pods", Some("a"), objects::pod("a", "p10"))
        .unwrap();
    bed.wait_checkpoint_current("watchNamespacedPods.a").await;
    relay.stop().await;

    // While the relay is down: deletions, a change, a new object; then history is compacted so
    // the saved position has expired.
    for i in 0..4 {
        bed.sim.delete("pods", Some("a"), &format!("p{i}")).unwrap();
    }
    bed.sim
        .merge_patch(
            "pods",
            Some("a"),
            "p5",
            serde_json::json!({"metadata": {"labels": {"v": "2"}}}),
        )
        .unwrap();
    bed.sim
        .create("pods", Some("a"), objects::pod("a", "late"))
        .unwrap();
    bed.sim.compact();

    let relay = Relay::start(&bed, cfg);
    relay.wait_up(1).await;
    let msgs = bed
        .read_until(&topic, |m| {
            m.iter().any(|m| {
                m.value["type"] == "BOOKMARK"
                    && m.value["object"]["metadata"]["annotations"]["watchrelay.io/resync-end"]
                        == "true"
            })
        })
        .await;
    let deleted: Vec<_> = msgs
        .iter()
        .filter(|m| m.value["watchrelay"]["synthetic"] == true)
        .collect();
    let mut names: Vec<&str> = deleted
        .iter()
        .map(|m| m.value["object"]["metadata"]["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["p0", "p1", "p2", "p3"]);
    for d in &deleted {
        assert_eq!(d.value["type"], "DELETED");
        assert_eq!(d.value["watchrelay"]["resync"], true);
        assert_eq!(d.headers["ce_synthetic"], "true");
        // After every earlier message of the same object (same key, same partition).
        let last_other = msgs
            .iter()
            .filter(|m| m.key == d.key && m.offset != d.offset)
            .map(|m| m.offset)
            .max()
            .unwrap();
        assert!(
            d.offset > last_other,
            "{:?}: synthetic DELETED before an earlier message",
            d.key
        );
    }
    let reannounced: Vec<&str> = msgs
        .iter()
        .filter(|m| m.value["watchrelay"]["resync"] == true && m.value["type"] == "ADDED")
        .map(|m| m.value["object"]["metadata"]["name"].as_str().unwrap())
        .collect();
    for name in ["p5", "late"] {
        assert!(
            reannounced.contains(&name),
            "{name} not re-announced: {reannounced:?}"
        );
    }
    assert!(
        !reannounced.contains(&"p4"),
        "p4 did not change since the position: a delta resync does not publish it again"
    );
    let p5 = bed.sim.get("pods", Some("a"), "p5").unwrap();
    assert!(msgs
        .iter()
        .any(|m| m.value["object"]["metadata"]["resourceVersion"]
            == p5["metadata"]["resourceVersion"]));
    assert_eq!(relay.counter("resyncs_total", "watchNamespacedPods.a"), 1);
    assert_eq!(
        relay.counter("synthetic_deletes_total", "watchNamespacedPods.a"),
        4
    );
    relay.stop().await;
    // The members left with the synthetic deletes, in the membership topic; the checkpoint
    // holds the position alone.
    let members = bed.members().await.take("watchNamespacedPods.a");
    let mut names: Vec<String> = members.iter().map(|(_, k)| k.name).collect();
    names.sort();
    assert_eq!(names, ["late", "p10", "p4", "p5", "p6", "p7", "p8", "p9"]);
    assert!(bed.checkpoints()["watchNamespacedPods.a"].known.is_none());
}
