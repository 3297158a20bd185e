//! Deployment shapes, fast tier: a membership topic that is not what it should be, stops during
//! a restore, a flapping namespace, metric series of ended streams, a batch refused for size
//! with a newer record of its key behind it. The relay runs in-process against the simulator
//! with a producer in memory.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::bed::{eventually, Bed, Relay};
use common::view::{self, consumer_view, events};
use watchrelay::config::Config;
use watchrelay::membership::TopicState;
use watchrelay::producer::Producer as _;
use watchrelay::testing::{Memory, Order};
use watchrelay_sim::{objects, SimConfig};

async fn bed(namespaces: &[&str]) -> Bed {
    Bed::in_memory(SimConfig::default(), namespaces).await
}

fn start(bed: &Bed, cfg: Config, producer: &Arc<Memory>) -> Relay {
    Relay::start_with(bed, cfg, Some(producer.clone()))
}

fn pods_in(bed: &Bed, ns: &str) -> Config {
    bed.config(
        &format!("  - operationId: watchNamespacedPods\n    namespaces: [{ns}]\n    topic: pods\n"),
        "",
    )
}

fn selector(bed: &Bed) -> Config {
    bed.config(
        "  - operationId: watchNamespacedPods\n    namespaceSelector: relay=yes\n    topic: pods\n",
        "",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_membership_topic_that_drops_members_blocks_the_relay_naming_topic_and_property() {
    let bed = bed(&["a"]).await;
    bed.sim
        .create("pods", Some("a"), objects::pod("a", "p0"))
        .unwrap();
    let producer = Arc::new(Memory::new());
    let mut delete = TopicState::compacted(1);
    delete
        .configs
        .insert("cleanup.policy".into(), "delete".into());
    producer.set_topic(&bed.membership, delete);
    let relay = start(&bed, pods_in(&bed, "a"), &producer);
    eventually(
        || relay.registry.readiness().blocked.is_some(),
        || "the relay is not blocked".into(),
    )
    .await;
    let reason = relay.registry.readiness().blocked.unwrap();
    assert!(
        reason.contains(&bed.membership) && reason.contains("cleanup.policy=delete"),
        "{reason}"
    );
    let metrics = String::from_utf8(relay.metrics.render()).unwrap();
    assert!(
        metrics.contains("watchrelay_membership_topic_problem{reason=\"not_compacted\"} 1"),
        "{metrics}"
    );
    assert!(events(&producer).is_empty(), "nothing is relayed");
    // Fixed by an admin: the relay proceeds on its next check.
    producer.set_topic(&bed.membership, TopicState::compacted(1));
    relay.wait_up(1).await;
    assert!(relay.registry.readiness().blocked.is_none());
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_membership_topic_created_again_is_refused_not_trusted() {
    let bed = bed(&["a"]).await;
    bed.sim
        .create("pods", Some("a"), objects::pod("a", "p0"))
        .unwrap();
    let producer = Arc::new(Memory::new());
    let relay = start(&bed, pods_in(&bed, "a"), &producer);
    relay.wait_up(1).await;
    relay.stop().await;
    // The same name, another topic: none of its records (the mark included) survived.
    let fresh = Arc::new(Memory::new());
    let relay = start(&bed, pods_in(&bed, "a"), &fresh);
    eventually(
        || {
            relay
                .registry
                .readiness()
                .blocked
                .is_some_and(|r| r.contains("lacks this relay's mark"))
        },
        || format!("not refused: {:?}", relay.registry.readiness()),
    )
    .await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_a_slow_restore_ends_within_the_shutdown_budget() {
    /// How long the restore takes over each record of the membership topic.
    const PAUSE: Duration = Duration::from_millis(200);
    /// Past the budget, for this test's side: the relay's runtime joining, threads scheduled
    /// late on a loaded machine.
    const MARGIN: Duration = Duration::from_secs(1);
    let bed = bed(&["a"]).await;
    // Enough members that the whole restore lasts well past the budget (checked below).
    for i in 0..100 {
        bed.sim
            .create("pods", Some("a"), objects::pod("a", &format!("p{i}")))
            .unwrap();
    }
    let producer = Arc::new(Memory::new());
    let relay = start(&bed, pods_in(&bed, "a"), &producer);
    relay.wait_up(1).await;
    relay.stop().await;
    producer.slow_replay(PAUSE);
    let replayed = producer.replayed();
    let cfg = pods_in(&bed, "a");
    let budget = Duration::from_secs(cfg.shutdown_timeout_seconds);
    let relay = start(&bed, cfg, &producer);
    // Stopped once the restore is under way.
    eventually(
        || producer.replayed() > replayed,
        || "the restore never began".into(),
    )
    .await;
    // What is left of the restore when the stop is asked lasts longer than the budget: a stop
    // that waited for it would overrun.
    let records = producer
        .log()
        .iter()
        .filter(|r| r.topic == bed.membership)
        .count();
    let left = records - (producer.replayed() - replayed);
    assert!(
        PAUSE * u32::try_from(left).unwrap() > budget + MARGIN,
        "{left} records left to restore are too few to tell a stop that waits for them"
    );
    let asked = Instant::now();
    relay.stop().await;
    let took = asked.elapsed();
    assert!(
        took <= budget + MARGIN,
        "the stop took {took:?}, past its budget of {budget:?} (plus {MARGIN:?}): it waited for the whole restore"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_namespace_never_hangs_and_ended_streams_leave_no_series() {
    let bed = bed(&["a", "b"]).await;
    bed.label("a", true);
    bed.label("b", true);
    for ns in ["a", "b"] {
        for i in 0..5 {
            bed.sim
                .create("pods", Some(ns), objects::pod(ns, &format!("p{i}")))
                .unwrap();
        }
    }
    let producer = Arc::new(Memory::new());
    let relay = start(&bed, selector(&bed), &producer);
    relay.wait_up(2).await;
    // b's label flaps while its old stream is still leaving.
    for on in [false, true, false, true, false, true] {
        bed.label("b", on);
        // Not a wait: the flaps come 30 ms apart, faster than a stream leaves, on purpose.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let want = view::pods(&bed.sim, &["a", "b"], |_| true);
    eventually(
        || consumer_view(&events(&producer)) == want && relay.stream_up("watchNamespacedPods.b"),
        || "namespace b never came back".into(),
    )
    .await;
    // b leaves for good: its series go with it.
    bed.label("b", false);
    let want = view::pods(&bed.sim, &["a"], |_| true);
    eventually(
        || {
            let metrics = String::from_utf8(relay.metrics.render()).unwrap();
            consumer_view(&events(&producer)) == want
                && !metrics.contains("stream=\"watchNamespacedPods.b\"")
        },
        || {
            let metrics = String::from_utf8(relay.metrics.render()).unwrap();
            let left: Vec<&str> = metrics
                .lines()
                .filter(|l| l.contains("watchNamespacedPods.b"))
                .collect();
            format!("series of the ended stream remain: {left:?}")
        },
    )
    .await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_refused_for_size_keeps_the_order_of_each_key() {
    let bed = bed(&["a"]).await;
    let producer = Arc::new(Memory::new());
    producer.refuse_batches_with_larger_than(8_000);
    bed.sim
        .create("pods", Some("a"), objects::pod("a", "p0"))
        .unwrap();
    bed.sim
        .create("pods", Some("a"), objects::pod("a", "big"))
        .unwrap();
    let relay = start(&bed, pods_in(&bed, "a"), &producer);
    relay.wait_up(1).await;
    eventually(
        || consumer_view(&events(&producer)).len() == 2,
        || "the two pods never arrived".into(),
    )
    .await;
    producer.hold(true);
    // p0 changes in a batch that is refused (for big's size); p0's deletion follows in
    // another batch, which is accepted first.
    let patch = serde_json::json!({"metadata": {"labels": {"v": "2"}}});
    bed.sim.merge_patch("pods", Some("a"), "p0", patch).unwrap();
    let blob = serde_json::json!({"metadata": {"annotations": {"blob": "x".repeat(10_000)}}});
    bed.sim.merge_patch("pods", Some("a"), "big", blob).unwrap();
    eventually(
        || producer.held() == 2,
        || format!("held {}", producer.held()),
    )
    .await;
    bed.sim.delete("pods", Some("a"), "p0").unwrap();
    eventually(
        || producer.held() == 3,
        || format!("held {}", producer.held()),
    )
    .await;
    producer.release_first(2, Order::Sent);
    producer.release(Order::Sent);
    producer.hold(false);
    producer.release(Order::Sent);
    let want = view::pods(&bed.sim, &["a"], |_| true);
    eventually(
        || {
            producer.release(Order::Sent);
            consumer_view(&events(&producer)) == want
        },
        || {
            format!(
                "the consumer holds {:?}, the cluster {want:?}",
                consumer_view(&events(&producer))
            )
        },
    )
    .await;
    relay.stop().await;
}

/// Every record a retirement publishes validates as a WatchEvent: channels renamed across a
/// restart (and now over every namespace) retire their per-namespace streams, whose inferred
/// DELETEDs name their objects' kind and apiVersion like any other record (pods and
/// Deployments alike).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retirements_inferred_deletes_validate_against_the_contract() {
    let bed = bed(&["a", "b"]).await;
    for ns in ["a", "b"] {
        for i in 0..3 {
            let name = format!("x{i}");
            bed.sim
                .create("pods", Some(ns), objects::pod(ns, &name))
                .unwrap();
            bed.sim
                .create("deployments.apps", Some(ns), objects::deployment(ns, &name))
                .unwrap();
        }
    }
    let producer = Arc::new(Memory::new());
    let channels = |scope: &str| {
        bed.config(
            &format!(
                "  - operationId: watchNamespacedPods\n    {scope}\n    topic: pods\n  - operationId: watchNamespacedDeployments\n    {scope}\n    topic: deployments\n"
            ),
            "",
        )
    };
    let relay = start(&bed, channels("namespaces: [a, b]"), &producer);
    relay.wait_up(4).await;
    relay.stop().await;
    let renamed = bed.config(
        "  - operationId: watchNamespacedPods\n    name: pods\n    allNamespaces: true\n    topic: pods\n  - operationId: watchNamespacedDeployments\n    name: deployments\n    allNamespaces: true\n    topic: deployments\n",
        "",
    );
    let relay = start(&bed, renamed, &producer);
    relay.wait_up(2).await;
    relay.stop().await;
    let watch_event = common::schema::validator(&common::schema::watch_event_schema());
    let mut retracted = std::collections::BTreeSet::new();
    for r in events(&producer) {
        let v = view::json(&r);
        let errs = common::schema::errors(&watch_event, &v);
        assert!(errs.is_empty(), "{errs:?}\n{v}");
        if v["watchrelay"]["synthetic"] == true {
            retracted.insert(v["object"]["kind"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(
        retracted,
        ["Deployment".to_string(), "Pod".to_string()].into(),
        "the retired streams retracted both kinds"
    );
}

/// A retirement that fails partway is tried again whole: what it did not retract stays a
/// member, in memory and in the topic, so no later start can retract it after the stream that
/// replaced it announced the object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retirement_that_fails_partway_completes_before_anything_is_announced() {
    let bed = bed_with_five_pods_each().await;
    let producer = Arc::new(Memory::new());
    let channels = |scope: &str| pods_scoped(&bed, scope);
    let want = || view::pods(&bed.sim, &["a", "b"], |_| true);
    let relay = start(&bed, channels("namespaces: [a, b]"), &producer);
    relay.wait_up(2).await;
    relay.stop().await;
    // Renamed: the old streams are retired, and the retirement's first DELETED fails.
    let renamed = "allNamespaces: true\n    name: renamed";
    producer.fail_next_to("pods", 1);
    run_until_view(&bed, channels(renamed), &producer, want).await;
    // A later start finds nothing left to retire.
    let relay = start(&bed, channels(renamed), &producer);
    relay.wait_up(1).await;
    relay.stop().await;
    assert_eq!(consumer_view(&events(&producer)), want());
}

/// A retirement killed after its DELETEDs were acknowledged and before its membership
/// tombstones reached Kafka is done again whole at the next start, before anything is
/// announced: the cut stream's objects are retracted once more (a DELETED twice, as
/// documented), the other stream's once, and the stream that replaced them then announces
/// every object, so no key ends deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retirement_killed_between_its_deletes_and_its_tombstones_is_done_again() {
    let bed = bed_with_five_pods_each().await;
    let producer = Arc::new(Memory::new());
    let channels = |scope: &str| pods_scoped(&bed, scope);
    let want = || view::pods(&bed.sim, &["a", "b"], |_| true);
    let retracted = || {
        events(&producer)
            .iter()
            .filter(|r| view::json(r)["watchrelay"]["synthetic"] == true)
            .count()
    };
    let relay = start(&bed, channels("namespaces: [a, b]"), &producer);
    relay.wait_up(2).await;
    relay.stop().await;
    // Renamed: the old streams are retired. Their DELETEDs go through; their tombstones wait
    // in the membership topic until the relay is killed, and are lost with it.
    let renamed = "allNamespaces: true\n    name: renamed";
    producer.hold_to(Some(&bed.membership));
    let relay = start(&bed, channels(renamed), &producer);
    // The first stream's five DELETEDs, then its tombstones wait (the second stream's
    // retirement waits for them).
    eventually(
        || retracted() == 5 && producer.held() > 0,
        || {
            format!(
                "the retirement never reached its tombstones: {} DELETEDs",
                retracted()
            )
        },
    )
    .await;
    let announced = consumer_view(&events(&producer));
    assert_eq!(
        announced.len(),
        5,
        "nothing is announced while a retirement is unfinished"
    );
    relay.kill().await;
    producer.purge();
    producer.hold_to(None);
    run_until_view(&bed, channels(renamed), &producer, want).await;
    assert_eq!(retracted(), 15, "the retirement was done again whole, once");
    // Each key's history from its first retraction: the cut stream's keys retracted twice,
    // the other's once, then each announced once by the new stream, never retracted after.
    let histories = since_retracted(&events(&producer));
    assert_eq!(histories.len(), 10, "every pod was retracted");
    for (key, history) in histories {
        let twice = ["DELETED*", "DELETED*", "ADDED"];
        let want: &[&str] = if announced.contains_key(&key) {
            &twice[1..]
        } else {
            &twice
        };
        assert_eq!(history, want, "{key}");
    }
    // A later start finds nothing left to retire.
    let relay = start(&bed, channels(renamed), &producer);
    relay.wait_up(1).await;
    relay.stop().await;
    assert_eq!(retracted(), 15);
    assert_eq!(consumer_view(&events(&producer)), want());
}

/// Each key's event types from its first inferred DELETED on (`DELETED*` for an inferred one).
fn since_retracted(log: &[watchrelay::producer::Record]) -> BTreeMap<String, Vec<String>> {
    let mut histories: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in log {
        let v = view::json(r);
        let synthetic = v["watchrelay"]["synthetic"] == true;
        let history = histories.get_mut(&r.key);
        match (synthetic, history) {
            (true, None) => {
                histories.insert(r.key.clone(), vec!["DELETED*".into()]);
            }
            (true, Some(h)) => h.push("DELETED*".into()),
            (false, Some(h)) => h.push(v["type"].as_str().unwrap_or_default().into()),
            (false, None) => {}
        }
    }
    histories
}

/// Runs a relay with `cfg` until the consumer's view of `producer`'s records is `want()`, then
/// stops it.
async fn run_until_view(
    bed: &Bed,
    cfg: Config,
    producer: &Arc<Memory>,
    want: impl Fn() -> BTreeMap<String, String>,
) {
    let relay = start(bed, cfg, producer);
    relay.wait_up(1).await;
    eventually(
        || consumer_view(&events(producer)) == want(),
        || "the relay never converged".into(),
    )
    .await;
    relay.stop().await;
}

/// Namespaces `a` and `b`, with five pods each (`x0` to `x4`).
async fn bed_with_five_pods_each() -> Bed {
    let bed = bed(&["a", "b"]).await;
    for ns in ["a", "b"] {
        for i in 0..5 {
            bed.sim
                .create("pods", Some(ns), objects::pod(ns, &format!("x{i}")))
                .unwrap();
        }
    }
    bed
}

/// One pods channel on topic `pods` over `scope` (its YAML line).
fn pods_scoped(bed: &Bed, scope: &str) -> Config {
    bed.config(
        &format!("  - operationId: watchNamespacedPods\n    {scope}\n    topic: pods\n"),
        "",
    )
}

/// Namespaces `a` and `b`, with a pod each.
async fn bed_with_a_pod_each() -> Bed {
    let bed = bed(&["a", "b"]).await;
    for ns in ["a", "b"] {
        bed.sim
            .create("pods", Some(ns), objects::pod(ns, "p0"))
            .unwrap();
    }
    bed
}

/// Waits until `relay` refuses stream `id` for another release's claims.
async fn refused(relay: &Relay, id: &str) {
    relay.wait_problem(id, "another release").await;
}

/// Two releases whose scopes overlap on one topic would interleave on each key: the release
/// that finds the other's live members on its topic, in its namespace, refuses that stream and
/// says why; a release on another namespace of the same topic runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_refuses_a_topic_and_namespace_another_release_announced_on() {
    let bed = bed_with_a_pod_each().await;
    let producer = Arc::new(Memory::new());
    let first = start(&bed, pods_in(&bed, "a"), &producer);
    first.wait_up(1).await;
    first.stop().await;
    let other = |ns: &str| {
        let mut cfg = pods_in(&bed, ns);
        cfg.checkpoint.name = "relay-b".into();
        cfg
    };
    let overlapping = start(&bed, other("a"), &producer);
    refused(&overlapping, "watchNamespacedPods.a").await;
    overlapping.stop().await;
    let disjoint = start(&bed, other("b"), &producer);
    disjoint.wait_up(1).await;
    disjoint.stop().await;
    assert_eq!(
        consumer_view(&events(&producer)),
        view::pods(&bed.sim, &["a", "b"], |_| true)
    );
}

/// The overlap check reads past its own topic: a sharded release sees a single leader's
/// claims (in the single-leader topic), and a single leader sees a sharded release's (in
/// every partition of the shards' topic).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_sees_the_claims_of_releases_of_the_other_kind() {
    let bed = bed_with_a_pod_each().await;
    let producer = Arc::new(Memory::new());
    let named = |mut cfg: Config, name: &str| {
        cfg.checkpoint.name = name.into();
        cfg.leader_election.name = name.into();
        cfg
    };
    // A single leader on a, then a sharded release on a.
    let single = start(&bed, pods_in(&bed, "a"), &producer);
    single.wait_up(1).await;
    single.stop().await;
    let group = watchrelay::testing::MemoryGroup::default();
    let cfg = common::bed::sharded(named(pods_in(&bed, "a"), "relay-b"), 4);
    let shards_topic = cfg.sharding.topic.clone();
    let sharded = Relay::start_in(&bed, cfg, producer.clone(), &group);
    refused(&sharded, "watchNamespacedPods.a").await;
    sharded.stop().await;
    // A sharded release on b, then a single leader on b.
    let group = watchrelay::testing::MemoryGroup::default();
    let cfg = common::bed::sharded(named(pods_in(&bed, "b"), "relay-c"), 4);
    let sharded = Relay::start_in(&bed, cfg, producer.clone(), &group);
    sharded.wait_up(1).await;
    sharded.stop().await;
    let mut cfg = named(pods_in(&bed, "b"), "relay-d");
    cfg.sharding.topic = shards_topic;
    let single = start(&bed, cfg, &producer);
    refused(&single, "watchNamespacedPods.b").await;
    single.stop().await;
}
