//! What a consumer holds, and what the cluster holds, for comparing the two.

use std::collections::BTreeMap;

use watchrelay::envelope::Record;
use watchrelay::producer::Memory;

use super::bed::Bed;

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
    bed: &Bed,
    namespaces: &[&str],
    keep: impl Fn(&serde_json::Value) -> bool,
) -> BTreeMap<String, String> {
    namespaces
        .iter()
        .flat_map(|ns| bed.sim.list("pods", Some(ns)))
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
