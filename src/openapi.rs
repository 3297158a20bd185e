//! Object schemas from the API server: each channel's kind in its group-version's OpenAPI v3
//! document (`/openapi/v3`), with every schema it refers to, for the AsyncAPI document.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::{json, Value};
use thiserror::Error;

use crate::asyncapi::ClusterSchemas;
use crate::config::Channel;

/// Why a channel's object schema could not be read from the API server.
#[derive(Debug, Error)]
pub enum OpenApiError {
    /// A discovery or `/openapi/v3` request failed.
    #[error("reading {what}: {source}")]
    Api {
        /// What was being read: a path, or the discovery of a group-version.
        what: String,
        /// What the client reported.
        source: kube::Error,
    },
    /// The server does not serve the resource, or its document lacks the kind's schema.
    #[error("{0}")]
    Missing(String),
}

async fn get(client: &kube::Client, uri: &str) -> Result<Value, OpenApiError> {
    let req = http::Request::get(uri)
        .body(Vec::new())
        .expect("a GET with a valid URI builds");
    client
        .request::<Value>(req)
        .await
        .map_err(|source| OpenApiError::Api {
            what: uri.to_string(),
            source,
        })
}

/// The `$ref`ed component names in `schema`.
pub(crate) fn refs(schema: &Value, out: &mut Vec<String>) {
    match schema {
        Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => {
                        if let Some(name) = r.strip_prefix("#/components/schemas/") {
                            out.push(name.to_string());
                        }
                    }
                    _ => refs(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

/// The component schema of `group/version/kind` in a group-version document: the one whose
/// `x-kubernetes-group-version-kind` names it.
fn find_kind<'a>(
    schemas: &'a serde_json::Map<String, Value>,
    group: &str,
    version: &str,
    kind: &str,
) -> Option<&'a str> {
    schemas.iter().find_map(|(name, s)| {
        s["x-kubernetes-group-version-kind"]
            .as_array()?
            .iter()
            .any(|g| g["group"] == group && g["version"] == version && g["kind"] == kind)
            .then_some(name.as_str())
    })
}

/// Adds `name` and every schema it refers to, transitively, from `schemas` to `out`.
fn collect(
    schemas: &serde_json::Map<String, Value>,
    name: &str,
    out: &mut BTreeMap<String, Value>,
) {
    let mut todo = vec![name.to_string()];
    let mut seen = BTreeSet::new();
    while let Some(n) = todo.pop() {
        if !seen.insert(n.clone()) {
            continue;
        }
        if let Some(s) = schemas.get(&n) {
            refs(s, &mut todo);
            out.insert(n, s.clone());
        }
    }
}

/// Reads the object schema of every channel from the cluster.
pub async fn cluster_schemas(
    client: &kube::Client,
    channels: &[Arc<Channel>],
) -> Result<ClusterSchemas, OpenApiError> {
    let index = get(client, "/openapi/v3").await?;
    let mut docs: HashMap<String, Value> = HashMap::new();
    let mut out = ClusterSchemas::default();
    for ch in channels {
        let p = &ch.path;
        let gv = if p.group.is_empty() {
            format!("api/{}", p.version)
        } else {
            format!("apis/{}/{}", p.group, p.version)
        };
        let resources = if p.group.is_empty() {
            client.list_core_api_resources(&p.version).await
        } else {
            client.list_api_group_resources(&p.api_version()).await
        }
        .map_err(|source| OpenApiError::Api {
            what: format!("discovery of {gv}"),
            source,
        })?;
        let kind = resources
            .resources
            .iter()
            .find(|r| r.name == p.resource)
            .map(|r| r.kind.clone())
            .ok_or_else(|| OpenApiError::Missing(format!("{gv} does not serve {}", p.resource)))?;
        if !docs.contains_key(&gv) {
            let url = index["paths"][&gv]["serverRelativeURL"]
                .as_str()
                .ok_or_else(|| OpenApiError::Missing(format!("/openapi/v3 lists no {gv}")))?
                .to_string();
            docs.insert(gv.clone(), get(client, &url).await?);
        }
        let schemas = docs[&gv]["components"]["schemas"]
            .as_object()
            .ok_or_else(|| OpenApiError::Missing(format!("{gv}: no components.schemas")))?;
        let name = find_kind(schemas, &p.group, &p.version, &kind)
            .ok_or_else(|| OpenApiError::Missing(format!("{gv}: no schema for kind {kind}")))?;
        collect(schemas, name, &mut out.components);
        out.objects.insert(
            ch.name.clone(),
            json!({"$ref": format!("#/components/schemas/{name}")}),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_is_found_by_its_group_version_kind_with_everything_it_refers_to() {
        let doc = json!({
            "io.k8s.api.core.v1.Pod": {
                "type": "object",
                "properties": {"metadata": {"allOf": [{"$ref": "#/components/schemas/meta.Meta"}]},
                               "spec": {"$ref": "#/components/schemas/io.k8s.api.core.v1.PodSpec"}},
                "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "Pod"}]
            },
            "io.k8s.api.core.v1.PodSpec": {"type": "object", "properties": {"x": {"$ref": "#/components/schemas/meta.Meta"}}},
            "meta.Meta": {"type": "object"},
            "unrelated": {"type": "string"}
        });
        let schemas = doc.as_object().unwrap();
        let name = find_kind(schemas, "", "v1", "Pod").unwrap();
        assert_eq!(name, "io.k8s.api.core.v1.Pod");
        assert_eq!(find_kind(schemas, "apps", "v1", "Pod"), None);
        let mut out = BTreeMap::new();
        collect(schemas, name, &mut out);
        assert_eq!(
            out.keys().collect::<Vec<_>>(),
            [
                "io.k8s.api.core.v1.Pod",
                "io.k8s.api.core.v1.PodSpec",
                "meta.Meta"
            ]
        );
    }
}
