//! Pure record assembly: one announcement in, one Kafka record out.
//!
//! The object bytes come from [`crate::decode`] already trimmed; the envelope is written around
//! them by copying, never by re-encoding the object.
//!
//! # What an envelope guarantees
//! - The top level validates against the AsyncAPI `WatchEvent` schema: `type` and `object`.
//! - `watchrelay.id` is deterministic: the same change of the same object always has the same
//!   id (`{uid}/{resourceVersion}`), so consumers can drop the duplicates that at-least-once
//!   delivery allows. A resync re-announcement of an unchanged object repeats the id of the
//!   event that last announced it.
//! - `watchrelay.synthetic` marks DELETED events that the relay inferred (the object vanished
//!   while the stream could not see it); `watchrelay.resync` marks events produced by a relist.
//! - An event too large for Kafka is replaced by a reference: the same envelope and headers with
//!   the object reduced to its identity and `watchrelay.truncatedBytes` set.
//! - Nothing promises that a consumer sees every intermediate state: Kubernetes itself may
//!   coalesce changes, and after a 410 only the current state is re-announced.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::config::{Channel, KeyTemplate};
use crate::decode::{ObjectMeta, Trim};
use crate::event::EventType;
use crate::producer::{Headers, Record};

/// The id of the AsyncAPI document a configuration publishes for `cluster`.
pub fn document_id(cluster: &str) -> String {
    format!("urn:watchrelay:{cluster}:asyncapi")
}

/// Name of a channel's envelope schema under the document's `components.schemas`.
pub(crate) fn envelope_schema(channel: &str) -> String {
    format!("{channel}.envelope")
}

/// Where a channel's envelope schema is in the document: the `ce_dataschema` of its records.
pub fn payload_uri(cluster: &str, channel: &str) -> String {
    format!(
        "{}#/components/schemas/{}",
        document_id(cluster),
        envelope_schema(channel)
    )
}

/// What every record of one stream shares.
#[derive(Clone, Debug, Default)]
pub struct Route {
    pub topic: String,
    /// How records are keyed.
    pub key: KeyTemplate,
    /// CloudEvents `dataschema`: the envelope's schema in the stream's AsyncAPI document.
    pub dataschema: String,
    /// CloudEvents `source`: `/clusters/{cluster}` and the collection path.
    pub source: String,
    /// The channel's path template.
    pub channel: String,
    pub operation_id: String,
    pub message: String,
    pub cluster: String,
    /// The stream's namespace, absent for cluster-wide streams.
    pub namespace: Option<String>,
    /// The envelope metadata made of the fields above, rendered on first use.
    pub rendered: Rendered,
}

/// The part of a route's `watchrelay` envelope metadata that is the same in every record:
/// `"channel":..,"operationId":..,"message":..,"cluster":..(,"namespace":..)`, rendered as JSON
/// once. A route's fields do not change once it carries records.
#[derive(Clone, Debug, Default)]
pub struct Rendered(std::sync::OnceLock<Box<[u8]>>);

impl Route {
    /// The route of `channel`'s stream over `namespace` in `cluster`.
    pub fn for_stream(channel: &Channel, cluster: &str, namespace: Option<String>) -> Self {
        let path = channel.path.collection_url(namespace.as_deref());
        Self {
            topic: channel.topic_for(cluster, namespace.as_deref()),
            key: channel.key.clone(),
            dataschema: payload_uri(cluster, &channel.name),
            source: format!("/clusters/{cluster}{path}"),
            channel: channel.path.template.clone(),
            operation_id: channel.operation_id.clone(),
            message: channel.message.clone(),
            cluster: cluster.to_string(),
            namespace,
            rendered: Rendered::default(),
        }
    }

