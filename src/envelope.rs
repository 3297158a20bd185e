//! Pure translation: one watch line in, one Kafka record out.
//!
//! The object is never re-encoded: the line is scanned once (and validated) into the spans of
//! its top-level members, and of `metadata`'s members in the same pass, and the envelope is
//! assembled by copying slices. Only the identity fields are decoded.
//!
//! # What an envelope guarantees
//! - The top level validates against the AsyncAPI `WatchEvent` schema: `type` and `object`.
//! - `watchrelay.id` is deterministic: the same change of the same object always has the same
//!   id (`{uid}/{resourceVersion}`), so consumers can drop the duplicates that at-least-once
//!   delivery allows. A resync re-announcement of an unchanged object repeats the id of the
//!   event that last announced it.
//! - `watchrelay.synthetic` marks DELETED events that the relay inferred (the object vanished
//!   while the stream could not see it); `watchrelay.resync` marks events produced by a relist.
//! - Nothing promises that a consumer sees every intermediate state: Kubernetes itself may
//!   coalesce changes, and after a 410 only the current state is re-announced.

use std::ops::Range;

use serde::Serialize;
use serde_json::value::RawValue;
use thiserror::Error;

use crate::json::{ScanError, Scanner, Str};

#[derive(Debug, Error)]
pub enum DecodeError {
    #[error("malformed watch line: {0}")]
    Json(#[from] ScanError),
    #[error("malformed watch line: not UTF-8")]
    Utf8,
    #[error("watch event without {0}")]
    Missing(&'static str),
}

/// One member of a scanned object: its key token and where its value lies in the source.
struct Member {
    key: Str,
    value: Range<usize>,
    /// The members of `metadata`, split out in the same pass so it is scanned once.
    metadata: Option<Vec<Member>>,
}

/// A Kubernetes object as spans of its source.
struct Object<'a> {
    src: &'a str,
    /// Where the whole object stands in `src`.
    span: Range<usize>,
    members: Vec<Member>,
}

fn find<'m>(src: &str, members: &'m [Member], key: &str) -> Option<&'m Member> {
    members.iter().find(|m| m.key.text(src) == key)
}

/// A member's value when it is a string.
fn string_of(src: &str, members: &[Member], key: &str) -> Option<String> {
    let m = find(src, members, key)?;
    let mut sc = Scanner::new(&src[m.value.clone()]);
    let s = sc.string().ok()?;
    Some(sc.text(&s).into_owned())
}

/// Scans an object starting at the scanner's position. The values of `dropped` members are
/// only delimited (they are not published). With `metadata`, the members of a `metadata`
/// object are recorded too, its `metadata` members dropped.
fn scan_object<'a>(
    sc: &mut Scanner<'a>,
    metadata: Option<&[&str]>,
    dropped: &[&str],
) -> Result<Object<'a>, ScanError> {
    sc.ws();
    let begin = sc.pos();
    sc.expect(b'{', "expected an object")?;
    // Room for a typical metadata (about ten members) without growing.
    let mut members = Vec::with_capacity(16);
    let mut split = metadata;
    let mut first = true;
    while sc.next_member(first)? {
        first = false;
        let key = sc.key()?;
        sc.ws();
        let start = sc.pos();
        let name = key.text(sc.src());
        let metadata = match split {
            Some(md_dropped) if name == "metadata" => {
                split = None;
                Some(scan_object(sc, None, md_dropped)?.members)
            }
            _ if dropped.contains(&name.as_ref()) => {
                sc.delimit()?;
                None
            }
            _ => {
                sc.value()?;
                None
            }
        };
        members.push(Member {
            key,
            value: start..sc.pos(),
            metadata,
        });
    }
    Ok(Object {
        src: sc.src(),
        span: begin..sc.pos(),
        members,
    })
}

/// Writes `members` back as an object after `prefix` (members to add), leaving out `skip`,
/// and `metadata_skip` inside a split-out `metadata`. Keys go out as they came in.
fn write_members(
    out: &mut Vec<u8>,
    src: &str,
    members: &[Member],
    prefix: &[u8],
    skip: &[&str],
    metadata_skip: &[&str],
) {
    out.push(b'{');
    out.extend_from_slice(prefix);
    let mut first = prefix.is_empty();
    for m in members {
        if !skip.is_empty() && skip.contains(&m.key.text(src).as_ref()) {
            continue;
        }
        if !first {
            out.push(b',');
        }
        first = false;
        out.extend_from_slice(m.key.quoted(src).as_bytes());
        out.push(b':');
        match &m.metadata {
            Some(md) => write_members(out, src, md, b"", metadata_skip, &[]),
            None => out.extend_from_slice(&src.as_bytes()[m.value.clone()]),
        }
    }
    out.push(b'}');
}

