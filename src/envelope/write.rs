//! Writing records: the envelope around the object's bytes (copied, never re-encoded), its
//! CloudEvents headers, and the records standing in for others (references, retractions,
//! tombstones).

use crate::config::KeyTemplate;
use crate::event::{EventType, Meta};
use crate::producer::{Headers, Record};

use super::objects::reference_object;
use super::{Announcement, Route, SchemaIds, SchemaTag};

/// The record announcing `a` with `object` (the object's JSON as it leaves the cluster),
/// written into `value` (cleared first) so a caller can reuse one buffer.
pub fn record(route: &Route, a: &Announcement, object: &[u8], mut value: Vec<u8>) -> Record {
    write_envelope(&mut value, route, a, object, None);
    record_of_value(route, a, value)
}

/// The record announcing `a` whose envelope is `value` (as [`record`] wrote it).
pub fn record_of_value(route: &Route, a: &Announcement, value: Vec<u8>) -> Record {
    let key = key(route, a);
    Record {
        topic: route.topic.clone(),
        headers: cloudevents_headers(route, a, &key),
        key,
        value,
        tombstone: false,
        partition: None,
    }
}

/// The Kafka key of `a`: by the route's template, or the stream for bookmarks.
fn key(route: &Route, a: &Announcement) -> String {
    match a.event_type {
        EventType::Bookmark => a.meta.name().to_string(),
        _ => route.key.render(&a.meta),
    }
}

/// The record standing in for `a` when its whole record (`original_bytes` long) is too large:
/// the object reduced to its identity, `truncatedBytes` set, sent to `topic`.
pub fn reference(route: &Route, a: &Announcement, original_bytes: usize, topic: &str) -> Record {
    let mut value = Vec::new();
    let object = reference_object(&a.meta);
    write_envelope(&mut value, route, a, &object, Some(original_bytes));
    let key = key(route, a);
    let mut headers = cloudevents_headers(route, a, &key);
    headers.push("ce_truncatedbytes", &[&original_bytes.to_string()]);
    Record {
        topic: topic.to_string(),
        key,
        value,
        headers,
        tombstone: false,
        partition: None,
    }
}

/// The inferred DELETED of `meta` retracting it from `topic` under `key`, where it was
/// announced, whatever `route` would key it by now; in `era`. Its schema ids are the route's
/// only in the route's own topic: another topic's schema is not the route's to name.
pub fn retraction(route: &Route, meta: Meta, rv: &str, topic: &str, key: &str, era: u64) -> Record {
    let route = Route {
        topic: topic.to_string(),
        key: KeyTemplate::fixed(key),
        schema: route.schema.clone().filter(|_| topic == route.topic),
        ..route.clone()
    };
    let object = reference_object(&meta);
    let mut a = Announcement::inferred_delete(meta, rv);
    a.era = era;
    record(&route, &a, &object, Vec::new())
}

/// `watchrelay.version` of a record in stream era `era` at `watchrelay.resourceVersion` `rv`:
/// `era × 2^64 + rv`, or `None` when `rv` is not a number (an API server not backed by etcd).
///
/// Within one era a key's records come from one stream reading one history of the cluster, in
/// which every change and every list has a higher resourceVersion than what came before it, so
/// versions grow with them. A stream takes a new era ([`next_era`]) whenever it announces
/// from scratch what may not continue that history: a sync without a position, a full resync
/// (requested, or after any sign of an etcd restore), the forgetting of its position (leaving
/// its scope, a changed query), its retirement. Eras are stamped from the clock, above the
/// floor of the stream's checkpoint ConfigMap (see [`crate::checkpoint::ERA_FLOOR_ANNOTATION`]),
/// so a key's versions never go back, even when the cluster's history does, the key moves to
/// another stream, or the clocks of two replicas disagree.
pub fn version(era: u64, rv: &str) -> Option<u128> {
    let rv: u64 = rv.parse().ok()?;
    Some((u128::from(era) << 64) | u128::from(rv))
}

/// The era a stream takes after `previous` (see [`version`]): the clock's milliseconds since
/// 1970, above `previous` and above every era this process gave out before, so that a stream
/// started right after another retired (a watch strategy switched) is in a later era. Across
/// processes, `previous` carries the floor (the highest era the checkpoint ConfigMap held), so
/// a replica whose clock is behind still goes up.
pub fn next_era(previous: u64) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let floor = previous.saturating_add(1);
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let era = now.max(floor).max(last.saturating_add(1));
        match LAST.compare_exchange_weak(last, era, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return era,
            Err(seen) => last = seen,
        }
    }
}

/// The tombstone following the DELETED `a` on a channel with `tombstones`: the same key, a null
/// value, so a compacted topic holds exactly the live objects.
pub fn tombstone(route: &Route, a: &Announcement) -> Record {
    Record {
        topic: route.topic.clone(),
        key: key(route, a),
        value: Vec::new(),
        headers: Headers::default(),
        tombstone: true,
        partition: None,
    }
}

