//! The fast tier: the whole relay in-process against the simulator, its records going to a
//! producer in memory that can stall, acknowledge out of order, refuse for size and fail. No
//! broker needed.
//!
//! Each test compares what a consumer holds after applying the delivered records key by key
//! with what the simulated cluster holds.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::bed::{eventually, Bed, Relay};
use common::view::{self, consumer_view, events, json};
use watchrelay::config::Config;
use watchrelay::producer::Producer;
use watchrelay::producer::Record;
use watchrelay::testing::{Memory, Order};
use watchrelay_sim::objects;

const STREAM: &str = "watchNamespacedPods.a";

fn config(bed: &Bed, kafka_extra: &str) -> Config {
    bed.config(
        "  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: pods\n",
        kafka_extra,
    )
}

async fn bed(watch_list: bool) -> Bed {
    Bed::in_memory_serving(watch_list, &["a"]).await
}

fn start(bed: &Bed, cfg: Config, producer: &Arc<Memory>) -> Relay {
    Relay::start_with(bed, cfg, Some(producer.clone()))
}

/// What the cluster holds: key -> uid.
fn cluster_view(bed: &Bed) -> BTreeMap<String, String> {
    view::pods(&bed.sim, &["a"], |_| true)
}

fn create(bed: &Bed, names: impl IntoIterator<Item = String>) {
    for n in names {
        bed.sim
            .create("pods", Some("a"), objects::pod("a", &n))
            .unwrap();
    }
}

fn last_pod_rv(bed: &Bed) -> u64 {
    bed.journal("pods", Some("a")).last().map(|e| e.rv).unwrap()
}

/// Waits until the stream's checkpoint covers every change made to its pods so far.
async fn wait_covered(bed: &Bed) {
    bed.wait_pods_covered(STREAM, "a").await;
}

