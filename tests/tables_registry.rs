//! A CRD's schema changing under a running relay with a schema registry (Apicurio Registry 3 at
//! `WATCHRELAY_REGISTRY_URL`; `scripts/test.sh` starts one): a change the subject's compatibility
//! rule allows becomes the subject's next version and the records move to its id; one the rule
//! refuses stops the relay with an error naming the subject and the rule, and no other subject
//! is made.

mod common;

use std::process::Command;
use std::sync::Arc;

use common::bed::{eventually, Bed, Relay};
use common::view::events;
use serde_json::{json, Value};
use watchrelay::testing::Memory;
use watchrelay_sim::Resource;

fn registry() -> String {
    std::env::var("WATCHRELAY_REGISTRY_URL")
        .expect("WATCHRELAY_REGISTRY_URL: an Apicurio Registry (scripts/test.sh starts one)")
}

/// One request to the registry's Confluent-compatible API; its JSON answer.
fn ccompat(method: &str, path: &str, body: Option<Value>) -> Value {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-X", method])
        .arg(format!("{}/apis/ccompat/v7{path}", registry()));
    if let Some(b) = body {
        cmd.args(["-H", "content-type: application/json", "-d"])
            .arg(b.to_string());
    }
    let out = cmd.output().expect("curl");
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// The widget CRD's schema, `size` of type `size_type`, with or without `color`.
fn widgets(size_type: &str, color: bool) -> Resource {
    let mut spec = json!({"size": {"type": size_type}});
    if color {
        spec["color"] = json!({"type": "string"});
    }
    Resource::new("example.com", "v1", "widgets", "Widget", true, &[]).with_schema(json!({
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {"type": "object", "properties": spec},
        },
    }))
}

fn widget(name: &str, size: i64) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget",
           "metadata": {"name": name, "namespace": "a"}, "spec": {"size": size}})
}

/// The content id the last record of `key` carries.
fn content_id(producer: &Memory, key: &str) -> Option<u64> {
    events(producer)
        .iter()
        .rev()
        .find(|r| r.key == key && !r.tombstone)
        .and_then(|r| r.headers.get_bytes("apicurio.value.contentId"))
        .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crds_schema_change_is_a_new_version_or_a_clear_refusal() {
    let bed = Bed::in_memory(watchrelay_sim::SimConfig::default(), &["a"]).await;
    bed.sim.register_resource(widgets("integer", true));
    let topic = format!(
        "widgets-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    );
    let subject = format!("{topic}-value");
    let producer = Arc::new(Memory::new());
    let cfg = bed.config_with(
        &format!("  - path: /apis/example.com/v1/namespaces/{{namespace}}/widgets\n    name: widgets\n    namespaces: [a]\n    topic: {topic}\n"),
        "",
        &format!(
            "schemaRegistry:\n  url: {}/apis/ccompat/v7\n  refreshSeconds: 1\n",
            registry()
        ),
    );
    let relay = Relay::start_with(&bed, cfg, Some(producer.clone()));
    relay.wait_up(1).await;
    bed.sim
        .create("widgets.example.com", Some("a"), widget("w", 1))
        .unwrap();
    eventually(
        || content_id(&producer, "a/w").is_some(),
        || "no record carried its schema's id".to_string(),
    )
    .await;
    let first = content_id(&producer, "a/w").unwrap();
    assert_eq!(
        ccompat("GET", &format!("/subjects/{subject}/versions"), None),
        json!([1])
    );
    let schema = ccompat("GET", &format!("/subjects/{subject}/versions/1"), None);
    let schema: Value = serde_json::from_str(schema["schema"].as_str().unwrap()).unwrap();
    assert_eq!(
        schema["definitions"]["com.example.v1.Widget"]["properties"]["spec"]["properties"]["size"]
            ["type"],
        "integer",
        "the subject holds the CRD's own schema: {schema}"
    );
    ccompat(
        "PUT",
        &format!("/config/{subject}"),
        Some(json!({"compatibility": "BACKWARD"})),
    );

    // Dropping an optional field is a change BACKWARD allows: the subject's next version, and
    // the records move to its id.
    bed.sim.register_resource(widgets("integer", false));
    eventually(
        || ccompat("GET", &format!("/subjects/{subject}/versions"), None) == json!([1, 2]),
        || "the changed schema was not registered as the subject's next version".to_string(),
    )
    .await;
    // Changes go on until one is published under the new version's id (the tag moves a moment
    // after the registry answers).
    let mut size = 1;
    eventually(
        || {
            if content_id(&producer, "a/w").is_some_and(|id| id != first) {
                return true;
            }
            size += 1;
            bed.sim
                .merge_patch(
                    "widgets.example.com",
                    Some("a"),
                    "w",
                    json!({"spec": {"size": size}}),
                )
                .unwrap();
            false
        },
        || "records kept the first schema's id".to_string(),
    )
    .await;

    // A field changing type is one BACKWARD refuses: the relay stops, saying so.
    bed.sim.register_resource(widgets("string", false));
    eventually(
        || relay.ended(),
        || "the relay went on under a schema its registry refused".to_string(),
    )
    .await;
    let error = relay.outcome().await.unwrap_err();
    assert!(
        error.contains(&subject) && error.contains("BACKWARD"),
        "the error names the subject and its rule: {error}"
    );
    assert_eq!(
        ccompat("GET", &format!("/subjects/{subject}/versions"), None),
        json!([1, 2])
    );
}
