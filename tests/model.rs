//! Model-based: the consumer's promise under random histories.
//!
//! Each case draws, from its seed, a history of cluster operations (create, modify, delete,
//! recreate under the same name, moving a pod in and out of the label selector, moving a
//! namespace in and out of the namespace selector, compacting history so positions expire,
//! cutting watches and syncs), interleaved with relay runs. A run ends in a clean stop or in a
//! crash at a random point, with Kafka having written a random prefix of what was sent: before
//! or after acknowledgements, between a membership record and its event. Between runs the
//! configuration may change (the label selector on or off). After the history, one clean run:
//! the view built by applying every delivered record key by key must equal what the cluster
//! holds in scope.
//!
//! `WATCHRELAY_MODEL_CASES` sets the cases per test (default 6); `WATCHRELAY_MODEL_SEED` runs one
//! case. A failing case prints its seed and history.

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use common::bed::{Bed, Relay};
use common::view::{self, consumer_view, events, json};
use watchrelay::config::Config;
use watchrelay::producer::{Memory, Order, Producer};
use watchrelay_sim::{objects, SimConfig};

const NAMESPACES: [&str; 2] = ["a", "b"];
const NAMES: u64 = 6;

/// xorshift: reproducible from the seed, spread enough for a history.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<'a>(&mut self, of: &[&'a str]) -> &'a str {
        of[self.below(of.len() as u64) as usize]
    }
}

fn config(bed: &Bed, selector: bool) -> Config {
    let labels = if selector {
        "    labelSelector: tier=web\n"
    } else {
        ""
    };
    bed.config(
        &format!("  - operationId: watchNamespacedPods\n    namespaceSelector: relay=yes\n    topic: pods\n{labels}"),
        "",
    )
}

fn label_namespace(bed: &Bed, ns: &str, on: bool) {
    let value = if on {
        "yes".into()
    } else {
        serde_json::Value::Null
    };
    bed.sim
        .merge_patch(
            "namespaces",
            None,
            ns,
            serde_json::json!({"metadata": {"labels": {"relay": value}}}),
        )
        .unwrap();
}

fn pod(ns: &str, name: &str, tier: &str) -> serde_json::Value {
    let mut p = objects::pod(ns, name);
    p["metadata"]["labels"]["tier"] = tier.into();
    p
}

/// One random cluster operation; returns what it did.
fn operate(bed: &Bed, rng: &mut Rng) -> String {
    let ns = rng.pick(&NAMESPACES);
    let name = format!("p{}", rng.below(NAMES));
    let tier = rng.pick(&["web", "db"]);
    let exists = bed.sim.get("pods", Some(ns), &name).is_some();
    match rng.below(10) {
        0..=2 if exists => {
            bed.sim.delete("pods", Some(ns), &name).unwrap();
            bed.sim
                .create("pods", Some(ns), pod(ns, &name, tier))
                .unwrap();
            format!("recreate {ns}/{name} {tier}")
        }
        0..=2 => {
            bed.sim
                .create("pods", Some(ns), pod(ns, &name, tier))
                .unwrap();
            format!("create {ns}/{name} {tier}")
        }
        3..=4 if exists => {
            let patch = serde_json::json!({"metadata": {"labels": {"tier": tier}}});
            bed.sim.merge_patch("pods", Some(ns), &name, patch).unwrap();
            format!("label {ns}/{name} {tier}")
        }
        5..=6 if exists => {
            bed.sim.delete("pods", Some(ns), &name).unwrap();
            format!("delete {ns}/{name}")
        }
        7 => {
            let on = rng.chance(50);
            label_namespace(bed, ns, on);
            format!("namespace {ns} in scope: {on}")
        }
        8 => {
            bed.sim.compact();
            "compact".into()
        }
        9 => {
            bed.sim.drop_watches();
            "cut watches".into()
        }
        _ => "nothing".into(),
    }
}

