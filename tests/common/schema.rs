//! The AsyncAPI documents the catalogue comes from, and a validator for the JSON Schema subset
//! their `WatchEvent` schema uses (type, required, enum, properties, additionalProperties).

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

/// Validation errors of `v` against `schema`, with JSON paths.
pub fn validate(schema: &Value, v: &Value, path: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if let Some(t) = schema["type"].as_str() {
        let ok = match t {
            "object" => v.is_object(),
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "array" => v.is_array(),
            "boolean" => v.is_boolean(),
            "number" => v.is_number(),
            _ => true,
        };
        if !ok {
            errs.push(format!("{path}: expected {t}, got {v}"));
            return errs;
        }
    }
    if let Some(en) = schema["enum"].as_array() {
        if !en.contains(v) {
            errs.push(format!("{path}: {v} not in {en:?}"));
        }
    }
    if let Some(req) = schema["required"].as_array() {
        for r in req.iter().filter_map(Value::as_str) {
            if v.get(r).is_none() {
                errs.push(format!("{path}: missing required {r}"));
            }
        }
    }
    if let (Some(props), Some(obj)) = (schema["properties"].as_object(), v.as_object()) {
        for (k, sub) in props {
            if let Some(val) = obj.get(k) {
                errs.extend(validate(sub, val, &format!("{path}.{k}")));
            }
        }
    }
    if let (Some(extra), Some(obj)) = (
        schema.get("additionalProperties").filter(|a| a.is_object()),
        v.as_object(),
    ) {
        let declared = schema["properties"].as_object();
        for (k, val) in obj {
            if declared.is_none_or(|d| !d.contains_key(k)) {
                errs.extend(validate(extra, val, &format!("{path}.{k}")));
            }
        }
    }
    errs
}
