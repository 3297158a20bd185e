//! Pure decoding: one watch line (or list item) in, one [`WatchEvent`] out.
//!
//! The object is never re-encoded: the line is scanned once (and validated) into the spans of
//! its top-level members, and of `metadata`'s members in the same pass, and the trimmed object
//! is written back by copying slices. Only the identity fields are decoded.

use std::borrow::Cow;
use std::ops::Range;

use serde_json::value::RawValue;
use thiserror::Error;

use crate::event::{EventType, Identity, Meta, WatchEvent};
use crate::json::{ScanError, Scanner, Str};

/// Why a watch line or list item could not be decoded; the stream counts it and skips it.
#[derive(Debug, Error)]
pub enum DecodeError {
    /// Not well-formed JSON, or not an object where one is needed.
    #[error("malformed watch line: {0}")]
    Json(#[from] ScanError),
    /// Bytes that are not UTF-8.
    #[error("malformed watch line: not UTF-8")]
    Utf8,
    /// A member the relay needs is absent: `type`, `object`, `metadata` or its resourceVersion.
    #[error("watch event without {0}")]
    Missing(&'static str),
    /// A `type` other than the five the API defines.
    #[error("unknown watch event type {0:?}")]
    UnknownType(String),
}

/// One member of a scanned object: its key token and where its value lies in the source.
struct Member {
    key: Str,
    value: Range<usize>,
    /// The members of `metadata`, split out in the same pass so it is scanned once.
    metadata: Option<Fields>,
}

/// The members of one scanned object, in a vector reused from line to line (per thread), so
/// scanning a line allocates nothing once the first lines are done.
struct Fields(Vec<Member>);

thread_local! {
    static SPARE_MEMBERS: std::cell::RefCell<Vec<Vec<Member>>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Fields {
    fn new() -> Self {
        let spare = SPARE_MEMBERS.with_borrow_mut(Vec::pop);
        // Room for a typical metadata (about ten members) without growing.
        Self(spare.unwrap_or_else(|| Vec::with_capacity(16)))
    }
}

impl std::ops::Deref for Fields {
    type Target = [Member];

    fn deref(&self) -> &[Member] {
        &self.0
    }
}

impl Drop for Fields {
    fn drop(&mut self) {
        let mut v = std::mem::take(&mut self.0);
        v.clear();
        // An object, its metadata and its annotations: a few are enough.
        // (Not at all while the thread is ending.)
        let _ = SPARE_MEMBERS.try_with(|spare| {
            let mut spare = spare.borrow_mut();
            if spare.len() < 4 {
                spare.push(v);
            }
        });
    }
}

/// A Kubernetes object as spans of its source.
struct Object<'a> {
    src: &'a str,
    /// Where the whole object stands in `src`.
    span: Range<usize>,
    members: Fields,
}

fn find<'m>(src: &str, members: &'m [Member], key: &str) -> Option<&'m Member> {
    members.iter().find(|m| m.key.text(src) == key)
}

/// A member's value when it is a string.
fn string_of<'a>(src: &'a str, members: &[Member], key: &str) -> Option<Cow<'a, str>> {
    let m = find(src, members, key)?;
    Some(Str::at(src, &m.value)?.text(src))
}

/// Scans an object starting at the scanner's position. The values of `dropped` members are
/// only delimited (they are not published). With `metadata`, the members of a `metadata`
/// object are recorded too, its `metadata` members dropped.
fn scan_object<'a>(
    sc: &mut Scanner<'a>,
    metadata: Option<&[&str]>,
    dropped: &[&str],
) -> Result<Object<'a>, ScanError> {
    let begin = sc.pos()?;
    sc.expect(b'{', "expected an object")?;
    let mut members = Fields::new();
    let mut split = metadata;
    let mut first = true;
    while sc.next_member(first)? {
        first = false;
        let key = sc.key()?;
        let name = key.text(sc.src());
        let (value, metadata) = match split {
            Some(md_dropped) if name == "metadata" => {
                split = None;
                let md = scan_object(sc, None, md_dropped)?;
                (md.span, Some(md.members))
            }
            _ if dropped.contains(&name.as_ref()) => (sc.delimit()?, None),
            _ => (sc.value()?, None),
        };
        members.0.push(Member {
            key,
            value,
            metadata,
        });
    }
    Ok(Object {
        src: sc.src(),
        span: begin..sc.end_of_last(),
        members,
    })
}