async fn list_watch_gone_resync(watch_list: bool) {
    let bed = bed(watch_list).await;
    let producer = Arc::new(Memory::new());
    create(&bed, (0..12).map(|i| format!("p{i}")));
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_up(1).await;
    // Live changes on the watch.
    create(&bed, ["live".to_string()]);
    bed.sim.delete("pods", Some("a"), "p0").unwrap();
    wait_covered(&bed).await;
    assert_eq!(consumer_view(&events(&producer)), cluster_view(&bed));
    relay.stop().await;

    // While the relay is down: deletions, a change, a creation; then the history is compacted,
    // so the restarted stream's position has expired (410) and it resyncs.
    for n in ["p1", "p2", "p3"] {
        bed.sim.delete("pods", Some("a"), n).unwrap();
    }
    bed.sim
        .merge_patch(
            "pods",
            Some("a"),
            "p4",
            serde_json::json!({"metadata": {"labels": {"changed": "yes"}}}),
        )
        .unwrap();
    create(&bed, ["late".to_string()]);
    bed.sim.compact();
    let relay = start(&bed, config(&bed, ""), &producer);
    relay
        .wait_counter("synthetic_deletes_total", STREAM, 3)
        .await;
    wait_covered(&bed).await;
    relay.stop().await;

    let log = events(&producer);
    assert_eq!(consumer_view(&log), cluster_view(&bed));
    let mut inferred: Vec<String> = log
        .iter()
        .filter(|r| json(r)["watchrelay"]["synthetic"] == true)
        .map(|r| r.key.clone())
        .collect();
    inferred.sort();
    assert_eq!(inferred, ["a/p1", "a/p2", "a/p3"]);
    let ends = log
        .iter()
        .filter(|r| {
            json(r)["object"]["metadata"]["annotations"]["watchrelay.io/resync-end"] == "true"
        })
        .count();
    assert_eq!(ends, 1, "one resync, marked once");
    let reannounced = log
        .iter()
        .filter(|r| json(r)["watchrelay"]["resync"] == true && json(r)["type"] == "ADDED")
        .count();
    assert_eq!(
        reannounced, 2,
        "the resync re-announces only what changed since the position: p4 and late"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_watch_expiry_and_resync_converge_with_initial_events() {
    list_watch_gone_resync(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_watch_expiry_and_resync_converge_with_paginated_lists() {
    list_watch_gone_resync(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_order_acknowledgements_never_move_the_checkpoint_past_a_gap() {
    let (bed, producer, relay) = running().await;
    wait_until_saved(&bed).await;
    let before = bed.checkpoint_rv(STREAM).unwrap();
    producer.hold(true);
    create(&bed, (0..20).map(|i| format!("p{i}")));
    wait_held(&producer, 20).await;
    // Everything is sent, nothing acknowledged: the checkpoint stays where it was.
    assert_eq!(bed.checkpoint_rv(STREAM), Some(before));
    producer.hold(false);
    producer.release(Order::Reversed);
    wait_covered(&bed).await;
    relay.stop().await;
    assert_converged(&bed, &producer);
}

/// A bed with a relay of the pods channel running and watching, its records in memory.
async fn running() -> (Bed, Arc<Memory>, Relay) {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_up(1).await;
    (bed, producer, relay)
}

/// What a consumer holds after applying every delivered record is what the cluster holds.
fn assert_converged(bed: &Bed, producer: &Memory) {
    assert_eq!(consumer_view(&events(producer)), cluster_view(bed));
}

/// Waits until the producer holds `n` records.
async fn wait_held(producer: &Memory, n: usize) {
    eventually(
        || producer.held() == n,
        || format!("held {}", producer.held()),
    )
    .await;
}

/// Waits until the stream saved a first checkpoint.
async fn wait_until_saved(bed: &Bed) {
    bed.wait_checkpoint(|c| c.get(STREAM).is_some_and(|s| s.rv.is_some()))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backpressure_bounds_what_awaits_acknowledgement() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    let relay = start(&bed, config(&bed, "  maxInFlightPerStream: 5\n"), &producer);
    relay.wait_up(1).await;
    producer.hold(true);
    create(&bed, (0..30).map(|i| format!("p{i}")));
    wait_held(&producer, 5).await;
    // Released in shuffled batches, never more than the bound in flight.
    for round in 0..40u64 {
        assert!(producer.held() <= 5, "{} held", producer.held());
        assert!(relay.metrics.in_flight.with_label_values(&[STREAM]).get() <= 5);
        producer.release(Order::Shuffled(round + 1));
        if bed
            .checkpoint_rv(STREAM)
            .is_some_and(|rv| rv >= last_pod_rv(&bed))
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    producer.hold(false);
    producer.release(Order::Sent);
    wait_covered(&bed).await;
    relay.stop().await;
    assert_converged(&bed, &producer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_records_become_references_in_their_place() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    // The broker refuses big records in its report; the relay's own bound catches bigger ones.
    producer.refuse_larger_than(6_000, true);
    let relay = start(&bed, config(&bed, "  maxMessageBytes: 20000\n"), &producer);
    relay.wait_up(1).await;
    let mut big = objects::pod("a", "big");
    big["metadata"]["annotations"]["blob"] = "x".repeat(8_000).into();
    let mut huge = objects::pod("a", "huge");
    huge["metadata"]["annotations"]["blob"] = "x".repeat(30_000).into();
    bed.sim.create("pods", Some("a"), big).unwrap();
    bed.sim.create("pods", Some("a"), huge).unwrap();
    create(&bed, ["small".to_string()]);
    wait_covered(&bed).await;
    relay.stop().await;
    let log = events(&producer);
    let truncated: BTreeMap<String, u64> = log
        .iter()
        .filter_map(|r| {
            Some((
                r.key.clone(),
                json(r)["watchrelay"]["truncatedBytes"].as_u64()?,
            ))
        })
        .collect();
    assert_eq!(truncated.keys().collect::<Vec<_>>(), ["a/big", "a/huge"]);
    assert!(truncated["a/big"] > 8_000 && truncated["a/huge"] > 30_000);
    assert_eq!(consumer_view(&log), cluster_view(&bed));
    assert_eq!(
        log.iter().map(|r| r.topic.as_str()).collect::<Vec<_>>(),
        vec!["pods"; log.len()],
        "oversize: trim keeps references on the channel's topic"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delivery_replays_from_the_checkpoint() {
    let (bed, producer, relay) = running().await;
    producer.fail_next_to("pods", 3);
    create(&bed, (0..10).map(|i| format!("p{i}")));
    relay.wait_counter("watch_restarts_total", STREAM, 1).await;
    wait_covered(&bed).await;
    relay.stop().await;
    assert_converged(&bed, &producer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_drains_so_the_final_checkpoint_covers_everything() {
    let (bed, producer, relay) = running().await;
    producer.hold(true);
    create(&bed, (0..15).map(|i| format!("p{i}")));
    wait_held(&producer, 15).await;
    let stopping = tokio::spawn(relay.stop());
    producer.hold(false);
    producer.release(Order::Shuffled(7));
    stopping.await.unwrap();
    assert!(bed.checkpoint_rv(STREAM).unwrap() >= last_pod_rv(&bed));
    assert_eq!(consumer_view(&events(&producer)), cluster_view(&bed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requested_resync_reannounces_and_the_request_is_cleared() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    create(&bed, (0..5).map(|i| format!("p{i}")));
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_up(1).await;
    wait_covered(&bed).await;
    bed.sim
        .merge_patch(
            "configmaps",
            Some(common::bed::CHECKPOINT_NS),
            common::bed::CHECKPOINT_NAME,
            serde_json::json!({"metadata": {"annotations": {"watchrelay.io/resync": "watchNamespacedPods"}}}),
        )
        .unwrap();
    relay.wait_counter("resyncs_total", STREAM, 1).await;
    let marked = || {
        events(&producer).iter().any(|r| {
            json(r)["object"]["metadata"]["annotations"]["watchrelay.io/resync-end"] == "true"
        })
    };
    eventually(marked, || "the resync never ended".into()).await;
    let cm = bed.checkpoint_configmap();
    assert!(cm["metadata"]["annotations"]["watchrelay.io/resync"].is_null());
    relay.stop().await;
    let log = events(&producer);
    let reannounced = log
        .iter()
        .filter(|r| json(r)["watchrelay"]["resync"] == true && json(r)["type"] == "ADDED")
        .count();
    assert_eq!(reannounced, 5);
    assert_eq!(consumer_view(&log), cluster_view(&bed));
}

/// Records a resync published as re-announcements (ADDED flagged `resync`) and inferred
/// DELETEDs, in `log`.
fn resync_records(log: &[Record]) -> (usize, usize) {
    let added = log
        .iter()
        .filter(|r| json(r)["watchrelay"]["resync"] == true && json(r)["type"] == "ADDED")
        .count();
    let inferred = log
        .iter()
        .filter(|r| json(r)["watchrelay"]["synthetic"] == true)
        .count();
    (added, inferred)
}

async fn request_resync(bed: &Bed, relay: &Relay, value: &str, resyncs: u64) {
    bed.sim
        .merge_patch(
            "configmaps",
            Some(common::bed::CHECKPOINT_NS),
            common::bed::CHECKPOINT_NAME,
            serde_json::json!({"metadata": {"annotations": {"watchrelay.io/resync": value}}}),
        )
        .unwrap();
    relay.wait_counter("resyncs_total", STREAM, resyncs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_410_over_thousands_of_objects_republishes_only_what_changed() {
    let bed = bed(false).await;
    let producer = Arc::new(Memory::new());
    create(&bed, (0..3000).map(|i| format!("p{i}")));
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_up(1).await;
    wait_covered(&bed).await;
    relay.stop().await;
    let before = events(&producer).len();

    // While the relay is down: 40 changed, 10 deleted, 5 created; the history is compacted.
    for i in 0..40 {
        bed.sim
            .merge_patch(
                "pods",
                Some("a"),
                &format!("p{i}"),
                serde_json::json!({"metadata": {"labels": {"changed": "yes"}}}),
            )
            .unwrap();
    }
    for i in 100..110 {
        bed.sim.delete("pods", Some("a"), &format!("p{i}")).unwrap();
    }
    create(&bed, (0..5).map(|i| format!("late{i}")));
    bed.sim.compact();
    let relay = start(&bed, config(&bed, ""), &producer);
    relay
        .wait_counter("resync_unchanged_total", STREAM, 1)
        .await;
    wait_covered(&bed).await;
    let unchanged = relay.counter("resync_unchanged_total", STREAM);
    relay.stop().await;

    let log = events(&producer);
    assert_eq!(consumer_view(&log), cluster_view(&bed));
    let after = &log[before..];
    assert_eq!(
        resync_records(after),
        (45, 10),
        "the changed and the new; the deleted"
    );
    let ends = after
        .iter()
        .filter(|r| {
            json(r)["object"]["metadata"]["annotations"]["watchrelay.io/resync-end"] == "true"
        })
        .count();
    assert_eq!(ends, 1, "the end is marked");
    assert_eq!(after.len(), 45 + 10 + 1, "nothing else is published");
    assert_eq!(unchanged, 3000 - 40 - 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requested_delta_resync_reannounces_only_what_changed_and_a_full_one_everything() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    create(&bed, (0..20).map(|i| format!("p{i}")));
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_up(1).await;
    wait_covered(&bed).await;
    let before = events(&producer).len();
    request_resync(&bed, &relay, "watchNamespacedPods;delta", 1).await;
    eventually(
        || events(&producer).len() > before,
        || "the delta resync never ended".into(),
    )
    .await;
    wait_covered(&bed).await;
    let log = events(&producer);
    assert_eq!(resync_records(&log[before..]), (0, 0), "nothing changed");
    assert_eq!(log.len(), before + 1, "only the resync-end marker");

    let before = log.len();
    request_resync(&bed, &relay, "all", 2).await;
    eventually(
        || events(&producer).len() > before + 20,
        || "the full resync never ended".into(),
    )
    .await;
    relay.stop().await;
    let log = events(&producer);
    assert_eq!(resync_records(&log[before..]), (20, 0), "every object");
    assert_eq!(consumer_view(&log), cluster_view(&bed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_watch_is_reopened_and_nothing_is_lost() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    let mut cfg = config(&bed, "");
    cfg.kubernetes.watch_idle_timeout_seconds = 2;
    let relay = start(&bed, cfg, &producer);
    relay.wait_up(1).await;
    // The next watch is accepted and then silent, as over a half-open connection.
    bed.sim.stall_next_watch();
    bed.sim.drop_watches();
    create(&bed, (0..10).map(|i| format!("p{i}")));
    relay.wait_counter("watch_restarts_total", STREAM, 1).await;
    wait_covered(&bed).await;
    let stalled = relay
        .metrics
        .watch_restarts
        .with_label_values(&[STREAM, "stalled"])
        .get();
    assert_eq!(stalled, 1);
    relay.stop().await;
    assert_converged(&bed, &producer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_producer_error_makes_the_process_unhealthy() {
    // The simulator must outlive the relay.
    let (_bed, producer, relay) = running().await;
    assert_eq!(relay.registry.health(), Ok(()));
    producer.fail_fatally("out of order sequence number");
    eventually(
        || relay.registry.health().is_err(),
        || "a fatal producer error left the process healthy".into(),
    )
    .await;
    assert!(relay
        .registry
        .health()
        .unwrap_err()
        .contains("out of order sequence number"));
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_purges_its_queue_and_checkpoints_nothing_more() {
    const LEASES: &str = "leases.coordination.k8s.io";
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    let mut cfg = config(&bed, "");
    let le = &mut cfg.leader_election;
    le.enabled = true;
    le.lease_duration_seconds = 4;
    le.renew_deadline_seconds = 3;
    le.retry_period_seconds = 1;
    let relay = start(&bed, cfg, &producer);
    relay.wait_up(1).await;
    wait_until_saved(&bed).await;
    // Records queued but not sent when the Lease is lost.
    producer.hold(true);
    create(&bed, (0..10).map(|i| format!("p{i}")));
    wait_held(&producer, 10).await;
    let before = bed.checkpoint_rv(STREAM);
    bed.sim.deny(LEASES);
    eventually(
        || relay.metrics.leader.get() == 0,
        || "the leader kept relaying without its Lease".into(),
    )
    .await;
    // The queue is purged: none of it is ever delivered, and nothing is checkpointed after.
    wait_held(&producer, 0).await;
    let delivered = |log: &[Record]| log.iter().filter(|r| r.key.starts_with("a/p")).count();
    assert_eq!(delivered(&events(&producer)), 0);
    assert_eq!(bed.checkpoint_rv(STREAM), before);
    // Once it leads again it replays from its checkpoint: nothing is lost.
    producer.hold(false);
    bed.sim.allow(LEASES);
    eventually(
        || relay.metrics.leader.get() == 1,
        || "the Lease was never taken again".into(),
    )
    .await;
    wait_covered(&bed).await;
    relay.stop().await;
    assert_converged(&bed, &producer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_refused_for_size_is_retried_record_by_record() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    producer.refuse_batches_with_larger_than(8_000);
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_up(1).await;
    producer.hold(true);
    create(&bed, (0..5).map(|i| format!("p{i}")));
    let mut big = objects::pod("a", "big");
    big["metadata"]["annotations"]["blob"] = "x".repeat(10_000).into();
    bed.sim.create("pods", Some("a"), big).unwrap();
    wait_held(&producer, 6).await;
    // The whole batch is refused for the one big record; tried alone, only it is too large.
    producer.hold(false);
    producer.release(Order::Sent);
    wait_covered(&bed).await;
    relay.stop().await;
    let log = events(&producer);
    let truncated: Vec<&str> = log
        .iter()
        .filter(|r| json(r)["watchrelay"]["truncatedBytes"].is_u64())
        .map(|r| r.key.as_str())
        .collect();
    assert_eq!(truncated, ["a/big"]);
    assert_eq!(consumer_view(&log), cluster_view(&bed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_applied_with_kubectl_leave_no_data_on_any_channel() {
    let bed = bed(true).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    bed.sim.write_kubeconfig(&kubeconfig).unwrap();
    let manifest = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\n  namespace: a\ntype: Opaque\nstringData:\n  password: hunter2\ndata:\n  token: c2VjcmV0LXRva2Vu\n";
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["apply", "--validate=false", "-f", "-"])
            .output_with_stdin(manifest)
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let secret = bed.sim.get("secrets", Some("a"), "db").unwrap();
    assert!(
        secret["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .as_str()
            .is_some_and(|a| a.contains("hunter2")),
        "kubectl apply leaves the whole Secret in an annotation"
    );
    let producer = Arc::new(Memory::new());
    // A namespaced custom path and a cluster-wide one: Secrets are trimmed on every channel.
    let cfg = bed.config(
        "  - path: /api/v1/namespaces/{namespace}/secrets\n    name: secrets\n    namespaces: [a]\n    watchStrategy: perNamespace\n    topic: secrets\n  - path: /api/v1/secrets\n    name: allsecrets\n    topic: all-secrets\n",
        "",
    );
    let relay = start(&bed, cfg, &producer);
    relay.wait_up(2).await;
    eventually(
        || events(&producer).len() >= 2,
        || "the Secret was not published on both channels".into(),
    )
    .await;
    relay.stop().await;
    for r in events(&producer) {
        let text = String::from_utf8_lossy(&r.value);
        assert!(
            !text.contains("hunter2") && !text.contains("c2VjcmV0LXRva2Vu"),
            "{}: {text}",
            r.topic
        );
        let object = &json(&r)["object"];
        assert!(object.get("data").is_none() && object.get("stringData").is_none());
        assert_eq!(object["type"], "Opaque");
        assert_eq!(object["metadata"]["name"], "db");
    }
}

/// Runs a command with `input` on its standard input.
trait OutputWithStdin {
    fn output_with_stdin(&mut self, input: &str) -> std::process::Output;
}

impl OutputWithStdin for std::process::Command {
    fn output_with_stdin(&mut self, input: &str) -> std::process::Output {
        use std::io::Write;
        let mut child = self
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_with_records_kafka_never_acknowledges_ends_within_its_budget() {
    let (bed, producer, relay) = running().await;
    wait_until_saved(&bed).await;
    let before = bed.checkpoint_rv(STREAM);
    producer.hold(true);
    create(&bed, (0..5).map(|i| format!("p{i}")));
    wait_held(&producer, 5).await;
    // Never acknowledged: the stop gives up on them within its budget, checkpointing nothing
    // past them (the next start replays them).
    relay.stop().await;
    assert_eq!(bed.checkpoint_rv(STREAM), before);
    // They never land: only the replay of the next start can deliver them.
    producer.purge();
    producer.hold(false);
    assert!(events(&producer).iter().all(|r| !r.key.starts_with("a/p")));
    let relay = start(&bed, config(&bed, ""), &producer);
    wait_covered(&bed).await;
    relay.stop().await;
    assert_converged(&bed, &producer);
}

async fn recreated_under_the_same_name_while_down(watch_list: bool) {
    let bed = bed(watch_list).await;
    let producer = Arc::new(Memory::new());
    create(&bed, (0..4).map(|i| format!("p{i}")));
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_up(1).await;
    wait_covered(&bed).await;
    relay.stop().await;
    // While the relay is down p1 is deleted and created again: same name, another uid.
    bed.sim.delete("pods", Some("a"), "p1").unwrap();
    create(&bed, ["p1".to_string()]);
    bed.sim.compact();
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_counter("resyncs_total", STREAM, 1).await;
    wait_covered(&bed).await;
    relay.stop().await;
    // The old uid's DELETED comes before the new uid's ADDED on that key: the consumer ends
    // holding the new object.
    let log = events(&producer);
    assert_eq!(consumer_view(&log), cluster_view(&bed));
    let p1: Vec<(String, String)> = log
        .iter()
        .filter(|r| r.key == "a/p1")
        .map(|r| {
            let v = json(r);
            (
                v["type"].as_str().unwrap().to_string(),
                v["object"]["metadata"]["uid"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let (last_type, last_uid) = p1.last().unwrap();
    assert_eq!(last_type, "ADDED");
    assert_eq!(
        Some(last_uid.as_str()),
        cluster_view(&bed).get("a/p1").map(String::as_str)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_recreated_under_its_name_while_down_ends_alive_with_initial_events() {
    recreated_under_the_same_name_while_down(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_recreated_under_its_name_while_down_ends_alive_with_lists() {
    recreated_under_the_same_name_while_down(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_position_ahead_of_the_server_leads_to_a_relist_not_endless_retries() {
    let bed = bed(true).await;
    create(&bed, (0..5).map(|i| format!("p{i}")));
    // A checkpoint from before an etcd restore: ahead of everything the server has.
    let mut cm = objects::configmap(common::bed::CHECKPOINT_NS, common::bed::CHECKPOINT_NAME);
    cm["data"] = serde_json::json!({ (STREAM): "{\"rv\":\"999999\"}" });
    bed.sim
        .create("configmaps", Some(common::bed::CHECKPOINT_NS), cm)
        .unwrap();
    let producer = Arc::new(Memory::new());
    let relay = start(&bed, config(&bed, ""), &producer);
    relay.wait_counter("resyncs_total", STREAM, 1).await;
    // The position from before the restore is replaced by the relist's.
    bed.wait_checkpoint(|c| {
        c.get(STREAM)
            .and_then(|s| s.rv.as_ref())
            .is_some_and(|r| r.parse::<u64>().unwrap() < 999_999)
    })
    .await;
    relay.stop().await;
    assert!(bed.checkpoint_rv(STREAM).unwrap() <= bed.sim.current_rv());
    assert_eq!(consumer_view(&events(&producer)), cluster_view(&bed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_selector_reconciles_instead_of_resuming_another_querys_position() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    for (name, tier) in [("w0", "web"), ("w1", "web"), ("d0", "db"), ("d1", "db")] {
        let mut pod = objects::pod("a", name);
        pod["metadata"]["labels"]["tier"] = tier.into();
        bed.sim.create("pods", Some("a"), pod).unwrap();
    }
    let channel = |tier: &str| {
        format!("  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: pods\n    labelSelector: tier={tier}\n")
    };
    let relay = start(&bed, bed.config(&channel("web"), ""), &producer);
    relay.wait_up(1).await;
    wait_covered(&bed).await;
    relay.stop().await;
    // The same stream, another query: what no longer matches is deleted downstream, what now
    // matches is announced; the old position is not resumed.
    let relay = start(&bed, bed.config(&channel("db"), ""), &producer);
    relay.wait_up(1).await;
    eventually(
        || {
            consumer_view(&events(&producer))
                .keys()
                .all(|k| k.starts_with("a/d"))
        },
        || format!("{:?}", consumer_view(&events(&producer))),
    )
    .await;
    wait_covered(&bed).await;
    relay.stop().await;
    let view = consumer_view(&events(&producer));
    assert_eq!(
        view.keys().map(String::as_str).collect::<Vec<_>>(),
        ["a/d0", "a/d1"]
    );
    let inferred = events(&producer)
        .iter()
        .filter(|r| json(r)["watchrelay"]["synthetic"] == true)
        .count();
    assert_eq!(inferred, 2, "w0 and w1 left the query");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_leaving_the_selector_deletes_what_its_stream_announced() {
    let bed = bed(true).await;
    let label = |value: serde_json::Value| {
        bed.sim
            .merge_patch(
                "namespaces",
                None,
                "a",
                serde_json::json!({"metadata": {"labels": {"relay": value}}}),
            )
            .unwrap();
    };
    label("yes".into());
    create(&bed, (0..3).map(|i| format!("p{i}")));
    let producer = Arc::new(Memory::new());
    let cfg = bed.config(
        "  - operationId: watchNamespacedPods\n    namespaceSelector: relay=yes\n    topic: pods\n",
        "",
    );
    let relay = start(&bed, cfg, &producer);
    relay.wait_up(1).await;
    wait_covered(&bed).await;
    assert_eq!(consumer_view(&events(&producer)).len(), 3);
    // The namespace stops matching: its objects leave the consumer's view, flagged as inferred.
    label(serde_json::Value::Null);
    eventually(
        || consumer_view(&events(&producer)).is_empty(),
        || format!("still held: {:?}", consumer_view(&events(&producer))),
    )
    .await;
    bed.wait_checkpoint(|c| !c.contains_key(STREAM)).await;
    relay.stop().await;
    let deletes: Vec<serde_json::Value> = events(&producer)
        .iter()
        .map(json)
        .filter(|v| v["type"] == "DELETED")
        .collect();
    assert_eq!(deletes.len(), 3);
    assert!(deletes.iter().all(|v| v["watchrelay"]["synthetic"] == true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tombstones_a_compacted_topic_holds_exactly_the_live_objects() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    let channel = "  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: pods\n    tombstones: true\n";
    create(&bed, (0..4).map(|i| format!("p{i}")));
    let relay = start(&bed, bed.config(channel, ""), &producer);
    relay.wait_up(1).await;
    bed.sim.delete("pods", Some("a"), "p0").unwrap();
    wait_covered(&bed).await;
    relay.stop().await;
    // A deletion while the relay is down, found by a resync: inferred, and tombstoned too.
    bed.sim.delete("pods", Some("a"), "p1").unwrap();
    bed.sim.compact();
    let relay = start(&bed, bed.config(channel, ""), &producer);
    relay
        .wait_counter("synthetic_deletes_total", STREAM, 1)
        .await;
    wait_covered(&bed).await;
    relay.stop().await;
    let log = events(&producer);
    // Each DELETED is followed by a tombstone on its key.
    for (i, r) in log.iter().enumerate() {
        if !r.tombstone && json(r)["type"] == "DELETED" {
            let next = log[i + 1..].iter().find(|n| n.key == r.key).unwrap();
            assert!(next.tombstone, "{}: no tombstone after its DELETED", r.key);
        }
    }
    // What compaction keeps (the last record per key, a tombstone meaning gone) is the cluster.
    let mut compacted: BTreeMap<&str, &Record> = BTreeMap::new();
    for r in log.iter().filter(|r| r.key.starts_with("a/")) {
        compacted.insert(&r.key, r);
    }
    let live: Vec<&str> = compacted
        .iter()
        .filter(|(_, r)| !r.tombstone)
        .map(|(k, _)| *k)
        .collect();
    assert_eq!(live, ["a/p2", "a/p3"]);
    assert_converged(&bed, &producer);
}
