//! HTTP: routing, discovery, CRUD and list; watches are in `watch`.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::resources::Resource;
use crate::selector::Selector;
use crate::watch::{self, Params, Start};
use crate::{Body, Fault, Inner, SimError};

/// A self-signed server certificate for 127.0.0.1 and localhost.
pub struct Tls {
    pub cert_pem: String,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl Tls {
    pub fn self_signed() -> Result<Self, String> {
        let ck = rcgen::generate_simple_self_signed(vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
        ])
        .map_err(|e| e.to_string())?;
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(vec![ck.cert.der().clone()], key)
        .map_err(|e| e.to_string())?;
        Ok(Self {
            cert_pem: ck.cert.pem(),
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }
}

pub async fn serve(listener: TcpListener, inner: Arc<Inner>) {
    loop {
        let conn = tokio::select! {
            _ = inner.shutdown.cancelled() => return,
            c = listener.accept() => match c {
                Ok((c, _)) => c,
                Err(_) => continue,
            },
        };
        let _ = conn.set_nodelay(true);
        let inner = inner.clone();
        tokio::spawn(async move {
            let svc_inner = inner.clone();
            let svc = service_fn(move |req| {
                let inner = svc_inner.clone();
                async move { Ok::<_, Infallible>(handle(&inner, req).await) }
            });
            let builder = hyper::server::conn::http1::Builder::new();
            match &inner.tls {
                Some(tls) => {
                    if let Ok(stream) = tls.acceptor.accept(conn).await {
                        let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                    }
                }
                None => {
                    let _ = builder.serve_connection(TokioIo::new(conn), svc).await;
                }
            }
        });
    }
}

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(full(serde_json::to_vec(v).expect("json values serialize")))
        .expect("static parts are valid")
}

fn error(e: &SimError) -> Response<Body> {
    json_response(e.code, &e.status())
}

async fn handle(inner: &Arc<Inner>, req: Request<Incoming>) -> Response<Body> {
    if let Some(token) = &inner.cfg.token {
        let ok = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.strip_prefix("Bearer ") == Some(token.as_str()));
        if !ok {
            return error(&SimError::new(401, "Unauthorized", "Unauthorized"));
        }
    }
    let path = req.uri().path().trim_end_matches('/').to_string();
    let query = Query(
        form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
            .into_owned()
            .collect(),
    );
    let segs: Vec<&str> = path.split('/').skip(1).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return json_response(200, &version_info()),
        ["openapi", "v3"] => {
            let store = inner.store.lock().expect("store lock poisoned");
            return json_response(200, &crate::openapi::index(store.resources.values()));
        }
        ["openapi", "v3", gv @ ..] => {
            let gv = gv.join("/");
            let store = inner.store.lock().expect("store lock poisoned");
            return match crate::openapi::group_version(store.resources.values(), &gv) {
                Some(doc) => json_response(200, &doc),
                None => error(&SimError::not_found("openapi", &gv)),
            };
        }
        ["api"] => {
            return json_response(
                200,
                &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": req.headers().get("host").and_then(|h| h.to_str().ok()).unwrap_or("")}]}),
            )
        }
        ["apis"] => return json_response(200, &group_list(inner)),
        ["apis", g] => {
            return match group_list(inner)["groups"]
                .as_array()
                .and_then(|gs| gs.iter().find(|x| x["name"] == *g))
            {
                Some(grp) => json_response(
                    200,
                    &json!({"kind": "APIGroup", "apiVersion": "v1", "name": g, "versions": grp["versions"], "preferredVersion": grp["preferredVersion"]}),
                ),
                None => error(&SimError::not_found("group", g)),
            }
        }
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => {
            return error(&SimError::new(
                404,
                "NotFound",
                format!("the server could not find the requested resource ({path})"),
            ))
        }
    };
    if rest.is_empty() {
        return match resource_list(inner, group, version) {
            Some(v) => json_response(200, &v),
            None => error(&SimError::not_found(
                "groupVersion",
                &format!("{group}/{version}"),
            )),
        };
    }
    let (ns, plural, name) = match rest {
        ["namespaces", ns, plural] => (Some(*ns), *plural, None),
        ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name)),
        [plural] => (None, *plural, None),
        [plural, name] => (None, *plural, Some(*name)),
        _ => {
            return error(&SimError::new(
                404,
                "NotFound",
                format!("subresource not served ({path})"),
            ))
        }
    };
    let res = {
        let store = inner.store.lock().expect("store lock poisoned");
        store
            .resources
            .values()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
            .cloned()
    };
    let Some(res) = res else {
        return error(&SimError::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        ));
    };
    if inner
        .faults
        .denied
        .lock()
        .expect("faults lock poisoned")
        .contains(&res.key())
    {
        let user = "system:serviceaccount:watchrelay:watchrelay";
        return error(&SimError::new(
            403,
            "Forbidden",
            format!(
                "{} is forbidden: User \"{user}\" cannot {} resource \"{}\"",
                res.key(),
                req.method().as_str().to_lowercase(),
                res.plural
            ),
        ));
    }
    if let Some(resp) = injected_failure(inner) {
        return resp;
    }
    let ns = if res.namespaced { ns } else { None };
    let param = |k: &str| query.get(k);
    match (req.method().clone(), name) {
        (Method::GET, None) if matches!(param("watch"), Some("true" | "1")) => {
            let current = inner.store.lock().expect("store lock poisoned").rv;
            match watch_params(&res, ns, &query, inner.cfg.watch_list).and_then(|p| {
                // A position the server has not reached (an etcd restore, a copied checkpoint):
                // the API server gives up waiting for it with 504.
                match p.start {
                    Start::Exact(rv) if rv > current => Err(SimError::new(
                        504,
                        "Timeout",
                        format!("Too large resource version: {rv}, current: {current}"),
                    )),
                    _ => Ok(p),
                }
            }) {
                Ok(p) => Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .header("transfer-encoding", "chunked")
                    .body(watch::start(inner.clone(), p))
                    .expect("static parts are valid"),
                Err(e) => error(&e),
            }
        }
        (Method::GET, None) => {
            let _counted = inner.requests.list(query.get("limit").is_some());
            if !inner.cfg.list_delay.is_zero() {
                tokio::time::sleep(inner.cfg.list_delay).await;
            }
            list(inner, &res, ns, &query).unwrap_or_else(|e| error(&e))
        }
        (Method::GET, Some(name)) => {
            let store = inner.store.lock().expect("store lock poisoned");
            match store.get(&res.key(), ns, name) {
                Some(o) => json_response(200, &o),
                None => error(&SimError::not_found(&res.key(), name)),
            }
        }
        (Method::POST, None) => {
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
        (Method::PUT, Some(name)) => {
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
        (Method::PATCH, Some(name)) => patch(inner, &res, ns, name, req)
            .await
            .unwrap_or_else(|e| error(&e)),
        (Method::DELETE, Some(name)) => {
            let mut store = inner.store.lock().expect("store lock poisoned");
            store
                .delete(&res.key(), ns, name)
                .map(|o| json_response(200, &o))
                .unwrap_or_else(|e| error(&e))
        }
        (m, _) => error(&SimError::new(
            405,
            "MethodNotAllowed",
            format!("{m} is not supported here"),
        )),
    }
}

fn injected_failure(inner: &Inner) -> Option<Response<Body>> {
    let mut f = inner.faults.fail.lock().expect("faults lock poisoned");
    let (n, fault) = f.as_mut()?;
    *n -= 1;
    let fault = *fault;
    if *n == 0 {
        *f = None;
    }
    Some(match fault {
        Fault::ServerError => error(&SimError::new(
            500,
            "InternalError",
            "Internal error occurred: injected by the simulator",
        )),
        Fault::TooManyRequests { retry_after_secs } => {
            let mut r = error(&SimError::new(
                429,
                "TooManyRequests",
                "the server is receiving too many requests and has asked us to try again later",
            ));
            r.headers_mut().insert(
                "retry-after",
                retry_after_secs
                    .to_string()
                    .parse()
                    .expect("digits are a valid header"),
            );
            r
        }
    })
}

/// The query string's parameters.
struct Query(Vec<(String, String)>);

impl Query {
    fn get(&self, k: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(qk, _)| qk == k)
            .map(|(_, v)| v.as_str())
    }
}