impl Object<'_> {
    fn string(&self, key: &str) -> Option<String> {
        string_of(self.src, &self.members, key)
    }

    fn metadata_members(&self) -> Option<&[Member]> {
        self.members.iter().find_map(|m| m.metadata.as_deref())
    }
}

/// What the relay needs to know about an object: its identity and version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectMeta {
    pub kind: String,
    pub api_version: String,
    pub name: String,
    pub namespace: Option<String>,
    pub uid: String,
    pub resource_version: String,
}

impl ObjectMeta {
    /// The Kafka key: `namespace/name`, or `name` for cluster-scoped objects.
    pub fn key(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}/{}", self.name),
            None => self.name.clone(),
        }
    }
}

/// A decoded watch line, object already trimmed and re-assembled as JSON bytes.
#[derive(Debug)]
pub struct WatchEvent {
    /// ADDED, MODIFIED, DELETED, BOOKMARK or ERROR.
    pub event_type: String,
    pub meta: ObjectMeta,
    /// The object as it goes into the envelope.
    pub object: Vec<u8>,
    /// For ERROR events: the Status code, when present.
    pub status_code: Option<u16>,
    /// A BOOKMARK annotated `k8s.io/initial-events-end: "true"`: the initial state of a
    /// `sendInitialEvents` watch is complete.
    pub initial_events_end: bool,
}

/// How objects are trimmed before they leave the cluster.
#[derive(Clone, Copy, Debug)]
pub struct Trim {
    pub drop_managed_fields: bool,
    pub allow_secret_data: bool,
}

/// Members of `metadata` that `trim` drops.
fn metadata_dropped(trim: Trim) -> &'static [&'static str] {
    if trim.drop_managed_fields {
        &["managedFields"]
    } else {
        &[]
    }
}

/// Decodes one watch line (`{"type": .., "object": {..}}`).
pub fn decode_line(line: &[u8], trim: Trim) -> Result<WatchEvent, DecodeError> {
    decode_line_into(line, trim, Vec::new())
}

/// [`decode_line`], writing the object into `out` (cleared first) so a caller can reuse one
/// buffer for every event.
pub fn decode_line_into(line: &[u8], trim: Trim, out: Vec<u8>) -> Result<WatchEvent, DecodeError> {
    let src = std::str::from_utf8(line).map_err(|_| DecodeError::Utf8)?;
    let mut sc = Scanner::new(src);
    sc.expect(b'{', "expected an object")?;
    let (mut event_type, mut object) = (None, None);
    let mut first = true;
    while sc.next_member(first)? {
        first = false;
        let key = sc.key()?;
        sc.ws();
        match key.text(src).as_ref() {
            "type" if event_type.is_none() => {
                let s = sc.string()?;
                event_type = Some(sc.text(&s).into_owned());
            }
            "object" if object.is_none() => {
                object = Some(scan_object(&mut sc, Some(metadata_dropped(trim)), &[])?)
            }
            _ => {
                sc.value()?;
            }
        }
    }
    sc.end()?;
    let event_type = event_type.ok_or(DecodeError::Missing("type"))?;
    let object = object.ok_or(DecodeError::Missing("object"))?;
    decode_object(event_type, &object, trim, None, out)
}

/// Decodes one item of a list, as if it arrived in an event of `event_type`. List items usually
/// lack `apiVersion` and `kind`; `type_meta` supplies them so the envelope carries a whole object.
pub fn decode_item(
    event_type: &str,
    object: &RawValue,
    trim: Trim,
    type_meta: (&str, &str),
) -> Result<WatchEvent, DecodeError> {
    let mut sc = Scanner::new(object.get());
    let parsed = scan_object(&mut sc, Some(metadata_dropped(trim)), &[])?;
    sc.end()?;
    decode_object(
        event_type.to_string(),
        &parsed,
        trim,
        Some(type_meta),
        Vec::new(),
    )
}