    /// See [`Rendered`].
    fn rendered(&self) -> &[u8] {
        self.rendered.0.get_or_init(|| {
            #[derive(Serialize)]
            #[serde(rename_all = "camelCase")]
            struct Constant<'a> {
                channel: &'a str,
                operation_id: &'a str,
                message: &'a str,
                cluster: &'a str,
                #[serde(skip_serializing_if = "Option::is_none")]
                namespace: Option<&'a str>,
            }
            let json = serde_json::to_vec(&Constant {
                channel: &self.channel,
                operation_id: &self.operation_id,
                message: &self.message,
                cluster: &self.cluster,
                namespace: self.namespace.as_deref(),
            })
            .expect("serializing plain strings cannot fail");
            // Without the braces: members to write among others.
            json[1..json.len() - 1].into()
        })
    }

    /// What identifies where this route publishes (`<topic> <key template>`), saved with a
    /// stream's position: under another one its members are retracted where they were.
    pub fn id(&self) -> String {
        format!("{} {}", self.topic, self.key.as_str())
    }

    /// The route of a channel that no longer exists (its name from the stream id): enough for
    /// the inferred DELETED of what its stream announced.
    pub fn vanished(channel: &str, cluster: &str, namespace: Option<String>) -> Self {
        Self {
            topic: String::new(),
            key: KeyTemplate::default(),
            dataschema: String::new(),
            source: format!("/clusters/{cluster}"),
            channel: String::new(),
            operation_id: channel.to_string(),
            message: "WatchEvent".into(),
            cluster: cluster.to_string(),
            namespace,
            rendered: Rendered::default(),
        }
    }
}

/// The inferred DELETED of `meta` retracting it from `topic` under `key`, where it was
/// announced, whatever `route` would key it by now.
pub fn retraction(route: &Route, meta: ObjectMeta, rv: &str, topic: &str, key: &str) -> Record {
    let route = Route {
        topic: topic.to_string(),
        key: KeyTemplate::fixed(key),
        ..route.clone()
    };
    let object = reference_object(&meta);
    let a = Announcement::inferred_delete(meta, rv);
    record(&route, &a, &object, Vec::new())
}

/// `watchrelay.id`, made from the announcement's object when the record is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Id {
    /// `{uid}/{resourceVersion}`: a change read off a watch or a list.
    Change,
    /// `{uid}/deleted`: an inferred DELETED.
    Deleted,
    /// As it is: a marker's `{what}/{stream}/{resourceVersion}`.
    Text(String),
}

/// One event as the relay announces it: which change of which object, and how it came about.
#[derive(Clone, Debug)]
pub struct Announcement {
    pub event_type: EventType,
    /// The object's identity; its `namespace/name` is the Kafka key.
    pub meta: ObjectMeta,
    /// `watchrelay.id`.
    pub id: Id,
    /// `watchrelay.resourceVersion` when it is not the object's: the list's for inferred events
    /// (see [`Announcement::resource_version`]).
    pub list_version: Option<String>,
    /// When the relay read the event.
    pub observed_at: Stamp,
    pub resync: bool,
    pub synthetic: bool,
}

impl Announcement {
    /// `watchrelay.id`, in parts written end to end.
    pub fn id_parts(&self) -> [&str; 3] {
        match &self.id {
            Id::Change => [self.meta.uid(), "/", self.meta.resource_version()],
            Id::Deleted => [self.meta.uid(), "/", "deleted"],
            Id::Text(text) => [text, "", ""],
        }
    }

    /// `watchrelay.resourceVersion`: the object's (a marker's is the position it marks), or the
    /// list's for inferred events.
    pub fn resource_version(&self) -> &str {
        self.list_version
            .as_deref()
            .unwrap_or(self.meta.resource_version())
    }

    /// A change read off a watch or a list.
    pub fn change(event_type: EventType, meta: ObjectMeta, resync: bool) -> Self {
        Self {
            event_type,
            id: Id::Change,
            list_version: None,
            observed_at: Stamp::now(),
            resync,
            synthetic: false,
            meta,
        }
    }

