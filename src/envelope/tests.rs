//! The envelope's tests: golden records byte for byte (`tests/fixtures/envelope-records.txt`),
//! references, headers, keys.

use super::*;
use crate::config::KeyTemplate;
use crate::decode::{decode_line, Trim};
use crate::event::Identity;
use crate::event::Meta;
use crate::producer::Record;

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
        owner: None,
        schema: None,
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
        out.push_str(&format!("{name}={}\n", String::from_utf8_lossy(value)));
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
        a.era = 2;
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
    let kind = Meta::new(Identity {
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

/// The records of `records_are_byte_for_byte_what_they_were`, one per section.
const GOLDEN: &str = include_str!("../../tests/fixtures/envelope-records.txt");

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
    let k = |t: &str, m: &Meta| KeyTemplate::parse(t).unwrap().render(m);
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
    let m = Announcement::marker("resync-end", "pods.shop", Meta::default(), "99", true);
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

/// A record carrying every optional header (a sharded stream's inferred DELETED, replaced by a
/// reference) has room for them all, its version among them.
#[test]
fn every_header_fits_at_once() {
    let ev = decode_line(LINE.as_bytes(), trim()).unwrap();
    let route = Route {
        owner: Some(ShardOwner { shard: 3, epoch: 9 }),
        ..route()
    };
    let mut inferred = Announcement::inferred_delete(ev.meta.clone(), "77");
    inferred.era = 5;
    let r = reference(&route, &inferred, 5_000_000, "prod.dlq");
    for name in [
        "ce_subject",
        "ce_resync",
        "ce_synthetic",
        "ce_shard",
        "ce_ownerepoch",
        "ce_truncatedbytes",
    ] {
        assert!(r.headers.get(name).is_some(), "{name}");
    }
    assert_eq!(
        r.headers.get("ce_version"),
        Some(((5u128 << 64) | 77).to_string().as_str())
    );
}

#[test]
fn a_registered_schema_travels_in_headers_and_in_confluents_prefix_when_asked() {
    let ev = decode_line(LINE.as_bytes(), trim()).unwrap();
    let a = Announcement::change(ev.event_type, ev.meta.clone(), false);
    let ids = SchemaIds {
        id: 7,
        global_id: Some(0x0102),
        content_id: Some(7),
    };
    for prefix in [false, true] {
        let tag = std::sync::Arc::new(SchemaTag::new(prefix));
        let route = route().tagged(Some(tag.clone()));
        // Not registered yet: no ids to carry (streams wait for them before publishing).
        let rec = record(&route, &a, &ev.object, Vec::new());
        assert!(rec.headers.get_bytes("apicurio.value.contentId").is_none());
        tag.set(ids);
        let rec = record(&route, &a, &ev.object, Vec::new());
        assert_eq!(
            rec.headers.get_bytes("apicurio.value.contentId"),
            Some(&7u64.to_be_bytes()[..])
        );
        assert_eq!(
            rec.headers.get_bytes("apicurio.value.globalId"),
            Some(&0x0102u64.to_be_bytes()[..])
        );
        let json = if prefix {
            assert_eq!(rec.value[..5], [0, 0, 0, 0, 7]);
            &rec.value[5..]
        } else {
            &rec.value[..]
        };
        let v: serde_json::Value = serde_json::from_slice(json).unwrap();
        assert_eq!(v["type"], "MODIFIED");
        // The oversize path reads an announcement back past the prefix.
        assert!(announced(&rec.value, &rec.key).is_some());
    }
}