fn decode_object(
    event_type: String,
    object: &Object,
    trim: Trim,
    type_meta: Option<(&str, &str)>,
    mut out: Vec<u8>,
) -> Result<WatchEvent, DecodeError> {
    let mut prefix = Vec::new();
    let mut member = |key: &str, value: &str| {
        if !prefix.is_empty() {
            prefix.push(b',');
        }
        serde_json::to_writer(&mut prefix, key).expect("writing to a Vec cannot fail");
        prefix.push(b':');
        serde_json::to_writer(&mut prefix, value).expect("writing to a Vec cannot fail");
    };
    let mut api_version = object.string("apiVersion");
    let mut kind = object.string("kind");
    if let Some((av, k)) = type_meta {
        if api_version.is_none() && !av.is_empty() {
            member("apiVersion", av);
            api_version = Some(av.to_string());
        }
        if kind.is_none() && !k.is_empty() {
            member("kind", k);
            kind = Some(k.to_string());
        }
    }
    let kind = kind.unwrap_or_default();
    let src = object.src;
    let status_code = if event_type == "ERROR" {
        find(src, &object.members, "code").and_then(|c| src[c.value.clone()].parse().ok())
    } else {
        None
    };
    let metadata = match object.metadata_members() {
        Some(m) => m,
        None if event_type == "ERROR" => &[],
        None => return Err(DecodeError::Missing("metadata")),
    };
    let field = |key| string_of(src, metadata, key);
    let meta = ObjectMeta {
        api_version: api_version.unwrap_or_default(),
        name: field("name").unwrap_or_default(),
        namespace: field("namespace").filter(|s| !s.is_empty()),
        uid: field("uid").unwrap_or_default(),
        resource_version: field("resourceVersion").unwrap_or_default(),
        kind,
    };
    if meta.resource_version.is_empty() && event_type != "ERROR" {
        return Err(DecodeError::Missing("metadata.resourceVersion"));
    }
    let initial_events_end = event_type == "BOOKMARK"
        && find(src, metadata, "annotations").is_some_and(|a| {
            let raw = &src[a.value.clone()];
            scan_object(&mut Scanner::new(raw), None, &[]).is_ok_and(|o| {
                string_of(raw, &o.members, "k8s.io/initial-events-end").as_deref() == Some("true")
            })
        });
    let secret = meta.kind == "Secret" && !trim.allow_secret_data;
    out.clear();
    // The object never grows beyond its source plus the members added in front.
    out.reserve(object.span.len() + prefix.len() + 1);
    let skip: &[&str] = if secret { &["data", "stringData"] } else { &[] };
    // What the scan only delimited is exactly what is left out here.
    write_members(
        &mut out,
        src,
        &object.members,
        &prefix,
        skip,
        metadata_dropped(trim),
    );
    Ok(WatchEvent {
        event_type,
        meta,
        object: out,
        status_code,
        initial_events_end,
    })
}

/// Routing metadata of one envelope, serialized under the `watchrelay` key.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvelopeMeta<'a> {
    pub id: &'a str,
    pub channel: &'a str,
    pub operation_id: &'a str,
    pub message: &'a str,
    pub cluster: &'a str,
    /// The namespace of the stream, absent for cluster-wide streams.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<&'a str>,
    pub resource_version: &'a str,
    /// RFC 3339 time at which the relay read the event.
    pub observed_at: &'a str,
    pub resync: bool,
    pub synthetic: bool,
    /// Present when the object was replaced by a reference because it was too large.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncated_bytes: Option<usize>,
}