    /// A DELETED the relay inferred: the object was known and a resync at `list_rv` lacks it.
    pub fn inferred_delete(meta: ObjectMeta, list_rv: &str) -> Self {
        Self {
            event_type: EventType::Deleted,
            id: Id::Deleted,
            list_version: Some(list_rv.to_string()),
            observed_at: Stamp::now(),
            resync: true,
            synthetic: true,
            meta,
        }
    }

    /// A BOOKMARK of stream `stream` at `rv`, keyed by the stream; `what` prefixes its id
    /// (`bookmark`, `resync-end`).
    pub fn marker(what: &str, stream: &str, meta: ObjectMeta, rv: &str, resync: bool) -> Self {
        Self {
            event_type: EventType::Bookmark,
            id: Id::Text(format!("{what}/{stream}/{rv}")),
            // The marker's own resourceVersion is `rv`.
            list_version: None,
            observed_at: Stamp::now(),
            resync,
            synthetic: false,
            meta: meta.with(|id| {
                id.name = stream;
                id.resource_version = rv;
            }),
        }
    }
}

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
    }
}

/// The announcement a record was written from, read back from its envelope `value` and its
/// `key`: what a reference needs when Kafka refuses a record for its size after it was sent.
/// Nothing else of an announcement outlives its record. `None` for what [`record`] did not
/// write.
pub fn announced(value: &[u8], key: &str) -> Option<Announcement> {
    #[derive(Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        watchrelay: Written<'a>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Written<'a> {
        #[serde(borrow)]
        id: Cow<'a, str>,
        #[serde(borrow)]
        resource_version: Cow<'a, str>,
        #[serde(borrow)]
        observed_at: Cow<'a, str>,
        resync: bool,
        synthetic: bool,
    }
    let untouched = Trim {
        drop_managed_fields: false,
        allow_secret_data: true,
    };
    let ev = crate::decode::decode_line(value, untouched).ok()?;
    let written = serde_json::from_slice::<Envelope<'_>>(value)
        .ok()?
        .watchrelay;
    let mut meta = ev.meta;
    if ev.event_type == EventType::Bookmark {
        // A marker's name is its stream: its key, not in its object.
        meta = meta.with(|id| id.name = key);
    }
    let list_version = (written.resource_version != meta.resource_version())
        .then(|| written.resource_version.into_owned());
    Some(Announcement {
        event_type: ev.event_type,
        meta,
        // The same text, whatever it was made from.
        id: Id::Text(written.id.into_owned()),
        list_version,
        observed_at: Stamp::parse(&written.observed_at)?,
        resync: written.resync,
        synthetic: written.synthetic,
    })
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
    h.push("ce_operationid", &[&route.operation_id]);
    h.push("ce_cluster", &[&route.cluster]);
    // `namespace/name`, or `name` (`ObjectMeta::key`), when not empty.
    match a.meta.namespace() {
        Some(ns) => h.push("ce_subject", &[ns, "/", a.meta.name()]),
        None if !a.meta.name().is_empty() => h.push("ce_subject", &[a.meta.name()]),
        None => {}
    }
    if a.resync {
        h.push("ce_resync", &["true"]);
    }
    if a.synthetic {
        h.push("ce_synthetic", &["true"]);
    }
    h
}

/// An object reduced to its identity: used for inferred DELETED events and for events too
/// large to publish.
pub fn reference_object(meta: &ObjectMeta) -> Vec<u8> {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Md<'a> {
        name: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        namespace: Option<&'a str>,
        uid: &'a str,
        resource_version: &'a str,
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Obj<'a> {
        api_version: &'a str,
        kind: &'a str,
        metadata: Md<'a>,
    }
    serde_json::to_vec(&Obj {
        api_version: meta.api_version(),
        kind: meta.kind(),
        metadata: Md {
            name: meta.name(),
            namespace: meta.namespace(),
            uid: meta.uid(),
            resource_version: meta.resource_version(),
        },
    })
    .expect("serializing plain strings cannot fail")
}

