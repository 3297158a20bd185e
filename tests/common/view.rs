//! What a consumer holds, and what the cluster holds, for comparing the two.

use std::collections::BTreeMap;

use watchrelay::producer::Record;
use watchrelay::testing::Memory;

use watchrelay_sim::Sim;

use super::kafka::Msg;

/// The records a consumer of the channels' topics reads: everything but the membership topic.
pub fn events(producer: &Memory) -> Vec<Record> {
    producer
        .log()
        .into_iter()
        .filter(|r| !r.topic.starts_with("membership-"))
        .collect()
}

pub fn json(r: &Record) -> serde_json::Value {
    serde_json::from_slice(&r.value).expect("records are JSON")
}

/// What a consumer holds after applying every record key by key: key -> uid.
pub fn consumer_view(log: &[Record]) -> BTreeMap<String, String> {
    consumer_view_by(log, |md| md["uid"].as_str().unwrap().to_string())
}

/// What a consumer holds key by key, each object as `what` describes its metadata.
pub fn consumer_view_by(
    log: &[Record],
    what: impl Fn(&serde_json::Value) -> String,
) -> BTreeMap<String, String> {
    let mut view = BTreeMap::new();
    for r in log {
        if r.tombstone {
            view.remove(&r.key);
            continue;
        }
        let v = json(r);
        match v["type"].as_str().unwrap() {
            "ADDED" | "MODIFIED" => {
                view.insert(r.key.clone(), what(&v["object"]["metadata"]));
            }
            "DELETED" => {
                view.remove(&r.key);
            }
            _ => {}
        }
    }
    view
}

/// An object's uid and resourceVersion: which version of which object.
pub fn version(md: &serde_json::Value) -> String {
    format!(
        "{}@{}",
        md["uid"].as_str().unwrap(),
        md["resourceVersion"].as_str().unwrap()
    )
}

/// The pods of `namespaces` that `keep` accepts, as the consumer would key them: key -> uid.
pub fn pods(
    sim: &Sim,
    namespaces: &[&str],
    keep: impl Fn(&serde_json::Value) -> bool,
) -> BTreeMap<String, String> {
    pods_by(sim, namespaces, keep, |md| {
        md["uid"].as_str().unwrap().to_string()
    })
}

/// The pods of `namespaces` that `keep` accepts, keyed as the consumer would key them, each as
/// `what` describes its metadata.
pub fn pods_by(
    sim: &Sim,
    namespaces: &[&str],
    keep: impl Fn(&serde_json::Value) -> bool,
    what: impl Fn(&serde_json::Value) -> String,
) -> BTreeMap<String, String> {
    namespaces
        .iter()
        .flat_map(|ns| sim.list("pods", Some(ns)))
        .filter(|p| keep(p))
        .map(|p| {
            let md = &p["metadata"];
            (
                format!(
                    "{}/{}",
                    md["namespace"].as_str().unwrap(),
                    md["name"].as_str().unwrap()
                ),
                what(md),
            )
        })
        .collect()
}

/// What a consumer holds after applying the records of each key in partition order: key -> uid.
pub fn kafka_view(msgs: &[Msg]) -> BTreeMap<String, String> {
    let mut by_partition: BTreeMap<i32, Vec<&Msg>> = BTreeMap::new();
    for m in msgs {
        by_partition.entry(m.partition).or_default().push(m);
    }
    let mut view = BTreeMap::new();
    for (_, mut msgs) in by_partition {
        msgs.sort_by_key(|m| m.offset);
        for m in msgs {
            let Some(key) = &m.key else { continue };
            match m.value["type"].as_str() {
                Some("ADDED" | "MODIFIED") => {
                    let uid = m.value["object"]["metadata"]["uid"].as_str().unwrap();
                    view.insert(key.clone(), uid.to_string());
                }
                Some("DELETED") => {
                    view.remove(key);
                }
                _ => {}
            }
        }
    }
    view
}
