//! Schema registry integration: each topic's envelope schema, as a standalone JSON Schema,
//! registered under the topic's subject (`<topic>-value`, Confluent's `TopicNameStrategy`), and
//! the ids the registry gives it carried in every record (see [`crate::envelope::SchemaTag`]).
//!
//! This module is the pure part: the schema a topic registers, made from the AsyncAPI document
//! the relay publishes ([`crate::asyncapi::document`]), so the registry and the document never
//! disagree. [`client`] talks to the registry; [`Schemas`] owns the tags the streams' records
//! read their ids from and keeps them registered.

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

use crate::envelope::envelope_schema;
use crate::openapi::refs;

pub mod client;
mod service;

pub use service::{RegistryError, Schemas};

/// The subject a topic's values register under.
pub fn subject(topic: &str) -> String {
    format!("{topic}-value")
}

/// The JSON Schema (draft 7) of the values of a topic the channels `channels` publish to,
/// standalone: the envelope schemas of `doc` (an AsyncAPI document of [`crate::asyncapi`]),
/// everything they refer to under `definitions`, and OpenAPI's dialect turned into JSON
/// Schema's (`nullable`, int-or-string), so a registry-aware reader validates each record.
/// One channel's topic is its envelope; a topic several channels share takes any of theirs.
pub fn topic_schema(doc: &Value, topic: &str, channels: &[&str]) -> Value {
    let components = &doc["components"]["schemas"];
    let roots: Vec<String> = channels.iter().map(|c| envelope_schema(c)).collect();
    let mut definitions = Map::new();
    let mut todo: Vec<String> = roots.clone();
    let mut seen = BTreeSet::new();
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let Some(schema) = components.get(&name) else {
            continue;
        };
        let mut found = Vec::new();
        refs(schema, &mut found);
        todo.extend(found);
        definitions.insert(name, json_schema(schema));
    }
    let reference = |name: &String| json!({"$ref": format!("#/definitions/{name}")});
    let mut out = json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": format!("Values of {topic}"),
        "description": "watchrelay envelopes (see the relay's AsyncAPI document); a tombstone's null value has no schema",
    });
    match roots.as_slice() {
        [one] => out["$ref"] = json!(format!("#/definitions/{one}")),
        many => out["anyOf"] = many.iter().map(reference).collect(),
    }
    out["definitions"] = Value::Object(definitions);
    out
}

/// One OpenAPI 3.0 schema as JSON Schema draft 7: references into `definitions`; `nullable`
/// admits null; an int-or-string (`format: int-or-string`, `x-kubernetes-int-or-string`) admits
/// both. Keywords JSON Schema does not know (`x-kubernetes-*`) stay: validators ignore them.
fn json_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(m) => {
            let mut out: Map<String, Value> = m
                .iter()
                .map(|(k, v)| match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => (
                        k.clone(),
                        Value::String(r.replace("#/components/schemas/", "#/definitions/")),
                    ),
                    // Property names and enum values are data, not schemas.
                    ("enum" | "required" | "example" | "default", _) => (k.clone(), v.clone()),
                    ("properties" | "patternProperties" | "definitions", Value::Object(p)) => (
                        k.clone(),
                        Value::Object(
                            p.iter()
                                .map(|(name, s)| (name.clone(), json_schema(s)))
                                .collect(),
                        ),
                    ),
                    _ => (k.clone(), json_schema(v)),
                })
                .collect();
            let int_or_string = out.get("format").and_then(Value::as_str) == Some("int-or-string")
                || out.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
            if int_or_string {
                out.remove("type");
                out.remove("format");
                out.insert("type".into(), json!(["integer", "string"]));
            }
            if out.remove("nullable") == Some(Value::Bool(true)) {
                match out.get_mut("type") {
                    Some(t @ Value::String(_)) => *t = json!([t.clone(), "null"]),
                    Some(Value::Array(types)) => types.push(json!("null")),
                    _ => {}
                }
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(json_schema).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests;
