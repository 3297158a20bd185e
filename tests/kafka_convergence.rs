//! The consumer's promise through a real broker: after downtime and compaction, objects
//! recreated under their name, selector and scope changes, and at scale, what a consumer holds
//! after applying each key's records in partition order is what the cluster holds.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::bed::{Bed, Relay};
use common::kafka::{self, Msg};
use common::view::{self, kafka_view as consumer_view};
use watchrelay_sim::{objects, Sim};

async fn topic() -> String {
    let topic = kafka::unique("converge");
    kafka::create_topics(&[&topic], 3).await;
    topic
}

/// Reads `topic` until the consumer's view equals the pods `want` selects, and asserts it.
async fn assert_converges(
    bed: &Bed,
    topic: &str,
    want: impl Fn(&Sim) -> BTreeMap<String, String> + Send + Sync + 'static,
) -> Vec<Msg> {
    let want = std::sync::Arc::new(want);
    let (sim, w) = (bed.sim.clone(), want.clone());
    let msgs = bed
        .read_within(topic, Duration::from_secs(600), move |m| {
            consumer_view(m) == w(&sim)
        })
        .await;
    assert_same(&consumer_view(&msgs), &want(&bed.sim), msgs.len());
    msgs
}

/// Asserts the consumer holds what the cluster holds, naming a few differences if not.
fn assert_same(got: &BTreeMap<String, String>, want: &BTreeMap<String, String>, records: usize) {
    if got == want {
        return;
    }
    let extra: Vec<_> = got
        .keys()
        .filter(|k| !want.contains_key(*k))
        .take(5)
        .collect();
    let missing: Vec<_> = want
        .keys()
        .filter(|k| !got.contains_key(*k))
        .take(5)
        .collect();
    let stale: Vec<_> = want
        .iter()
        .filter(|(k, u)| got.get(*k).is_some_and(|g| g != *u))
        .take(5)
        .collect();
    panic!(
        "the consumer holds {} objects, the cluster {}, after {records} records; e.g. extra {extra:?}, missing {missing:?}, other uid {stale:?}",
        got.len(),
        want.len(),
    );
}

