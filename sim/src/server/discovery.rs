//! Discovery and OpenAPI routes: `/version`, `/api`, `/apis`, `/apis/{group}`, the resource
//! list of each group-version, and `/openapi/v3` (documents built by `crate::openapi`).

use http::{Request, Response};
use hyper::body::Incoming;
use serde_json::{json, Value};

use crate::state::Inner;
use crate::wire::{error, json_response, Body};
use crate::SimError;

/// `GET /version`: the server's version info.
pub(super) fn version() -> Response<Body> {
    json_response(200, &version_info())
}

/// `GET /openapi/v3`: the index of OpenAPI documents, one per group-version.
pub(super) fn openapi_index(inner: &Inner) -> Response<Body> {
    let store = inner.store.lock().expect("store lock poisoned");
    json_response(200, &crate::openapi::index(store.resources.values()))
}

/// `GET /openapi/v3/{group-version}`: the OpenAPI document of one group-version.
pub(super) fn openapi_group_version(inner: &Inner, gv: &str) -> Response<Body> {
    let store = inner.store.lock().expect("store lock poisoned");
    match crate::openapi::group_version(store.resources.values(), gv) {
        Some(doc) => json_response(200, &doc),
        None => error(&SimError::not_found("openapi", gv)),
    }
}

/// `GET /api`: the core group's versions (`APIVersions`).
pub(super) fn api_versions(req: &Request<Incoming>) -> Response<Body> {
    json_response(
        200,
        &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": req.headers().get("host").and_then(|h| h.to_str().ok()).unwrap_or("")}]}),
    )
}

/// `GET /apis`: every named group (`APIGroupList`).
pub(super) fn api_groups(inner: &Inner) -> Response<Body> {
    json_response(200, &group_list(inner))
}

/// `GET /apis/{group}`: one named group (`APIGroup`).
pub(super) fn api_group(inner: &Inner, g: &str) -> Response<Body> {
    match group_list(inner)["groups"]
        .as_array()
        .and_then(|gs| gs.iter().find(|x| x["name"] == g))
    {
        Some(grp) => json_response(
            200,
            &json!({"kind": "APIGroup", "apiVersion": "v1", "name": g, "versions": grp["versions"], "preferredVersion": grp["preferredVersion"]}),
        ),
        None => error(&SimError::not_found("group", g)),
    }
}

/// `GET /api/{version}` and `GET /apis/{group}/{version}`: the group-version's resource types
/// (`APIResourceList`).
pub(super) fn api_resources(inner: &Inner, group: &str, version: &str) -> Response<Body> {
    match resource_list(inner, group, version) {
        Some(v) => json_response(200, &v),
        None => error(&SimError::not_found(
            "groupVersion",
            &format!("{group}/{version}"),
        )),
    }
}

fn version_info() -> Value {
    json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-watchrelay-sim", "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64",
    })
}

fn group_list(inner: &Inner) -> Value {
    let store = inner.store.lock().expect("store lock poisoned");
    let mut groups: Vec<(String, String)> = store
        .resources
        .values()
        .filter(|r| !r.group.is_empty())
        .map(|r| (r.group.clone(), r.version.clone()))
        .collect();
    groups.sort();
    groups.dedup();
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(g, v)| {
            let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
            json!({"name": g, "versions": [gv], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn resource_list(inner: &Inner, group: &str, version: &str) -> Option<Value> {
    let store = inner.store.lock().expect("store lock poisoned");
    let resources: Vec<Value> = store
        .resources
        .values()
        .filter(|r| r.group == group && r.version == version)
        .map(|r| {
            json!({
                "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "shortNames": r.short_names,
            })
        })
        .collect();
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}
