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

/// A record's value as JSON, read past Confluent's framing (a zero byte and the 4-byte schema
/// id, with `schemaRegistry.wireFormat: confluent`).
pub fn json(r: &Record) -> serde_json::Value {
    let value = match r.value.first() {
        Some(0) if r.value.len() > 5 => &r.value[5..],
        _ => &r.value[..],
    };
    serde_json::from_slice(value).expect("records are JSON")
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

/// The view of a consumer that keeps, per key, the record with the highest
/// `watchrelay.version` (as `ReplacingMergeTree(version, is_deleted)` does), not the last one:
/// a key whose highest record is a DELETED is absent. `what` describes the object kept.
pub fn version_view_by(
    log: &[Record],
    what: impl Fn(&serde_json::Value) -> String,
) -> BTreeMap<String, String> {
    highest_view_by(log, "version", what)
}

/// The view of a consumer that keeps, per key, the record with the highest `watchrelay.<by>`
/// (a decimal number); the first of two equal ones, so that two different changes of a key
/// under one version (which a table's merge would keep either of) fail the comparison.
pub fn highest_view_by(
    log: &[Record],
    by: &str,
    what: impl Fn(&serde_json::Value) -> String,
) -> BTreeMap<String, String> {
    let mut highest: BTreeMap<String, (u128, Option<String>)> = BTreeMap::new();
    for r in log.iter().filter(|r| !r.tombstone) {
        let v = json(r);
        let live = match v["type"].as_str().unwrap() {
            "ADDED" | "MODIFIED" => true,
            "DELETED" => false,
            _ => continue,
        };
        let order: u128 = v["watchrelay"][by]
            .as_str()
            .unwrap_or_else(|| panic!("a record without watchrelay.{by}: {v}"))
            .parse()
            .unwrap();
        let kept = highest.entry(r.key.clone()).or_insert((0, None));
        if order > kept.0 || kept.0 == 0 {
            *kept = (order, live.then(|| what(&v["object"]["metadata"])));
        }
    }
    highest
        .into_iter()
        .filter_map(|(k, (_, o))| Some((k, o?)))
        .collect()
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

/// Asserts every change of `journal` has its record in `log`: every change the relay saw or
/// could still see after its positions, whose `watchrelay.id` is the change's `uid/rv`, and
/// each object's changes first published in the order the server made them (see
/// [`disordered`]). A failure names the first few missing or out of order and ends with
/// `context`.
pub fn assert_published(log: &[Record], journal: &[watchrelay_sim::JournalEntry], context: &str) {
    let lost = unpublished(log, journal);
    assert!(
        lost.is_empty(),
        "{} of {} changes never published, e.g. {:?}\n{context}",
        lost.len(),
        journal.len(),
        &lost[..lost.len().min(5)]
    );
    let late = disordered(log, journal);
    assert!(
        late.is_empty(),
        "{} changes first published after a later change of their object, e.g. {:?}\n{context}",
        late.len(),
        &late[..late.len().min(5)]
    );
}

/// The changes of `journal` whose first record in `log` comes after the first record of a
/// later change of the same object (resource, namespace and name, across recreations), as
/// `uid/rv after uid/rv`: a consumer applying the key's records in order would have held the
/// later state before the earlier one. A change published again (a redelivery) is judged by
/// its first record; changes never published are [`unpublished`]'s.
pub fn disordered(log: &[Record], journal: &[watchrelay_sim::JournalEntry]) -> Vec<String> {
    let ids = log
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.tombstone)
        .filter_map(|(i, r)| Some((json(r)["watchrelay"]["id"].as_str()?.to_string(), i)));
    out_of_order(ids, journal)
}

/// [`disordered`] over records' ids at positions that order each key's records (an index in
/// one log, or a partition and offset).
pub fn out_of_order<P: Ord + Copy>(
    ids: impl IntoIterator<Item = (String, P)>,
    journal: &[watchrelay_sim::JournalEntry],
) -> Vec<String> {
    let mut first: std::collections::HashMap<String, P> = std::collections::HashMap::new();
    for (id, at) in ids {
        first
            .entry(id)
            .and_modify(|p| *p = (*p).min(at))
            .or_insert(at);
    }
    type Object<'a> = (&'a str, Option<&'a str>, &'a str);
    let mut by_object: BTreeMap<Object<'_>, Vec<&watchrelay_sim::JournalEntry>> = BTreeMap::new();
    for e in journal {
        by_object
            .entry((e.resource.as_str(), e.namespace.as_deref(), e.name.as_str()))
            .or_default()
            .push(e);
    }
    let mut late = Vec::new();
    for mut changes in by_object.into_values() {
        changes.sort_by_key(|e| e.rv);
        // The latest first publication among the object's earlier changes.
        let mut seen: Option<(P, String)> = None;
        for e in changes {
            let id = format!("{}/{}", e.uid, e.rv);
            let Some(&at) = first.get(&id) else { continue };
            match &seen {
                Some((before, by)) if *before > at => late.push(format!("{id} after {by}")),
                _ => seen = Some((at, id)),
            }
        }
    }
    late
}

/// The changes of `journal` that no record of `log` published, as `uid/rv (type key)`.
pub fn unpublished(log: &[Record], journal: &[watchrelay_sim::JournalEntry]) -> Vec<String> {
    let ids: std::collections::HashSet<String> = log
        .iter()
        .filter(|r| !r.tombstone)
        .filter_map(|r| json(r)["watchrelay"]["id"].as_str().map(str::to_string))
        .collect();
    journal
        .iter()
        .filter(|e| !ids.contains(&format!("{}/{}", e.uid, e.rv)))
        .map(|e| {
            format!(
                "{}/{} ({} {}/{})",
                e.uid,
                e.rv,
                e.event_type,
                e.namespace.as_deref().unwrap_or(""),
                e.name
            )
        })
        .collect()
}

/// The records of `log` published more than once (by `watchrelay.id`), with their counts.
pub fn repeated(log: &[Record]) -> Vec<(String, usize)> {
    let mut copies: BTreeMap<String, usize> = BTreeMap::new();
    for r in log.iter().filter(|r| !r.tombstone) {
        if let Some(id) = json(r)["watchrelay"]["id"].as_str() {
            *copies.entry(id.to_string()).or_default() += 1;
        }
    }
    copies.into_iter().filter(|(_, n)| *n > 1).collect()
}
