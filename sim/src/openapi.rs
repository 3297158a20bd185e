//! `/openapi/v3`: the index of group-versions and one OpenAPI 3.0 document per group-version,
//! as the API server serves them (kubectl reads them for `explain` and client-side validation).
//! Built-in kinds get a generic object schema; a CRD gets the schema it was registered with.

use serde_json::{json, Map, Value};

use crate::resources::Resource;

const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

/// A hash of a group-version's document, for its `serverRelativeURL` (clients cache by it).
fn hash(resources: &[&Resource]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for r in resources {
        for b in r.kind.bytes().chain(
            r.schema
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_default()
                .into_bytes(),
        ) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016X}")
}

/// `GET /openapi/v3`.
pub fn index<'a>(resources: impl Iterator<Item = &'a Resource>) -> Value {
    let mut by_gv: std::collections::BTreeMap<String, Vec<&Resource>> = Default::default();
    for r in resources {
        by_gv.entry(r.openapi_path()).or_default().push(r);
    }
    let paths: Map<String, Value> = by_gv
        .iter()
        .map(|(gv, rs)| {
            (
                gv.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={}", hash(rs))}),
            )
        })
        .collect();
    json!({ "paths": paths })
}

/// `GET /openapi/v3/{gv}`, or `None` when no resource is served there.
pub fn group_version<'a>(resources: impl Iterator<Item = &'a Resource>, gv: &str) -> Option<Value> {
    let mut schemas = Map::new();
    let mut paths = Map::new();
    for r in resources.filter(|r| r.openapi_path() == gv) {
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let collection = if r.namespaced {
            format!("/{gv}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("/{gv}/{}", r.plural)
        };
        paths.insert(
            format!("{collection}/{{name}}"),
            json!({"get": {
                "description": format!("read the specified {}", r.kind),
                "operationId": format!("read{}", r.kind),
                "x-kubernetes-action": "get",
                "x-kubernetes-group-version-kind": gvk,
                "responses": {"200": {"description": "OK", "content": {"application/json": {
                    "schema": {"$ref": format!("#/components/schemas/{}", r.schema_name())}
                }}}},
            }}),
        );
        let mut schema = r.schema.clone().unwrap_or_else(|| {
            json!({
                "description": format!("{} is a simulated {} object.", r.kind, r.api_version()),
                "type": "object",
                "properties": {
                    "apiVersion": {"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."},
                    "kind": {"type": "string", "description": "Kind is a string value representing the REST resource this object represents."},
                    "metadata": {"allOf": [{"$ref": format!("#/components/schemas/{OBJECT_META}")}], "default": {}},
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                },
            })
        });
        schema["x-kubernetes-group-version-kind"] =
            json!([{"group": r.group, "version": r.version, "kind": r.kind}]);
        schemas.insert(r.schema_name(), schema);
    }
    if schemas.is_empty() {
        return None;
    }
    schemas.insert(
        OBJECT_META.into(),
        json!({
            "description": "ObjectMeta is metadata that all persisted resources must have.",
            "type": "object",
            "properties": {
                "name": {"type": "string"}, "namespace": {"type": "string"}, "uid": {"type": "string"},
                "resourceVersion": {"type": "string"}, "generation": {"type": "integer", "format": "int64"},
                "labels": {"type": "object", "additionalProperties": {"type": "string", "default": ""}},
                "annotations": {"type": "object", "additionalProperties": {"type": "string", "default": ""}},
            },
        }),
    );
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}
