//! The decoder against serde_json on random lines: realistic watch lines, then each mutated
//! at random (bytes changed, inserted, deleted, repeated, the line cut short), every one checked
//! by the contract the fuzz target checks (`watchrelay::testing::conformance`). A failure names its line.

mod common;

use common::rng::Rng;
use serde_json::json;
use watchrelay::testing::conformance;
use watchrelay_sim::objects;

/// Watch lines as the API server writes them, with what makes decoding interesting: escapes,
/// non-ASCII text, numbers of every form, managedFields, Secret data, nesting, whitespace.
fn corpus() -> Vec<Vec<u8>> {
    let mut pod = objects::pod("shop", "web-0");
    pod["metadata"]["resourceVersion"] = "17".into();
    pod["metadata"]["uid"] = "6f1c9f0e-3c57-4a47-9d2c-0c8e2b8d6a11".into();
    pod["metadata"]["annotations"] = json!({"note": "quote \" backslash \\ tab \t é € \u{1F600}"});
    pod["spec"]["numbers"] = json!([
        0,
        -1,
        2.5,
        -3.25e-7,
        1e300,
        123456789012_i64,
        true,
        false,
        null
    ]);
    pod["spec"]["deep"] = json!({"a": [{"b": [[], {}, [{"c": ""}]]}]});
    let applied = r#"{"apiVersion":"v1","data":{"k":"c2VjcmV0"},"kind":"Secret"}"#;
    let secret = json!({
        "kind": "Secret", "apiVersion": "v1",
        "metadata": {"name": "s", "namespace": "a", "uid": "u-2", "resourceVersion": "9",
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": applied},
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:data": {".": {}, "f:k": {}}}}]},
        "data": {"k": "c2VjcmV0"}, "type": "Opaque"
    });
    let bookmark = json!({"kind": "Pod", "apiVersion": "v1", "metadata": {
        "resourceVersion": "20", "annotations": {"k8s.io/initial-events-end": "true"}}});
    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "reason": "Expired", "code": 410});
    let mut lines: Vec<Vec<u8>> = [
        ("ADDED", pod.clone()),
        ("DELETED", secret),
        ("BOOKMARK", bookmark),
        ("ERROR", status),
    ]
    .into_iter()
    .map(|(t, o)| serde_json::to_vec(&json!({"type": t, "object": o})).unwrap())
    .collect();
    // The same pod pretty-printed: whitespace everywhere a token may be.
    lines.push(serde_json::to_vec_pretty(&json!({"type": "MODIFIED", "object": pod})).unwrap());
    lines
}

/// `line` changed in one of a few ways, at random places.
fn mutate(rng: &mut Rng, line: &[u8]) -> Vec<u8> {
    // Bytes that matter to a JSON scanner, and some that do not.
    const BYTES: &[u8] = b"{}[]:,\"\\ \t\n\r0123456789-+.eEtrufalsn/bu\x00\x01\x1f\x7f\xc3\xa9\xff";
    let mut out = line.to_vec();
    for _ in 0..1 + rng.index(3) {
        if out.is_empty() {
            break;
        }
        let at = rng.index(out.len());
        let byte = BYTES[rng.index(BYTES.len())];
        match rng.index(6) {
            0 => out[at] = byte,
            1 => out.insert(at, byte),
            2 => {
                out.remove(at);
            }
            3 => out.truncate(at),
            4 => {
                let end = (at + 1 + rng.index(16)).min(out.len());
                let piece = out[at..end].to_vec();
                out.splice(at..at, piece);
            }
            _ => {
                let end = (at + 1 + rng.index(8)).min(out.len());
                out.drain(at..end);
            }
        }
    }
    out
}

#[test]
fn the_corpus_decodes_as_serde_json_reads_it() {
    for line in corpus() {
        conformance::check(&line);
        watchrelay::decode::decode_line(
            &line,
            watchrelay::decode::Trim {
                drop_managed_fields: true,
                allow_secret_data: false,
            },
        )
        .unwrap();
    }
}

#[test]
fn mutated_lines_are_refused_or_decoded_as_serde_json_reads_them() {
    let corpus = corpus();
    let mut rng = Rng(0x5eed_f00d_1e55);
    for _ in 0..20_000 {
        let line = &corpus[rng.index(corpus.len())];
        conformance::check(&mutate(&mut rng, line));
    }
}

#[test]
fn edge_cases_of_the_contract() {
    let deep = |n| "[".repeat(n) + &"]".repeat(n);
    for case in [
        b"".to_vec(),
        b"   ".to_vec(),
        b"{".to_vec(),
        b"\"".to_vec(),
        b"\"\\".to_vec(),
        b"nul".to_vec(),
        b"1 2".to_vec(),
        b"-".to_vec(),
        b"[\"\xff\"]".to_vec(),
        deep(128).into_bytes(),
        deep(129).into_bytes(),
        br#"{"type":"ADDED","type":"DELETED","object":{"metadata":{"resourceVersion":"1"}}}"#.to_vec(),
        br#"{"type":"ADDED","object":{"metadata":{"resourceVersion":"1","managedFields":[1 2]}}}"#
            .to_vec(),
        br#"{"type":"ADDED","object":{"metadata":{"resourceVersion":"1"},"metadata":{"managedFields":[]}}}"#
            .to_vec(),
    ] {
        conformance::check(&case);
    }
}
