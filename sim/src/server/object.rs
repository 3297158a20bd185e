//! Single-object routes: get, create (registering the resource type a created CRD defines),
//! update, patch (merge, strategic merge, apply) and delete, and reading request bodies (JSON or
//! YAML; protobuf and CBOR are refused with 415).

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::Value;

use crate::resources::Resource;
use crate::state::Inner;
use crate::wire::{error, json_response, Body};
use crate::SimError;

/// `GET` an object.
pub(super) fn get(inner: &Inner, res: &Resource, ns: Option<&str>, name: &str) -> Response<Body> {
    let store = inner.store.lock().expect("store lock poisoned");
    match store.get(&res.key(), ns, name) {
        Some(o) => json_response(200, &o),
        None => error(&SimError::not_found(&res.key(), name)),
    }
}

/// `POST` to a collection: creates an object (201); a created CRD's type is served at once.
pub(super) async fn create(
    inner: &Inner,
    res: &Resource,
    ns: Option<&str>,
    req: Request<Incoming>,
) -> Response<Body> {
    let body = match read_json(req).await {
        Ok(b) => b,
        Err(e) => return error(&e),
    };
    let mut store = inner.store.lock().expect("store lock poisoned");
    let created = store.create(&res.key(), ns, body);
    if let (Ok(obj), "customresourcedefinitions") = (&created, res.plural.as_str()) {
        if let Some(r) = crd_resource(obj) {
            store.register(r);
        }
    }
    created
        .map(|o| json_response(201, &o))
        .unwrap_or_else(|e| error(&e))
}

/// `PUT` an object: replaces it, with the optimistic concurrency check of its resourceVersion.
pub(super) async fn update(
    inner: &Inner,
    res: &Resource,
    ns: Option<&str>,
    name: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    let body = match read_json(req).await {
        Ok(b) => b,
        Err(e) => return error(&e),
    };
    if body["metadata"]["name"].as_str() != Some(name) {
        return error(&SimError::bad_request(
            "the name of the object does not match the name on the URL",
        ));
    }
    let mut store = inner.store.lock().expect("store lock poisoned");
    store
        .update(&res.key(), ns, body)
        .map(|o| json_response(200, &o))
        .unwrap_or_else(|e| error(&e))
}

/// `PATCH` an object: merge and strategic merge patches, and server-side apply.
pub(super) async fn patch(
    inner: &Inner,
    res: &Resource,
    ns: Option<&str>,
    name: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    apply_patch(inner, res, ns, name, req)
        .await
        .unwrap_or_else(|e| error(&e))
}

/// `DELETE` an object.
pub(super) fn delete(
    inner: &Inner,
    res: &Resource,
    ns: Option<&str>,
    name: &str,
) -> Response<Body> {
    let mut store = inner.store.lock().expect("store lock poisoned");
    store
        .delete(&res.key(), ns, name)
        .map(|o| json_response(200, &o))
        .unwrap_or_else(|e| error(&e))
}

async fn read_body(req: Request<Incoming>) -> Result<(Option<String>, Bytes), SimError> {
    let ctype = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    // JSON only: clients that sent protobuf or CBOR retry with JSON after a 415.
    if let Some(c) = ctype
        .as_deref()
        .filter(|c| c.contains("protobuf") || c.contains("cbor"))
    {
        let message = format!("the body of the request was in an unknown format: {c}");
        return Err(SimError::new(415, "UnsupportedMediaType", message));
    }
    let body = req
        .into_body()
        .collect()
        .await
        .map_err(|e| SimError::bad_request(e.to_string()))?
        .to_bytes();
    Ok((ctype, body))
}

fn parse_doc(body: &[u8]) -> Result<Value, SimError> {
    serde_json::from_slice(body).or_else(|_| {
        let text = std::str::from_utf8(body).map_err(|e| SimError::bad_request(e.to_string()))?;
        serde_saphyr::from_str(text)
            .map_err(|e| SimError::bad_request(format!("body is neither JSON nor YAML: {e}")))
    })
}

async fn read_json(req: Request<Incoming>) -> Result<Value, SimError> {
    let (_, body) = read_body(req).await?;
    parse_doc(&body)
}

async fn apply_patch(
    inner: &Inner,
    res: &Resource,
    ns: Option<&str>,
    name: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>, SimError> {
    let (ctype, body) = read_body(req).await?;
    let patch = parse_doc(&body)?;
    let mut store = inner.store.lock().expect("store lock poisoned");
    let ctype = ctype.unwrap_or_default();
    let obj = if ctype.starts_with("application/apply-patch") {
        match store.get(&res.key(), ns, name) {
            None => store.create(&res.key(), ns, patch)?,
            Some(_) => store.merge_patch(&res.key(), ns, name, &patch)?,
        }
    } else if ctype.starts_with("application/merge-patch+json")
        || ctype.starts_with("application/strategic-merge-patch+json")
    {
        store.merge_patch(&res.key(), ns, name, &patch)?
    } else {
        return Err(SimError::new(
            415,
            "UnsupportedMediaType",
            format!("patch type {ctype:?} is not supported"),
        ));
    };
    Ok(json_response(200, &obj))
}

/// The resource type a CRD defines, at its first served version.
fn crd_resource(crd: &Value) -> Option<Resource> {
    let spec = &crd["spec"];
    let version = spec["versions"]
        .as_array()?
        .iter()
        .find(|v| v["served"] != false)?["name"]
        .as_str()?;
    Some(Resource::new(
        spec["group"].as_str()?,
        version,
        spec["names"]["plural"].as_str()?,
        spec["names"]["kind"].as_str()?,
        spec["scope"].as_str() != Some("Cluster"),
        &[],
    ))
}