/// A Kafka record, ready to produce.
#[derive(Debug, Clone)]
pub struct Record {
    pub topic: String,
    pub key: String,
    pub value: Vec<u8>,
    pub headers: Vec<(&'static str, String)>,
}

/// The envelope bytes: `{"type":..,"object":..,"watchrelay":{..}}`.
pub fn envelope_value(event_type: &str, object: &[u8], meta: &EnvelopeMeta) -> Vec<u8> {
    let mut out = Vec::new();
    write_envelope(&mut out, event_type, object, meta);
    out
}

/// Writes the envelope into `out` (cleared first).
pub fn write_envelope(out: &mut Vec<u8>, event_type: &str, object: &[u8], meta: &EnvelopeMeta) {
    out.clear();
    out.reserve(object.len() + 400);
    out.extend_from_slice(b"{\"type\":");
    serde_json::to_writer(&mut *out, event_type).expect("writing to a Vec cannot fail");
    out.extend_from_slice(b",\"object\":");
    out.extend_from_slice(object);
    out.extend_from_slice(b",\"watchrelay\":");
    serde_json::to_writer(&mut *out, meta).expect("writing to a Vec cannot fail");
    out.push(b'}');
}

/// CloudEvents Kafka binding headers (binary mode: the value is the event data).
pub fn cloudevents_headers(
    meta: &EnvelopeMeta,
    event_type: &str,
    source: &str,
    subject: &str,
) -> Vec<(&'static str, String)> {
    let mut h = vec![
        ("ce_specversion", "1.0".to_string()),
        ("ce_id", meta.id.to_string()),
        ("ce_source", source.to_string()),
        (
            "ce_type",
            format!("io.watchrelay.{}.{}", meta.message, event_type),
        ),
        ("ce_time", meta.observed_at.to_string()),
        ("content-type", "application/json".to_string()),
        ("ce_resourceversion", meta.resource_version.to_string()),
        ("ce_operationid", meta.operation_id.to_string()),
        ("ce_cluster", meta.cluster.to_string()),
    ];
    if !subject.is_empty() {
        h.push(("ce_subject", subject.to_string()));
    }
    if meta.resync {
        h.push(("ce_resync", "true".into()));
    }
    if meta.synthetic {
        h.push(("ce_synthetic", "true".into()));
    }
    h
}

/// An object reduced to its identity: used for synthetic DELETED events and for events too
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
        api_version: &meta.api_version,
        kind: &meta.kind,
        metadata: Md {
            name: &meta.name,
            namespace: meta.namespace.as_deref(),
            uid: &meta.uid,
            resource_version: &meta.resource_version,
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

/// The current time as RFC 3339 with milliseconds.
pub fn now_rfc3339() -> String {
    format!("{:.3}", jiff::Timestamp::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEEP: Trim = Trim {
        drop_managed_fields: false,
        allow_secret_data: false,
    };
    const DROP: Trim = Trim {
        drop_managed_fields: true,
        allow_secret_data: false,
    };

    fn pod_line() -> String {
        r#"{"type":"MODIFIED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web-1","namespace":"shop","uid":"u-1","resourceVersion":"42","managedFields":[{"manager":"kubelet","fieldsV1":{"f:status":{}}}],"labels":{"app":"web"}},"spec":{"containers":[{"name":"c","image":"nginx:1.27"}]},"status":{"phase":"Running"}}}"#.to_string()
    }

    #[test]
    fn decodes_identity_and_passes_object_through() {
        let ev = decode_line(pod_line().as_bytes(), KEEP).unwrap();
        assert_eq!(ev.event_type, "MODIFIED");
        assert_eq!(ev.meta.key(), "shop/web-1");
        assert_eq!(ev.meta.uid, "u-1");
        assert_eq!(ev.meta.resource_version, "42");
        let original: serde_json::Value = serde_json::from_str(&pod_line()).unwrap();
        let passed: serde_json::Value = serde_json::from_slice(&ev.object).unwrap();
        assert_eq!(passed, original["object"]);
    }

    #[test]
    fn a_realistic_pod_passes_through_unchanged_but_for_managed_fields() {
        let mut pod = watchrelay_sim::objects::pod("shop", "web-0");
        pod["metadata"]["resourceVersion"] = "17".into();
        pod["metadata"]["uid"] = "u-17".into();
        let line =
            serde_json::to_vec(&serde_json::json!({"type": "ADDED", "object": pod})).unwrap();
        let ev = decode_line(&line, DROP).unwrap();
        let mut expected = pod.clone();
        let dropped = expected["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        assert!(dropped.is_some(), "the fixture has managedFields");
        let got: serde_json::Value = serde_json::from_slice(&ev.object).unwrap();
        assert_eq!(got, expected);
        assert_eq!(ev.meta.name, "web-0");
        assert_eq!(ev.meta.kind, "Pod");
    }

    #[test]
    fn drops_managed_fields_and_nothing_else() {
        let ev = decode_line(pod_line().as_bytes(), DROP).unwrap();
        let mut expected: serde_json::Value = serde_json::from_str(&pod_line()).unwrap();
        expected["object"]["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        let got: serde_json::Value = serde_json::from_slice(&ev.object).unwrap();
        assert_eq!(got, expected["object"]);
    }

    #[test]
    fn secret_data_is_removed_unless_allowed() {
        let line = r#"{"type":"ADDED","object":{"kind":"Secret","apiVersion":"v1","metadata":{"name":"s","namespace":"a","uid":"u","resourceVersion":"7"},"data":{"k":"c2VjcmV0"},"stringData":{"x":"y"},"type":"Opaque"}}"#;
        let ev = decode_line(line.as_bytes(), DROP).unwrap();
        let got: serde_json::Value = serde_json::from_slice(&ev.object).unwrap();
        assert!(got.get("data").is_none() && got.get("stringData").is_none());
        assert_eq!(got["type"], "Opaque");
        let allowed = decode_line(
            line.as_bytes(),
            Trim {
                allow_secret_data: true,
                ..DROP
            },
        )
        .unwrap();
        let got: serde_json::Value = serde_json::from_slice(&allowed.object).unwrap();
        assert_eq!(got["data"]["k"], "c2VjcmV0");
    }

    #[test]
    fn escaped_strings_are_decoded() {
        let line = r#"{"type":"ADDED","object":{"kind":"ConfigMap","metadata":{"name":"a\u002db","uid":"u","resourceVersion":"1"},"data":{"q\"k":"v"}}}"#;
        let ev = decode_line(line.as_bytes(), DROP).unwrap();
        assert_eq!(ev.meta.name, "a-b");
        let got: serde_json::Value = serde_json::from_slice(&ev.object).unwrap();
        assert_eq!(got["data"]["q\"k"], "v");
    }

    #[test]
    fn errors_carry_status_code_and_garbage_is_rejected() {
        let line = r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (50)","reason":"Expired","code":410}}"#;
        let ev = decode_line(line.as_bytes(), DROP).unwrap();
        assert_eq!(ev.status_code, Some(410));
        assert!(decode_line(b"{\"type\":\"ADDED\",\"object\":{\"metadata\":", DROP).is_err());
        assert!(decode_line(b"not json", DROP).is_err());
        assert!(decode_line(
            br#"{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"x"}}}"#,
            DROP
        )
        .is_err());
    }

    #[test]
    fn envelope_validates_as_watch_event_with_metadata() {
        let ev = decode_line(pod_line().as_bytes(), DROP).unwrap();
        let meta = EnvelopeMeta {
            id: "u-1/42",
            channel: "/api/v1/namespaces/{namespace}/pods",
            operation_id: "watchNamespacedPods",
            message: "WatchEvent",
            cluster: "prod",
            namespace: Some("shop"),
            resource_version: "42",
            observed_at: "2026-01-01T00:00:00.000Z",
            resync: false,
            synthetic: false,
            truncated_bytes: None,
        };
        let v: serde_json::Value =
            serde_json::from_slice(&envelope_value("MODIFIED", &ev.object, &meta)).unwrap();
        assert_eq!(v["type"], "MODIFIED");
        assert_eq!(v["object"]["metadata"]["name"], "web-1");
        assert_eq!(v["watchrelay"]["operationId"], "watchNamespacedPods");
        assert_eq!(v["watchrelay"]["resync"], false);
        let h = cloudevents_headers(
            &meta,
            "MODIFIED",
            "/clusters/prod/api/v1/namespaces/shop/pods",
            "shop/web-1",
        );
        assert!(h.contains(&("ce_type", "io.watchrelay.WatchEvent.MODIFIED".to_string())));
        assert!(h.contains(&("ce_subject", "shop/web-1".to_string())));
    }

    #[test]
    fn list_items_get_their_type_meta() {
        let item: Box<RawValue> =
            serde_json::from_str(r#"{"metadata":{"name":"n","namespace":"a","uid":"u","resourceVersion":"3"},"spec":{}}"#).unwrap();
        let ev = decode_item("ADDED", &item, DROP, ("apps/v1", "Deployment")).unwrap();
        let got: serde_json::Value = serde_json::from_slice(&ev.object).unwrap();
        assert_eq!(got["apiVersion"], "apps/v1");
        assert_eq!(got["kind"], "Deployment");
        assert_eq!(got["metadata"]["name"], "n");
        assert_eq!(ev.meta.kind, "Deployment");
    }

    #[test]
    fn reference_object_keeps_identity() {
        let ev = decode_line(pod_line().as_bytes(), DROP).unwrap();
        let r: serde_json::Value = serde_json::from_slice(&reference_object(&ev.meta)).unwrap();
        assert_eq!(r["metadata"]["uid"], "u-1");
        assert_eq!(r["kind"], "Pod");
        assert_eq!(r["metadata"]["namespace"], "shop");
    }
}