/// What a Secret's `kubectl apply` leaves in its annotations: the whole object, data included.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The only annotations a Secret keeps (unless its channel allows Secret data): Kubernetes' own,
/// which name and describe it. Any other may hold a copy of its data — `kubectl apply`'s
/// [`LAST_APPLIED`], kapp's `kapp.k14s.io/original`, other tools' own — so it is dropped
/// rather than trusted.
pub const SECRET_ANNOTATIONS: &[&str] = &[
    "kubernetes.io/service-account.name",
    "kubernetes.io/service-account.uid",
    "kubernetes.io/description",
];

/// How [`write_members`] changes `metadata` when it writes it back.
#[derive(Clone, Copy, Default)]
struct MetadataEdit<'a> {
    /// Members left out.
    skip: &'a [&'a str],
    /// A replacement for the value of `annotations`.
    annotations: Option<&'a [u8]>,
}

/// Writes `members` back as an object after `prefix` (members to add), leaving out `skip`,
/// writing `replace`'s value for its key, and editing a split-out `metadata` by `md`. Keys go
/// out as they came in.
fn write_members(
    out: &mut Vec<u8>,
    src: &str,
    members: &[Member],
    prefix: &[u8],
    skip: &[&str],
    replace: Option<(&str, &[u8])>,
    md: MetadataEdit<'_>,
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
        match (&m.metadata, replace) {
            (Some(md_members), _) => write_members(
                out,
                src,
                md_members,
                b"",
                md.skip,
                md.annotations.map(|a| ("annotations", a)),
                MetadataEdit::default(),
            ),
            (None, Some((k, value))) if m.key.text(src) == k => out.extend_from_slice(value),
            (None, _) => out.extend_from_slice(&src.as_bytes()[m.value.clone()]),
        }
    }
    out.push(b'}');
}

impl<'a> Object<'a> {
    fn string(&self, key: &str) -> Option<Cow<'a, str>> {
        string_of(self.src, &self.members, key)
    }

    fn metadata_members(&self) -> Option<&[Member]> {
        self.members.iter().find_map(|m| m.metadata.as_deref())
    }
}

/// How objects are trimmed before they leave the cluster.
#[derive(Clone, Copy, Debug)]
pub struct Trim {
    /// Leave out `metadata.managedFields`.
    pub drop_managed_fields: bool,
    /// Keep a Secret's `data`, `stringData` and every annotation (otherwise they are dropped).
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
    decode_scanned(&mut Scanner::new(src), trim, out)
}

/// [`decode_line_into`], with a scanner at the start of the line.
fn decode_scanned(
    sc: &mut Scanner<'_>,
    trim: Trim,
    out: Vec<u8>,
) -> Result<WatchEvent, DecodeError> {
    let src = sc.src();
    sc.expect(b'{', "expected an object")?;
    let (mut event_type, mut object) = (None, None);
    let mut first = true;
    while sc.next_member(first)? {
        first = false;
        let key = sc.key()?;
        match key.text(src).as_ref() {
            "type" if event_type.is_none() => {
                let s = sc.string()?;
                let name = sc.text(&s);
                event_type = Some(
                    EventType::parse(&name)
                        .ok_or_else(|| DecodeError::UnknownType(name.into_owned()))?,
                );
            }
            "object" if object.is_none() => {
                object = Some(scan_object(sc, Some(metadata_dropped(trim)), &[])?)
            }
            _ => {
                sc.value()?;
            }
        }
    }
    sc.end()?;
    let event_type = event_type.ok_or(DecodeError::Missing("type"))?;
    let object = object.ok_or(DecodeError::Missing("object"))?;
    decode_object(sc, event_type, &object, trim, None, out)
}

/// Decodes one item of a list, as if it arrived in an event of `event_type`. List items usually
/// lack `apiVersion` and `kind`; `type_meta` supplies them so the envelope carries a whole object.
pub fn decode_item(
    event_type: EventType,
    object: &RawValue,
    trim: Trim,
    type_meta: (&str, &str),
) -> Result<WatchEvent, DecodeError> {
    let mut sc = Scanner::new(object.get());
    let parsed = scan_object(&mut sc, Some(metadata_dropped(trim)), &[])?;
    sc.end()?;
    decode_object(
        &mut sc,
        event_type,
        &parsed,
        trim,
        Some(type_meta),
        Vec::new(),
    )
}