/// What a consumer must end with: the pods in scope, key -> uid.
fn in_scope(bed: &Bed, selector: bool) -> BTreeMap<String, String> {
    let namespaces: Vec<&str> = NAMESPACES
        .iter()
        .copied()
        .filter(|ns| {
            bed.sim
                .get("namespaces", None, ns)
                .is_some_and(|n| n["metadata"]["labels"]["relay"] == "yes")
        })
        .collect();
    view::pods(&bed.sim, &namespaces, |p| {
        !selector || p["metadata"]["labels"]["tier"] == "web"
    })
}

async fn case(seed: u64) {
    let mut rng = Rng(seed | 1);
    let watch_list = rng.chance(50);
    let bed = Bed::in_memory(
        SimConfig {
            watch_list,
            ..SimConfig::default()
        },
        &NAMESPACES,
    )
    .await;
    for ns in NAMESPACES {
        label_namespace(&bed, ns, true);
    }
    let producer = Arc::new(Memory::new());
    let mut history = format!("seed {seed}: initial events {watch_list}\n");
    let mut selector = false;
    for _ in 0..2 + rng.below(3) {
        selector = rng.chance(50);
        let _ = writeln!(history, "start, label selector {selector}");
        let relay = Relay::start_with(
            &bed,
            config(&bed, selector),
            Some(producer.clone() as Arc<dyn Producer>),
        );
        let hold_at = rng.below(8);
        for i in 0..rng.below(10) {
            if i == hold_at {
                producer.hold(true);
                let _ = writeln!(history, "  kafka stops acknowledging");
            }
            let _ = writeln!(history, "  {}", operate(&bed, &mut rng));
            tokio::time::sleep(Duration::from_millis(rng.below(40))).await;
        }
        if rng.chance(60) {
            let written = rng.below(producer.held() as u64 + 1) as usize;
            let _ = writeln!(
                history,
                "crash: kafka wrote {written} of {} held",
                producer.held()
            );
            producer.release_first(written, Order::Shuffled(rng.next()));
            relay.kill().await;
            producer.purge();
        } else {
            let _ = writeln!(history, "clean stop");
            producer.hold(false);
            producer.release(Order::Sent);
            relay.stop().await;
        }
        producer.hold(false);
        for _ in 0..rng.below(4) {
            let _ = writeln!(history, "  down: {}", operate(&bed, &mut rng));
        }
    }
    if rng.chance(50) {
        selector = !selector;
    }
    let _ = writeln!(history, "final run, label selector {selector}");
    let relay = Relay::start_with(
        &bed,
        config(&bed, selector),
        Some(producer.clone() as Arc<dyn Producer>),
    );
    let want = in_scope(&bed, selector);
    let mut converged = false;
    for _ in 0..300 {
        if consumer_view(&events(&producer)) == want {
            converged = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    relay.stop().await;
    if !converged {
        let mut records = String::new();
        for r in events(&producer) {
            let v = json(&r);
            let _ = writeln!(
                records,
                "  {} {} {}{}",
                r.key,
                v["type"].as_str().unwrap_or("null"),
                v["object"]["metadata"]["uid"].as_str().unwrap_or(""),
                if v["watchrelay"]["synthetic"] == true {
                    " inferred"
                } else {
                    ""
                }
            );
        }
        panic!(
            "the consumer's view is not the cluster's\n{history}records:\n{records}consumer {:?}\ncluster  {want:?}\nreproduce: WATCHRELAY_MODEL_SEED={seed} cargo test --test model",
            consumer_view(&events(&producer))
        );
    }
}

fn seeds(salt: u64) -> Vec<u64> {
    if let Ok(seed) = std::env::var("WATCHRELAY_MODEL_SEED") {
        return vec![seed.parse().expect("WATCHRELAY_MODEL_SEED is a number")];
    }
    let cases: u64 = std::env::var("WATCHRELAY_MODEL_CASES")
        .ok()
        .map(|n| n.parse().expect("WATCHRELAY_MODEL_CASES is a number"))
        .unwrap_or(6);
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    (0..cases)
        .map(|i| base ^ (salt << 32) ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_histories_with_crashes_converge() {
    for seed in seeds(1) {
        case(seed).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_random_histories_with_crashes_converge() {
    for seed in seeds(2) {
        case(seed).await;
    }
}