/// A BOOKMARK-shaped object carrying only a resourceVersion and optional annotations.
pub fn bookmark_object(
    api_version: &str,
    kind: &str,
    rv: &str,
    annotation: Option<(&str, &str)>,
) -> Vec<u8> {
    let mut md = serde_json::json!({ "resourceVersion": rv });
    if let Some((k, v)) = annotation {
        md["annotations"] = serde_json::json!({ k: v });
    }
    serde_json::to_vec(
        &serde_json::json!({ "apiVersion": api_version, "kind": kind, "metadata": md }),
    )
    .expect("serializing a json Value cannot fail")
}

/// An RFC 3339 timestamp with milliseconds (`2026-11-25T10:00:00.000Z`), held inline: copied
/// with its event, never allocated.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    len: u8,
    text: [u8; 32],
}

impl Stamp {
    /// The current time, formatted once per millisecond (per thread): events read in the same
    /// millisecond share it.
    pub fn now() -> Self {
        thread_local! {
            static LAST: std::cell::Cell<(i64, Option<Stamp>)> = const { std::cell::Cell::new((0, None)) };
        }
        let ms = jiff::Timestamp::now().as_millisecond();
        LAST.with(|last| match last.get() {
            (at, Some(stamp)) if at == ms => stamp,
            _ => {
                let now = jiff::Timestamp::from_millisecond(ms).expect("now is a valid timestamp");
                let stamp = Self::new(&format!("{now:.3}"));
                last.set((ms, Some(stamp)));
                stamp
            }
        })
    }

    /// `text` when it is 32 bytes at most (a timestamp read back).
    pub fn parse(text: &str) -> Option<Self> {
        (text.len() <= 32).then(|| Self::new(text))
    }

    /// `text`, an RFC 3339 timestamp (32 bytes at most).
    pub fn new(text: &str) -> Self {
        assert!(text.len() <= 32, "a timestamp of 32 bytes at most: {text}");
        let mut stamp = Self {
            len: u8::try_from(text.len()).expect("at most 32"),
            text: [0; 32],
        };
        stamp.text[..text.len()].copy_from_slice(text.as_bytes());
        stamp
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.text[..usize::from(self.len)]).expect("made from a str")
    }
}

