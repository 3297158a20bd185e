use serde_json::json;

use super::*;
use crate::asyncapi::{document, ClusterSchemas};
use crate::config::Config;

fn config() -> Config {
    Config::parse("clusterName: prod\nkafka:\n  bootstrapServers: k:9092\n  oversize: trim\ncheckpoint:\n  namespace: relay\nchannels:\n  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: pods\n  - operationId: watchNodes\n    topic: pods\n  - operationId: watchNamespacedServices\n    namespaces: [a]\n    topic: svc\n")
        .unwrap()
}

fn cluster() -> ClusterSchemas {
    ClusterSchemas {
        objects: [(
            "watchNamespacedServices".to_string(),
            json!({"$ref": "#/components/schemas/io.k8s.api.core.v1.Service"}),
        )]
        .into(),
        components: [
            (
                "io.k8s.api.core.v1.Service".to_string(),
                json!({"type": "object", "properties": {
                    "metadata": {"allOf": [{"$ref": "#/components/schemas/meta"}]},
                    "spec": {"type": "object", "properties": {
                        "targetPort": {"type": "string", "format": "int-or-string"},
                        "weight": {"type": "integer", "x-kubernetes-int-or-string": true},
                        "note": {"type": "string", "nullable": true},
                        "type": {"type": "string", "enum": ["ClusterIP", "NodePort"]},
                    }},
                }}),
            ),
            (
                "meta".to_string(),
                json!({"type": "object", "required": ["name"]}),
            ),
        ]
        .into(),
    }
}

#[test]
fn a_topic_registers_its_channels_envelope_with_everything_it_refers_to() {
    let doc = document(&config(), Some(&cluster()));
    let s = topic_schema(&doc, "svc", &["watchNamespacedServices"]);
    assert_eq!(s["$schema"], "http://json-schema.org/draft-07/schema#");
    assert_eq!(s["$ref"], "#/definitions/watchNamespacedServices.envelope");
    let defs = s["definitions"].as_object().unwrap();
    let mut names: Vec<&str> = defs.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "io.k8s.api.core.v1.Service",
            "meta",
            "watchNamespacedServices.envelope",
            "watchrelay.metadata",
            "watchrelay.reference"
        ]
    );
    let env = &defs["watchNamespacedServices.envelope"];
    assert_eq!(
        env["else"]["properties"]["object"]["$ref"],
        "#/definitions/io.k8s.api.core.v1.Service"
    );
    // Nothing points back into the AsyncAPI document.
    assert!(!s.to_string().contains("#/components/"));
    let spec = &defs["io.k8s.api.core.v1.Service"]["properties"]["spec"]["properties"];
    assert_eq!(spec["targetPort"]["type"], json!(["integer", "string"]));
    assert!(spec["targetPort"].get("format").is_none());
    assert_eq!(spec["weight"]["type"], json!(["integer", "string"]));
    assert_eq!(spec["note"]["type"], json!(["string", "null"]));
    assert!(spec["note"].get("nullable").is_none());
    // A property named `type` is a property, and enums are data.
    assert_eq!(spec["type"]["enum"], json!(["ClusterIP", "NodePort"]));
    assert_eq!(defs["meta"]["required"], json!(["name"]));
}

#[test]
fn a_topic_two_channels_share_takes_either_envelope() {
    let doc = document(&config(), None);
    let s = topic_schema(&doc, "pods", &["watchNamespacedPods", "watchNodes"]);
    assert_eq!(
        s["anyOf"],
        json!([
            {"$ref": "#/definitions/watchNamespacedPods.envelope"},
            {"$ref": "#/definitions/watchNodes.envelope"}
        ])
    );
    assert!(s["definitions"]["kubernetes.object"].is_object());
    assert_eq!(subject("prod.pods"), "prod.pods-value");
}