/// The event of a scanned `object`; `sc` is the scanner it came from, for a second look at a
/// member (annotations).
fn decode_object(
    sc: &mut Scanner<'_>,
    event_type: EventType,
    object: &Object<'_>,
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
            api_version = Some(av.into());
        }
        if kind.is_none() && !k.is_empty() {
            member("kind", k);
            kind = Some(k.into());
        }
    }
    let kind = kind.unwrap_or_default();
    let src = object.src;
    let status_code = if event_type == EventType::Error {
        find(src, &object.members, "code").and_then(|c| src[c.value.clone()].parse().ok())
    } else {
        None
    };
    let metadata = match object.metadata_members() {
        Some(m) => m,
        None if event_type == EventType::Error => &[],
        None => return Err(DecodeError::Missing("metadata")),
    };
    // The identity's fields in one pass over `metadata`, each from its first member.
    let mut fields: [Option<Option<Cow<'_, str>>>; 4] = Default::default();
    for m in metadata {
        let slot = match m.key.text(src).as_ref() {
            "name" => 0,
            "namespace" => 1,
            "uid" => 2,
            "resourceVersion" => 3,
            _ => continue,
        };
        fields[slot].get_or_insert_with(|| Str::at(src, &m.value).map(|s| s.text(src)));
    }
    let [name, namespace, uid, rv] = fields.map(Option::flatten);
    let meta = Meta::new(Identity {
        kind: &kind,
        api_version: api_version.as_deref().unwrap_or_default(),
        name: name.as_deref().unwrap_or_default(),
        namespace: namespace.as_deref(),
        uid: uid.as_deref().unwrap_or_default(),
        resource_version: rv.as_deref().unwrap_or_default(),
    });
    if meta.resource_version().is_empty() && event_type != EventType::Error {
        return Err(DecodeError::Missing("metadata.resourceVersion"));
    }
    // The members of `metadata.annotations`, when it is an object.
    let annotations = |sc: &mut Scanner<'_>| {
        let a = find(src, metadata, "annotations")?;
        sc.seek(a.value.start);
        Some((a.value.len(), scan_object(sc, None, &[]).ok()?.members))
    };
    let initial_events_end = event_type == EventType::Bookmark
        && annotations(sc).is_some_and(|(_, members)| {
            string_of(src, &members, "k8s.io/initial-events-end").as_deref() == Some("true")
        });
    let secret = meta.kind() == "Secret" && !trim.allow_secret_data;
    // A Secret's annotations keep only those on the allow-list: the others may carry a copy of
    // the object, data included.
    let annotations = if secret {
        annotations(sc).and_then(|(len, members)| {
            let dropped: Vec<Cow<'_, str>> = members
                .iter()
                .map(|m| m.key.text(src))
                .filter(|k| !SECRET_ANNOTATIONS.contains(&k.as_ref()))
                .collect();
            if dropped.is_empty() {
                return None;
            }
            let dropped: Vec<&str> = dropped.iter().map(AsRef::as_ref).collect();
            let mut edited = Vec::with_capacity(len);
            write_members(
                &mut edited,
                src,
                &members,
                b"",
                &dropped,
                None,
                MetadataEdit::default(),
            );
            Some(edited)
        })
    } else {
        None
    };
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
        None,
        MetadataEdit {
            skip: metadata_dropped(trim),
            annotations: annotations.as_deref(),
        },
    );
    Ok(WatchEvent {
        event_type,
        meta,
        object: out,
        status_code,
        initial_events_end,
    })
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
        assert_eq!(ev.event_type, EventType::Modified);
        assert_eq!(ev.meta.key(), "shop/web-1");
        assert_eq!(ev.meta.uid(), "u-1");
        assert_eq!(ev.meta.resource_version(), "42");
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
        assert_eq!(ev.meta.name(), "web-0");
        assert_eq!(ev.meta.kind(), "Pod");
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

    /// The object of `line` decoded with Secret data allowed.
    fn allowing_secrets(line: &[u8]) -> serde_json::Value {
        let trim = Trim {
            allow_secret_data: true,
            ..DROP
        };
        serde_json::from_slice(&decode_line(line, trim).unwrap().object).unwrap()
    }

    #[test]
    fn secret_data_is_removed_unless_allowed() {
        let line = r#"{"type":"ADDED","object":{"kind":"Secret","apiVersion":"v1","metadata":{"name":"s","namespace":"a","uid":"u","resourceVersion":"7"},"data":{"k":"c2VjcmV0"},"stringData":{"x":"y"},"type":"Opaque"}}"#;
        let ev = decode_line(line.as_bytes(), DROP).unwrap();
        let got: serde_json::Value = serde_json::from_slice(&ev.object).unwrap();
        assert!(got.get("data").is_none() && got.get("stringData").is_none());
        assert_eq!(got["type"], "Opaque");
        let got = allowing_secrets(line.as_bytes());
        assert_eq!(got["data"]["k"], "c2VjcmV0");
    }

    #[test]
    fn a_secret_applied_with_kubectl_keeps_no_copy_of_its_data() {
        let applied =
            r#"{\"apiVersion\":\"v1\",\"data\":{\"k\":\"c2VjcmV0\"},\"kind\":\"Secret\"}"#;
        // kapp keeps the applied object in an annotation of its own: any tool may.
        let line = format!(
            r#"{{"type":"ADDED","object":{{"kind":"Secret","apiVersion":"v1","metadata":{{"name":"s","namespace":"a","uid":"u","resourceVersion":"7","annotations":{{"team":"x","kubernetes.io/service-account.name":"sa","kapp.k14s.io/original":"{applied}","{LAST_APPLIED}":"{applied}"}}}},"data":{{"k":"c2VjcmV0"}},"type":"Opaque"}}}}"#
        );
        let ev = decode_line(line.as_bytes(), DROP).unwrap();
        let text = String::from_utf8(ev.object.clone()).unwrap();
        assert!(!text.contains("c2VjcmV0"), "{text}");
        let got: serde_json::Value = serde_json::from_slice(&ev.object).unwrap();
        assert_eq!(
            got["metadata"]["annotations"],
            serde_json::json!({"kubernetes.io/service-account.name": "sa"}),
            "only the allow-listed annotations stay"
        );
        let got = allowing_secrets(line.as_bytes());
        assert!(got["metadata"]["annotations"][LAST_APPLIED].is_string());
        // Other kinds keep the annotation: it holds no secret.
        let cm = line.replace(r#""kind":"Secret""#, r#""kind":"ConfigMap""#);
        let got: serde_json::Value =
            serde_json::from_slice(&decode_line(cm.as_bytes(), DROP).unwrap().object).unwrap();
        assert!(got["metadata"]["annotations"][LAST_APPLIED].is_string());
    }

    #[test]
    fn an_object_nested_as_deep_as_the_api_server_allows_is_relayed_whole() {
        // A custom resource with free-form fields, 5,000 levels deep in its spec (and in a
        // managedFields entry, which is dropped, not parsed).
        let deep = "{\"a\":[".repeat(2_500) + "1" + &"]}".repeat(2_500);
        let line = format!(
            r#"{{"type":"ADDED","object":{{"kind":"Deep","apiVersion":"example.com/v1","metadata":{{"name":"d","namespace":"a","uid":"u","resourceVersion":"7","managedFields":[{{"fieldsV1":{deep}}}]}},"spec":{deep}}}}}"#
        );
        let ev = decode_line(line.as_bytes(), DROP).expect("decoded");
        let text = String::from_utf8(ev.object).unwrap();
        assert!(
            text.ends_with(&format!(r#""spec":{deep}}}"#)),
            "the spec is whole"
        );
        assert!(!text.contains("managedFields"));
    }

    #[test]
    fn an_event_type_the_api_does_not_define_is_an_error_not_a_new_label() {
        let line = br#"{"type":"INVENTED","object":{"kind":"Pod","metadata":{"name":"x","resourceVersion":"1"}}}"#;
        assert!(matches!(
            decode_line(line, DROP),
            Err(DecodeError::UnknownType(t)) if t == "INVENTED"
        ));
    }

    #[test]
    fn escaped_strings_are_decoded() {
        let line = r#"{"type":"ADDED","object":{"kind":"ConfigMap","metadata":{"name":"a\u002db","uid":"u","resourceVersion":"1"},"data":{"q\"k":"v"}}}"#;
        let ev = decode_line(line.as_bytes(), DROP).unwrap();
        assert_eq!(ev.meta.name(), "a-b");
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
    fn list_items_get_their_type_meta() {
        let item: Box<RawValue> =
            serde_json::from_str(r#"{"metadata":{"name":"n","namespace":"a","uid":"u","resourceVersion":"3"},"spec":{}}"#).unwrap();
        let ev = decode_item(EventType::Added, &item, DROP, ("apps/v1", "Deployment")).unwrap();
        let got: serde_json::Value = serde_json::from_slice(&ev.object).unwrap();
        assert_eq!(got["apiVersion"], "apps/v1");
        assert_eq!(got["kind"], "Deployment");
        assert_eq!(got["metadata"]["name"], "n");
        assert_eq!(ev.meta.kind(), "Deployment");
    }
}