fn parse_rv(s: &str) -> Result<u64, SimError> {
    s.parse()
        .map_err(|_| SimError::bad_request(format!("invalid resourceVersion {s:?}")))
}

fn selectors(q: &Query) -> Result<(Selector, Selector), SimError> {
    let param = |k: &str| q.get(k);
    let labels =
        Selector::parse(param("labelSelector").unwrap_or("")).map_err(SimError::bad_request)?;
    let fields =
        Selector::parse(param("fieldSelector").unwrap_or("")).map_err(SimError::bad_request)?;
    fields.check_fields().map_err(SimError::bad_request)?;
    Ok((labels, fields))
}

fn watch_params(
    res: &Resource,
    ns: Option<&str>,
    q: &Query,
    watch_list: bool,
) -> Result<Params, SimError> {
    let (labels, fields) = selectors(q)?;
    let param = |k: &str| q.get(k);
    let bookmarks = matches!(param("allowWatchBookmarks"), Some("true" | "1"));
    let send_initial = matches!(param("sendInitialEvents"), Some("true" | "1"));
    let rv = param("resourceVersion").unwrap_or("");
    let start = if send_initial {
        if !watch_list {
            return Err(SimError::invalid(
                "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
            ));
        }
        // Without allowWatchBookmarks the initial state still arrives, with no end marker
        // (as kube-apiserver 1.37 answers).
        if param("resourceVersionMatch") != Some("NotOlderThan") {
            return Err(SimError::invalid(
                "sendInitialEvents requires resourceVersionMatch=NotOlderThan",
            ));
        }
        Start::Current
    } else if rv.is_empty() || rv == "0" {
        Start::Current
    } else {
        Start::Exact(parse_rv(rv)?)
    };
    let timeout = param("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs);
    Ok(Params {
        resource: res.key(),
        kind: res.kind.clone(),
        api_version: res.api_version(),
        namespace: ns.map(str::to_string),
        labels,
        fields,
        start,
        bookmarks,
        initial_events_end: send_initial && bookmarks,
        timeout,
    })
}

fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    format!("{rv}:{ns}:{name}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(token: &str) -> Option<(u64, String, String)> {
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect();
    let s = String::from_utf8(bytes?).ok()?;
    let mut parts = s.splitn(3, ':');
    Some((
        parts.next()?.parse().ok()?,
        parts.next()?.to_string(),
        parts.next()?.to_string(),
    ))
}

fn list(
    inner: &Inner,
    res: &Resource,
    ns: Option<&str>,
    q: &Query,
) -> Result<Response<Body>, SimError> {
    let (labels, fields) = selectors(q)?;
    let param = |k: &str| q.get(k);
    let limit = param("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let later_page = param("continue").is_some_and(|c| !c.is_empty());
    let fail = &inner.faults.fail_continued;
    if later_page
        && fail
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    {
        return Err(SimError::new(
            500,
            "InternalError",
            "Internal error occurred: a later page failed, injected by the simulator",
        ));
    }
    let store = inner.store.lock().expect("store lock poisoned");
    let (snapshot, after) = match param("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let (rv, ns, name) = decode_continue(token)
                .ok_or_else(|| SimError::bad_request("invalid continue token"))?;
            (rv, Some((ns, name)))
        }
        None => {
            let rv = param("resourceVersion").unwrap_or("");
            let exact = param("resourceVersionMatch") == Some("Exact");
            if exact && !rv.is_empty() {
                (parse_rv(rv)?, None)
            } else {
                if !rv.is_empty() {
                    parse_rv(rv)?;
                }
                (store.rv, None)
            }
        }
    };
    let (page, more) =
        store.page_at(&res.key(), ns, Some(snapshot), after.as_ref(), limit, |o| {
            labels.matches_labels(o) && fields.matches_fields(o)
        })?;
    drop(store);
    let cont = more.then(|| {
        let md = &page.last().expect("a page with more after it is not empty")["metadata"];
        let ns = md["namespace"].as_str().unwrap_or("");
        encode_continue(snapshot, ns, md["name"].as_str().unwrap_or(""))
    });
    let items: Vec<&Value> = page.iter().map(|o| &**o).collect();
    let mut md = json!({ "resourceVersion": snapshot.to_string() });
    if let Some(c) = cont {
        md["continue"] = c.into();
    }
    Ok(json_response(
        200,
        &json!({ "kind": format!("{}List", res.kind), "apiVersion": res.api_version(), "metadata": md, "items": items }),
    ))
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

async fn patch(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let t = encode_continue(42, "ns-a", "pod:1");
        assert_eq!(
            decode_continue(&t),
            Some((42, "ns-a".into(), "pod:1".into()))
        );
        assert_eq!(decode_continue("zz"), None);
    }
}