/// Appends `s` as the inside of a JSON string, escaped exactly as serde_json escapes it.
fn push_escaped(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.extend_from_slice(s.as_bytes());
    } else {
        let quoted = serde_json::to_vec(s).expect("serializing a string cannot fail");
        out.extend_from_slice(&quoted[1..quoted.len() - 1]);
    }
}

/// Writes the envelope `{"type":..,"object":..,"watchrelay":{..}}` of `a` into `out` (cleared
/// first). The `watchrelay` metadata, in this order: `id`, the route's constant members
/// ([`Rendered`]), `resourceVersion`, `observedAt`, `resync`, `synthetic` and, for a reference,
/// `truncatedBytes`.
fn write_envelope(
    out: &mut Vec<u8>,
    route: &Route,
    a: &Announcement,
    object: &[u8],
    truncated_bytes: Option<usize>,
) {
    let flag = |b: bool| -> &'static [u8] {
        if b {
            b"true"
        } else {
            b"false"
        }
    };
    out.clear();
    out.reserve(object.len() + 400);
    if let Some(tag) = route.schema.as_deref().filter(|t| t.prefix) {
        // Confluent's wire format: a zero byte, the schema's id (4 bytes, big-endian).
        out.push(0);
        out.extend_from_slice(&tag.ids().map_or(0, |ids| ids.id).to_be_bytes());
    }
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(a.event_type.as_str().as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(object);
    out.extend_from_slice(b",\"watchrelay\":{\"id\":\"");
    for part in a.id_parts() {
        push_escaped(out, part);
    }
    out.extend_from_slice(b"\",");
    out.extend_from_slice(route.rendered());
    out.extend_from_slice(b",\"resourceVersion\":\"");
    push_escaped(out, a.resource_version());
    if let Some(v) = version(a.era, a.resource_version()) {
        out.extend_from_slice(b"\",\"version\":\"");
        out.extend_from_slice(v.to_string().as_bytes());
    }
    out.extend_from_slice(b"\",\"observedAt\":\"");
    push_escaped(out, a.observed_at.as_str());
    out.extend_from_slice(b"\",\"resync\":");
    out.extend_from_slice(flag(a.resync));
    out.extend_from_slice(b",\"synthetic\":");
    out.extend_from_slice(flag(a.synthetic));
    if let Some(n) = truncated_bytes {
        out.extend_from_slice(b",\"truncatedBytes\":");
        out.extend_from_slice(n.to_string().as_bytes());
    }
    out.extend_from_slice(b"}}");
}

/// CloudEvents Kafka protocol binding headers, binary mode: the value is the event data, its
/// `datacontenttype` is the `content-type` header, and the partitioning extension's
/// `partitionkey` is the Kafka key. Written from borrowed parts into one buffer.
fn cloudevents_headers(route: &Route, a: &Announcement, key: &str) -> Headers {
    let mut h =
        Headers::with_capacity(route.source.len() + route.dataschema.len() + 2 * key.len() + 200);
    h.push("ce_specversion", &["1.0"]);
    h.push("ce_id", &a.id_parts());
    h.push("ce_source", &[&route.source]);
    h.push(
        "ce_type",
        &["io.watchrelay.", &route.message, ".", a.event_type.as_str()],
    );
    h.push("ce_time", &[a.observed_at.as_str()]);
    h.push("content-type", &["application/json"]);
    h.push("ce_dataschema", &[&route.dataschema]);
    h.push("ce_partitionkey", &[key]);
    h.push("ce_resourceversion", &[a.resource_version()]);
    if let Some(v) = version(a.era, a.resource_version()) {
        h.push("ce_version", &[&v.to_string()]);
    }
    h.push("ce_operationid", &[&route.operation_id]);
    h.push("ce_cluster", &[&route.cluster]);
    // `namespace/name`, or `name` (`Meta::key`), when not empty.
    match a.meta.namespace() {
        Some(ns) => h.push("ce_subject", &[ns, "/", a.meta.name()]),
        None if !a.meta.name().is_empty() => h.push("ce_subject", &[a.meta.name()]),
        None => {}
    }
    if a.resync {
        h.push("ce_resync", &["true"]);
    }
    if let Some(owner) = route.owner {
        h.push("ce_shard", &[&owner.shard.to_string()]);
        h.push("ce_ownerepoch", &[&owner.epoch.to_string()]);
    }
    if a.synthetic {
        h.push("ce_synthetic", &["true"]);
    }
    if let Some(ids) = route.schema.as_deref().and_then(SchemaTag::ids) {
        schema_headers(&mut h, ids);
    }
    h
}

/// The schema registry's ids, in the header forms registry-aware readers look for: Apicurio's
/// ids as 8-byte big-endian numbers.
fn schema_headers(h: &mut Headers, ids: SchemaIds) {
    if let Some(id) = ids.global_id {
        h.push_bytes("apicurio.value.globalId", &id.to_be_bytes());
    }
    if let Some(id) = ids.content_id {
        h.push_bytes("apicurio.value.contentId", &id.to_be_bytes());
    }
}
