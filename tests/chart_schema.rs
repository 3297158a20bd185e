//! The chart's values schema (charts/watchrelay/values.schema.json) against the relay's own
//! configuration: the `config` subtree of the values is the relay's configuration file, so its
//! schema must name exactly the fields the relay accepts ([`field_paths`], read from the file's
//! own types), refuse any other key wherever the relay does, and pass the chart's defaults and the
//! example configurations.

use std::collections::BTreeSet;

use serde_json::{json, Value};
use watchrelay::config::field_paths;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{ROOT}/{path}")).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(path: &str) -> Value {
    serde_saphyr::from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn schema() -> Value {
    serde_json::from_str(&read("charts/watchrelay/values.schema.json")).unwrap()
}

/// The field paths a schema node declares, written as [`field_paths`] writes them: an object
/// with `properties` is a struct (its fields listed, never itself, and it must refuse other
/// keys), a list of objects adds `[]`, anything else (a scalar, a list of scalars, a map with
/// free keys) is a field.
fn schema_paths(node: &Value, path: &str, out: &mut BTreeSet<String>) {
    if let Some(properties) = node.get("properties").and_then(Value::as_object) {
        assert_eq!(
            node.get("additionalProperties"),
            Some(&json!(false)),
            "config{}{path}: the relay refuses unknown fields there, so must the schema",
            if path.is_empty() { "" } else { "." }
        );
        for (key, child) in properties {
            let at = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            schema_paths(child, &at, out);
        }
    } else if let Some(items) = node.get("items").filter(|i| i.get("properties").is_some()) {
        schema_paths(items, &format!("{path}[]"), out);
    } else {
        out.insert(path.to_owned());
    }
}

#[test]
fn the_schema_names_exactly_the_fields_the_relay_accepts() {
    let mut declared = BTreeSet::new();
    schema_paths(&schema()["properties"]["config"], "", &mut declared);
    let accepted: BTreeSet<String> = field_paths().into_iter().collect();
    let missing: Vec<_> = accepted.difference(&declared).collect();
    let unknown: Vec<_> = declared.difference(&accepted).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "charts/watchrelay/values.schema.json is out of step with the configuration: fields the relay \
         accepts and the schema lacks: {missing:?}; fields the schema declares and the relay refuses: {unknown:?}"
    );
}

fn validate(schema: &Value, values: &Value) -> Vec<String> {
    let validator = jsonschema::draft7::new(schema).expect("the schema is a draft-07 schema");
    validator
        .iter_errors(values)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// The chart's defaults with the identity a release must give (the chart has no placeholder).
fn release_defaults() -> Value {
    let mut values = yaml("charts/watchrelay/values.yaml");
    values["config"]["clusterName"] = json!("prod");
    values["config"]["kafka"]["bootstrapServers"] = json!("kafka:9092");
    values
}

#[test]
fn the_charts_defaults_and_the_example_configurations_pass_the_schema() {
    let schema = schema();
    assert_eq!(
        schema["$schema"],
        json!("http://json-schema.org/draft-07/schema#")
    );
    let placeholders = validate(&schema, &yaml("charts/watchrelay/values.yaml"));
    for field in ["clusterName", "bootstrapServers"] {
        assert!(
            placeholders.iter().any(|e| e.contains(field)),
            "the chart installs without {field}: {placeholders:?}"
        );
    }
    let defaults = release_defaults();
    assert_eq!(validate(&schema, &defaults), Vec::<String>::new());
    for file in ["deploy/config.example.yaml", "deploy/config.try.yaml"] {
        let mut values = defaults.clone();
        values["config"] = yaml(file);
        assert_eq!(validate(&schema, &values), Vec::<String>::new(), "{file}");
    }
}

#[test]
fn the_schema_refuses_misspelt_values() {
    let schema = schema();
    let defaults = release_defaults();
    for (path, key) in [
        ("", "replicaCont"),
        ("/config/sharding", "shardz"),
        ("/config/channels/0", "namespace"),
        ("/metrics/serviceMonitor", "enable"),
    ] {
        let mut values = defaults.clone();
        values
            .pointer_mut(path)
            .and_then(Value::as_object_mut)
            .unwrap_or_else(|| panic!("no {path} in the defaults"))
            .insert(key.into(), json!(3));
        let errors = validate(&schema, &values);
        assert!(
            errors.iter().any(|e| e.contains(key)),
            "{path}/{key} passed: {errors:?}"
        );
    }
}

#[test]
fn the_charts_app_version_is_the_relays_version() {
    // appVersion is the default image tag: the image it names must be this version.
    let chart = yaml("charts/watchrelay/Chart.yaml");
    assert_eq!(chart["appVersion"], json!(env!("CARGO_PKG_VERSION")));
}