fn label(sim: &Sim, resource: &str, ns: Option<&str>, name: &str, key: &str, value: &str) {
    let value = if value.is_empty() {
        serde_json::Value::Null
    } else {
        value.into()
    };
    sim.merge_patch(
        resource,
        ns,
        name,
        serde_json::json!({"metadata": {"labels": {key: value}}}),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreated_under_the_same_name_while_down_ends_alive() {
    let bed = Bed::new(&["a"]).await;
    let topic = topic().await;
    let cfg = bed.config(
        &format!("  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: {topic}\n"),
        "",
    );
    for i in 0..5 {
        bed.sim
            .create("pods", Some("a"), objects::pod("a", &format!("p{i}")))
            .unwrap();
    }
    let relay = Relay::start(&bed, cfg.clone());
    relay.wait_up(1).await;
    bed.wait_checkpoint_current("watchNamespacedPods.a").await;
    relay.kill().await;
    let old = bed.sim.get("pods", Some("a"), "p1").unwrap();
    bed.sim.delete("pods", Some("a"), "p1").unwrap();
    bed.sim
        .create("pods", Some("a"), objects::pod("a", "p1"))
        .unwrap();
    bed.sim.compact();
    let relay = Relay::start(&bed, cfg);
    relay.wait_up(1).await;
    let msgs = assert_converges(&bed, &topic, |sim| view::pods(sim, &["a"], |_| true)).await;
    relay.stop().await;
    // On p1's key: the old uid's inferred DELETED, then the new uid's ADDED.
    let p1: Vec<(String, String)> = msgs
        .iter()
        .filter(|m| m.key.as_deref() == Some("a/p1"))
        .map(|m| {
            (
                m.value["type"].as_str().unwrap().to_string(),
                m.value["object"]["metadata"]["uid"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    let old_uid = old["metadata"]["uid"].as_str().unwrap();
    let deleted = p1
        .iter()
        .position(|(t, u)| t == "DELETED" && u == old_uid)
        .expect("the old uid is deleted");
    assert!(
        p1[deleted + 1..]
            .iter()
            .any(|(t, u)| t == "ADDED" && u != old_uid),
        "{p1:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_changed_across_a_restart_reconciles() {
    let bed = Bed::new(&["a"]).await;
    let topic = topic().await;
    let channel = |selector: &str| {
        bed.config(
            &format!("  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: {topic}\n    labelSelector: {selector}\n"),
            "",
        )
    };
    for (i, tier) in ["web", "web", "db", "db", "batch"].iter().enumerate() {
        let mut pod = objects::pod("a", &format!("p{i}"));
        pod["metadata"]["labels"]["tier"] = (*tier).into();
        bed.sim.create("pods", Some("a"), pod).unwrap();
    }
    let relay = Relay::start(&bed, channel("tier=web"));
    relay.wait_up(1).await;
    bed.wait_checkpoint_current("watchNamespacedPods.a").await;
    relay.kill().await;
    // While down the selection moves: one web pod becomes db.
    label(&bed.sim, "pods", Some("a"), "p0", "tier", "db");
    let relay = Relay::start(&bed, channel("tier in (db,batch)"));
    relay.wait_up(1).await;
    assert_converges(&bed, &topic, |sim| {
        view::pods(sim, &["a"], |p| p["metadata"]["labels"]["tier"] != "web")
    })
    .await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_leaving_and_returning_while_down() {
    let bed = Bed::new(&["a", "b"]).await;
    for ns in ["a", "b"] {
        label(&bed.sim, "namespaces", None, ns, "relay", "yes");
        for i in 0..3 {
            bed.sim
                .create("pods", Some(ns), objects::pod(ns, &format!("p{i}")))
                .unwrap();
        }
    }
    let topic = topic().await;
    let cfg = bed.config(
        &format!("  - operationId: watchNamespacedPods\n    namespaceSelector: relay=yes\n    topic: {topic}\n"),
        "",
    );
    let in_scope = |sim: &Sim| {
        let namespaces: Vec<&str> = ["a", "b"]
            .into_iter()
            .filter(|ns| {
                sim.get("namespaces", None, ns)
                    .is_some_and(|n| n["metadata"]["labels"]["relay"] == "yes")
            })
            .collect();
        view::pods(sim, &namespaces, |_| true)
    };
    let relay = Relay::start(&bed, cfg.clone());
    relay.wait_up(2).await;
    assert_converges(&bed, &topic, in_scope).await;
    relay.kill().await;
    // b leaves while the relay is down: its objects leave the consumer's view.
    label(&bed.sim, "namespaces", None, "b", "relay", "");
    let relay = Relay::start(&bed, cfg.clone());
    relay.wait_up(1).await;
    assert_converges(&bed, &topic, in_scope).await;
    relay.stop().await;
    // b returns, changed meanwhile: it starts afresh.
    bed.sim.delete("pods", Some("b"), "p0").unwrap();
    bed.sim
        .create("pods", Some("b"), objects::pod("b", "p9"))
        .unwrap();
    label(&bed.sim, "namespaces", None, "b", "relay", "yes");
    let relay = Relay::start(&bed, cfg);
    relay.wait_up(2).await;
    assert_converges(&bed, &topic, in_scope).await;
    relay.stop().await;
}

/// 100,000 pods; while the relay is down 2,000 are deleted and 500 created, and history is
/// compacted. Every deletion is announced, and the checkpoint ConfigMap stays small.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_pods_with_deletions_while_down() {
    const PODS: usize = 100_000;
    let bed = Bed::new(&["big"]).await;
    let topic = topic().await;
    let mut cfg = bed.config(
        &format!(
            "  - operationId: watchNamespacedPods\n    namespaces: [big]\n    topic: {topic}\n"
        ),
        "  maxInFlightPerStream: 20000\n",
    );
    cfg.kubernetes.list_page_size = 500;
    for i in 0..PODS {
        bed.sim
            .create("pods", Some("big"), objects::pod("big", &format!("p{i}")))
            .unwrap();
    }
    let relay = Relay::start(&bed, cfg.clone());
    let stream = "watchNamespacedPods.big";
    let now = bed.sim.current_rv();
    eventually_long(|| bed.checkpoint_rv(stream).is_some_and(|rv| rv >= now)).await;
    relay.stop().await;
    for i in (0..PODS).step_by(PODS / 2_000) {
        bed.sim
            .delete("pods", Some("big"), &format!("p{i}"))
            .unwrap();
    }
    for i in 0..500 {
        bed.sim
            .create("pods", Some("big"), objects::pod("big", &format!("new{i}")))
            .unwrap();
    }
    bed.sim.compact();
    let relay = Relay::start(&bed, cfg);
    let now = bed.sim.current_rv();
    eventually_long(|| bed.checkpoint_rv(stream).is_some_and(|rv| rv >= now)).await;
    assert_eq!(relay.counter("synthetic_deletes_total", stream), 2_000);
    relay.stop().await;
    // Everything is in Kafka: read to the end of the resync (cheap to check on 200,000
    // records), then compare once.
    let msgs = bed
        .read_metadata_within(&topic, Duration::from_secs(600), |m| {
            m.iter().any(|m| {
                m.value["object"]["metadata"]["annotations"]["watchrelay.io/resync-end"] == "true"
            })
        })
        .await;
    assert_same(
        &consumer_view(&msgs),
        &view::pods(&bed.sim, &["big"], |_| true),
        msgs.len(),
    );
    let inferred = msgs
        .iter()
        .filter(|m| m.value["watchrelay"]["synthetic"] == true)
        .count();
    assert_eq!(inferred, 2_000);
    let cm = bed.checkpoint_configmap();
    let size = serde_json::to_vec(&cm["data"]).unwrap().len();
    assert!(
        size < 1024,
        "checkpoint data of {size} bytes for {PODS} objects"
    );
    assert!(cm.get("binaryData").is_none_or(|b| b.is_null()));
}

/// Polls `cond` every 200 ms for up to ten minutes (a hang guard for the large test).
async fn eventually_long(mut cond: impl FnMut() -> bool) {
    for _ in 0..3000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("never held");
}
