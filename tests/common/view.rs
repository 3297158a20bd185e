//! What a consumer holds, and what the cluster holds, for comparing the two.

use std::collections::BTreeMap;

use watchrelay::envelope::Record;
use watchrelay::producer::Memory;

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
    let mut view = BTreeMap::new();
    for r in log {
        if r.tombstone {
            view.remove(&r.key);
            continue;
        }
        let v = json(r);
        match v["type"].as_str().unwrap() {
            "ADDED" | "MODIFIED" => {
                let uid = v["object"]["metadata"]["uid"].as_str().unwrap();
                view.insert(r.key.clone(), uid.to_string());
            }
            "DELETED" => {
                view.remove(&r.key);
            }
            _ => {}
        }
    }
    view
}

/// The pods of `namespaces` that `keep` accepts, as the consumer would key them: key -> uid.
pub fn pods(
    sim: &Sim,
    namespaces: &[&str],
    keep: impl Fn(&serde_json::Value) -> bool,
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
                md["uid"].as_str().unwrap().to_string(),
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
