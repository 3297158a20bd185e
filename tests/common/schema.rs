//! The AsyncAPI documents the catalogue comes from, and JSON Schema validation of what the
//! relay publishes (against them, and against the AsyncAPI document the relay generates).

use serde_json::Value;

pub fn documents() -> Vec<(String, Value)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("spec/asyncapi");
    let mut docs = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            let text = std::fs::read_to_string(&path).unwrap();
            let doc: Value =
                serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            docs.push((path.display().to_string(), doc));
        }
    }
    assert!(
        docs.len() >= 2,
        "expected both AsyncAPI documents in {}",
        dir.display()
    );
    docs
}

/// The `WatchEvent` payload schema (identical in both documents).
pub fn watch_event_schema() -> Value {
    documents()[0].1["components"]["schemas"]["WatchEvent"].clone()
}

/// A validator for `schema`.
pub fn validator(schema: &Value) -> jsonschema::Validator {
    jsonschema::validator_for(schema).unwrap_or_else(|e| panic!("invalid schema: {e}"))
}

/// A validator for the schema `name` of an AsyncAPI document's `components.schemas`; its
/// references into the document resolve.
pub fn component_validator(doc: &Value, name: &str) -> jsonschema::Validator {
    assert!(
        doc["components"]["schemas"][name].is_object(),
        "no schema {name} in the document"
    );
    validator(&serde_json::json!({
        "$ref": format!("#/components/schemas/{name}"),
        "components": doc["components"],
    }))
}

/// Validation errors of `v`, each with its JSON path.
pub fn errors(validator: &jsonschema::Validator, v: &Value) -> Vec<String> {
    validator
        .iter_errors(v)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}