impl std::fmt::Debug for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The current time as RFC 3339 with milliseconds (see [`Stamp::now`]).
pub fn now_rfc3339() -> String {
    Stamp::now().as_str().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{decode_line, Identity, Trim};

    fn route() -> Route {
        Route {
            topic: "prod.pods".into(),
            key: KeyTemplate::default(),
            dataschema: "urn:watchrelay:prod:asyncapi#/components/schemas/pods".into(),
            source: "/clusters/prod/api/v1/namespaces/shop/pods".into(),
            channel: "/api/v1/namespaces/{namespace}/pods".into(),
            operation_id: "watchNamespacedPods".into(),
            message: "WatchEvent".into(),
            cluster: "prod".into(),
            namespace: Some("shop".into()),
            rendered: Default::default(),
        }
    }

    const LINE: &str = r#"{"type":"MODIFIED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web-1","namespace":"shop","uid":"u-1","resourceVersion":"42","labels":{"app":"web"}},"spec":{"containers":[{"name":"c","image":"nginx:1.27"}]},"status":{"phase":"Running"}}}"#;

    fn trim() -> Trim {
        Trim {
            drop_managed_fields: true,
            allow_secret_data: false,
        }
    }

    /// Every byte of a record: its topic, key, value and headers in order, as one string.
    fn golden(rec: &Record) -> String {
        let mut out = format!(
            "{} {} {}\n",
            rec.topic,
            rec.key,
            String::from_utf8_lossy(&rec.value)
        );
        for (name, value) in rec.headers.iter() {
            out.push_str(&format!("{name}={value}\n"));
        }
        out
    }

    #[test]
    fn each_announcement_says_the_resource_version_it_stands_at() {
        let ev = decode_line(LINE.as_bytes(), trim()).unwrap();
        let meta = || ev.meta.clone();
        let change = Announcement::change(ev.event_type, meta(), false);
        let inferred = Announcement::inferred_delete(meta(), "77");
        let marker = Announcement::marker("bookmark", "pods.shop", meta(), "90", false);
        assert_eq!(
            [change, inferred, marker].map(|a| a.resource_version().to_string()),
            ["42", "77", "90"]
        );
    }

    #[test]
    fn a_stamp_is_the_rfc3339_text_of_its_millisecond() {
        let stamp = Stamp::now();
        let text = stamp.as_str();
        assert_eq!(text.len(), 24, "{text}");
        let parsed: jiff::Timestamp = text.parse().unwrap();
        assert_eq!(format!("{parsed:.3}"), text);
        assert_eq!(Stamp::new(text), stamp);
        assert_eq!(format!("{stamp:?}"), text);
    }

    #[test]
    fn records_are_byte_for_byte_what_they_were() {
        let ev = decode_line(LINE.as_bytes(), trim()).unwrap();
        let fixed = |mut a: Announcement| {
            a.observed_at = Stamp::new("2026-11-25T10:00:00.000Z");
            a
        };
        let a = fixed(Announcement::change(ev.event_type, ev.meta.clone(), false));
        let inferred = fixed(Announcement::inferred_delete(ev.meta.clone(), "77"));
        let got = [
            golden(&record(&route(), &a, &ev.object, Vec::new())),
            golden(&record_of_value(&route(), &inferred, b"{}".to_vec())),
            golden(&reference(&route(), &a, 5_000_000, "prod.dlq")),
            golden(&tombstone(&route(), &a)),
        ]
        .join("--\n");
        assert_eq!(got, GOLDEN);
    }

    #[test]
    fn a_reference_made_from_the_record_alone_is_the_same() {
        let ev = decode_line(LINE.as_bytes(), trim()).unwrap();
        let bookmark = bookmark_object("v1", "Pod", "90", None);
        let resync_end = bookmark_object(
            "v1",
            "Pod",
            "99",
            Some(("watchrelay.io/resync-end", "true")),
        );
        let kind = ObjectMeta::new(Identity {
            api_version: "v1",
            kind: "Pod",
            ..Identity::default()
        });
        let inferred = Announcement::inferred_delete(ev.meta.clone(), "77");
        let cases = [
            (
                Announcement::change(ev.event_type, ev.meta.clone(), true),
                ev.object.clone(),
            ),
            (inferred.clone(), reference_object(&inferred.meta)),
            (
                Announcement::marker("bookmark", "pods.shop", kind.clone(), "90", false),
                bookmark,
            ),
            (
                Announcement::marker("resync-end", "pods.shop", kind, "99", true),
                resync_end,
            ),
        ];
        let mut cluster_wide = route();
        cluster_wide.namespace = None;
        for route in [route(), cluster_wide] {
            for (a, object) in &cases {
                let whole = record(&route, a, object, Vec::new());
                let back = announced(&whole.value, &whole.key).expect("an envelope");
                assert_eq!(
                    golden(&reference(&route, &back, 5_000_000, "dlq")),
                    golden(&reference(&route, a, 5_000_000, "dlq")),
                );
            }
        }
        assert!(announced(b"{}", "k").is_none());
    }

    const GOLDEN: &str = r#"prod.pods shop/web-1 {"type":"MODIFIED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web-1","namespace":"shop","uid":"u-1","resourceVersion":"42","labels":{"app":"web"}},"spec":{"containers":[{"name":"c","image":"nginx:1.27"}]},"status":{"phase":"Running"}},"watchrelay":{"id":"u-1/42","channel":"/api/v1/namespaces/{namespace}/pods","operationId":"watchNamespacedPods","message":"WatchEvent","cluster":"prod","namespace":"shop","resourceVersion":"42","observedAt":"2026-11-25T10:00:00.000Z","resync":false,"synthetic":false}}
ce_specversion=1.0
ce_id=u-1/42
ce_source=/clusters/prod/api/v1/namespaces/shop/pods
ce_type=io.watchrelay.WatchEvent.MODIFIED
ce_time=2026-11-25T10:00:00.000Z
content-type=application/json
ce_dataschema=urn:watchrelay:prod:asyncapi#/components/schemas/pods
ce_partitionkey=shop/web-1
ce_resourceversion=42
ce_operationid=watchNamespacedPods
ce_cluster=prod
ce_subject=shop/web-1
--
prod.pods shop/web-1 {}
ce_specversion=1.0
ce_id=u-1/deleted
ce_source=/clusters/prod/api/v1/namespaces/shop/pods
ce_type=io.watchrelay.WatchEvent.DELETED
ce_time=2026-11-25T10:00:00.000Z
content-type=application/json
ce_dataschema=urn:watchrelay:prod:asyncapi#/components/schemas/pods
ce_partitionkey=shop/web-1
ce_resourceversion=77
ce_operationid=watchNamespacedPods
ce_cluster=prod
ce_subject=shop/web-1
ce_resync=true
ce_synthetic=true
--
prod.dlq shop/web-1 {"type":"MODIFIED","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-1","namespace":"shop","uid":"u-1","resourceVersion":"42"}},"watchrelay":{"id":"u-1/42","channel":"/api/v1/namespaces/{namespace}/pods","operationId":"watchNamespacedPods","message":"WatchEvent","cluster":"prod","namespace":"shop","resourceVersion":"42","observedAt":"2026-11-25T10:00:00.000Z","resync":false,"synthetic":false,"truncatedBytes":5000000}}
ce_specversion=1.0
ce_id=u-1/42
ce_source=/clusters/prod/api/v1/namespaces/shop/pods
ce_type=io.watchrelay.WatchEvent.MODIFIED
ce_time=2026-11-25T10:00:00.000Z
content-type=application/json
ce_dataschema=urn:watchrelay:prod:asyncapi#/components/schemas/pods
ce_partitionkey=shop/web-1
ce_resourceversion=42
ce_operationid=watchNamespacedPods
ce_cluster=prod
ce_subject=shop/web-1
ce_truncatedbytes=5000000
--
prod.pods shop/web-1 
"#;

    #[test]
    fn a_record_is_the_envelope_keyed_by_object_with_cloudevents_headers() {
        let ev = decode_line(LINE.as_bytes(), trim()).unwrap();
        let a = Announcement::change(ev.event_type, ev.meta.clone(), false);
        let rec = record(&route(), &a, &ev.object, Vec::new());
        assert_eq!(rec.topic, "prod.pods");
        assert_eq!(rec.key, "shop/web-1");
        let v: serde_json::Value = serde_json::from_slice(&rec.value).unwrap();
        assert_eq!(v["type"], "MODIFIED");
        assert_eq!(v["object"]["metadata"]["name"], "web-1");
        assert_eq!(v["watchrelay"]["id"], "u-1/42");
        assert_eq!(v["watchrelay"]["operationId"], "watchNamespacedPods");
        assert_eq!(v["watchrelay"]["namespace"], "shop");
        assert_eq!(v["watchrelay"]["resync"], false);
        assert!(v["watchrelay"].get("truncatedBytes").is_none());
        let h = |k: &str| rec.headers.get(k);
        assert_eq!(h("ce_type"), Some("io.watchrelay.WatchEvent.MODIFIED"));
        assert_eq!(h("ce_subject"), Some("shop/web-1"));
        assert_eq!(h("ce_id"), Some("u-1/42"));
        assert_eq!(h("ce_synthetic"), None);
        assert_eq!(h("ce_partitionkey"), Some("shop/web-1"));
        assert_eq!(h("content-type"), Some("application/json"));
        assert!(h("ce_dataschema").is_some_and(|s| s.starts_with("urn:watchrelay:prod")));
    }

    #[test]
    fn key_templates_name_the_object_and_leave_out_an_absent_namespace() {
        let ev = decode_line(LINE.as_bytes(), trim()).unwrap();
        let meta = ev.meta.clone();
        let k = |t: &str, m: &ObjectMeta| KeyTemplate::parse(t).unwrap().render(m);
        assert_eq!(k("{namespace}/{name}", &meta), "shop/web-1");
        assert_eq!(k("{uid}", &meta), "u-1");
        assert_eq!(k("{kind}/{namespace}/{name}", &meta), "Pod/shop/web-1");
        let meta = meta.with(|id| {
            id.namespace = None;
            id.kind = "Node";
        });
        assert_eq!(k("{namespace}/{name}", &meta), "web-1");
        assert_eq!(k("{kind}/{namespace}/{name}", &meta), "Node/web-1");
        assert!(KeyTemplate::parse("{namespace}").is_err());
        assert!(KeyTemplate::parse("{nam}").is_err());
        assert!(KeyTemplate::parse("{name").is_err());
        let mut route = route();
        route.key = KeyTemplate::parse("{uid}").unwrap();
        let a = Announcement::change(ev.event_type, ev.meta.clone(), false);
        let rec = record(&route, &a, &ev.object, Vec::new());
        assert_eq!(rec.key, "u-1");
        assert_eq!(rec.headers.get("ce_partitionkey"), Some("u-1"));
        assert_eq!(rec.headers.get("ce_subject"), Some("shop/web-1"));
    }

    #[test]
    fn a_reference_keeps_routing_identity_and_envelope() {
        let ev = decode_line(LINE.as_bytes(), trim()).unwrap();
        let a = Announcement::change(ev.event_type, ev.meta.clone(), true);
        let whole = record(&route(), &a, &ev.object, Vec::new());
        let rec = reference(&route(), &a, 5_000_000, "dlq");
        assert_eq!(rec.topic, "dlq");
        assert_eq!(rec.key, whole.key);
        let v: serde_json::Value = serde_json::from_slice(&rec.value).unwrap();
        let w: serde_json::Value = serde_json::from_slice(&whole.value).unwrap();
        assert_eq!(v["type"], "MODIFIED");
        assert_eq!(v["object"]["metadata"]["uid"], "u-1");
        assert_eq!(v["object"]["kind"], "Pod");
        assert!(v["object"].get("spec").is_none());
        assert_eq!(v["watchrelay"]["truncatedBytes"], 5_000_000);
        assert_eq!(v["watchrelay"]["id"], w["watchrelay"]["id"]);
        assert_eq!(v["watchrelay"]["resync"], true);
        assert_eq!(rec.headers.get("ce_truncatedbytes"), Some("5000000"));
    }

    #[test]
    fn inferred_deletes_and_markers_say_what_they_are() {
        let ev = decode_line(LINE.as_bytes(), trim()).unwrap();
        let d = Announcement::inferred_delete(ev.meta.clone(), "99");
        let rec = record(&route(), &d, &reference_object(&d.meta), Vec::new());
        let v: serde_json::Value = serde_json::from_slice(&rec.value).unwrap();
        assert_eq!(v["type"], "DELETED");
        assert_eq!(v["watchrelay"]["id"], "u-1/deleted");
        assert_eq!(v["watchrelay"]["resourceVersion"], "99");
        assert_eq!(v["watchrelay"]["synthetic"], true);
        assert_eq!(v["object"]["metadata"]["resourceVersion"], "42");
        let m = Announcement::marker("resync-end", "pods.shop", ObjectMeta::default(), "99", true);
        let obj = bookmark_object(
            "v1",
            "Pod",
            "99",
            Some(("watchrelay.io/resync-end", "true")),
        );
        let rec = record(&route(), &m, &obj, Vec::new());
        assert_eq!(rec.key, "pods.shop");
        let v: serde_json::Value = serde_json::from_slice(&rec.value).unwrap();
        assert_eq!(v["watchrelay"]["id"], "resync-end/pods.shop/99");
        assert_eq!(
            v["object"]["metadata"]["annotations"]["watchrelay.io/resync-end"],
            "true"
        );
    }
}
