//! HTTP: the accept loop, authentication and the router, which checks a request in order
//! (token, route, resource, denial, injected failure) and hands it to one function per route.
//! Discovery and OpenAPI are in `discovery`, collection lists and watches in `collection`,
//! single-object requests in `object`; watch streams themselves are in `crate::watch`, what
//! goes over the wire in `crate::wire`, the certificate in `crate::tls`.

use std::convert::Infallible;
use std::sync::Arc;

use http::{Method, Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::resources::Resource;
use crate::state::{Fault, Inner};
use crate::wire::{error, Body, Query};
use crate::SimError;

mod collection;
mod discovery;
mod object;

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

/// Routes a request: checks it in order, then calls the function that serves its route.
async fn handle(inner: &Arc<Inner>, req: Request<Incoming>) -> Response<Body> {
    if !authorized(inner, &req) {
        return error(&SimError::new(401, "Unauthorized", "Unauthorized"));
    }
    let path = req.uri().path().trim_end_matches('/').to_string();
    let query = Query(
        form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
            .into_owned()
            .collect(),
    );
    let segs: Vec<&str> = path.split('/').skip(1).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return discovery::version(),
        ["openapi", "v3"] => return discovery::openapi_index(inner),
        ["openapi", "v3", gv @ ..] => {
            return discovery::openapi_group_version(inner, &gv.join("/"))
        }
        ["api"] => return discovery::api_versions(&req),
        ["apis"] => return discovery::api_groups(inner),
        ["apis", g] => return discovery::api_group(inner, g),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return not_served(&path),
    };
    if rest.is_empty() {
        return discovery::api_resources(inner, group, version);
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
    let Some(res) = served_resource(inner, group, version, plural) else {
        return not_served(&path);
    };
    if let Some(e) = denied(inner, &res, req.method()) {
        return error(&e);
    }
    if let Some(resp) = injected_failure(inner) {
        return resp;
    }
    let ns = if res.namespaced { ns } else { None };
    let watch = matches!(query.get("watch"), Some("true" | "1"));
    let verb = match (req.method().clone(), name) {
        (Method::GET, None) if watch => "watch",
        (Method::GET, None) => "list",
        (Method::GET, Some(_)) => "get",
        (Method::POST, _) => "create",
        (Method::PUT, _) => "update",
        (Method::PATCH, _) => "patch",
        (Method::DELETE, _) => "delete",
        _ => "other",
    };
    inner.requests.verb(plural, verb);
    match (req.method().clone(), name) {
        (Method::GET, None) if matches!(query.get("watch"), Some("true" | "1")) => {
            collection::watch(inner, &res, ns, &query)
        }
        (Method::GET, None) => collection::list(inner, &res, ns, &query).await,
        (Method::GET, Some(name)) => object::get(inner, &res, ns, name),
        (Method::POST, None) => object::create(inner, &res, ns, req).await,
        (Method::PUT, Some(name)) => object::update(inner, &res, ns, name, req).await,
        (Method::PATCH, Some(name)) => object::patch(inner, &res, ns, name, req).await,
        (Method::DELETE, Some(name)) => object::delete(inner, &res, ns, name),
        (m, _) => error(&SimError::new(
            405,
            "MethodNotAllowed",
            format!("{m} is not supported here"),
        )),
    }
}

/// Whether the request carries the configured bearer token (always, when none is configured).
fn authorized(inner: &Inner, req: &Request<Incoming>) -> bool {
    let Some(token) = &inner.cfg.token else {
        return true;
    };
    req.headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.strip_prefix("Bearer ") == Some(token.as_str()))
}

/// 404 for a path the server has no route or resource type for.
fn not_served(path: &str) -> Response<Body> {
    error(&SimError::new(
        404,
        "NotFound",
        format!("the server could not find the requested resource ({path})"),
    ))
}

/// The resource type served at `group`/`version`/`plural`, if any.
fn served_resource(inner: &Inner, group: &str, version: &str, plural: &str) -> Option<Resource> {
    let store = inner.store.lock().expect("store lock poisoned");
    store
        .resources
        .values()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
        .cloned()
}

/// 403 Forbidden when tests denied `res` ([`Sim::deny`](crate::Sim::deny)).
fn denied(inner: &Inner, res: &Resource, method: &Method) -> Option<SimError> {
    if !inner
        .faults
        .denied
        .lock()
        .expect("faults lock poisoned")
        .contains(&res.key())
    {
        return None;
    }
    let user = "system:serviceaccount:watchrelay:watchrelay";
    Some(SimError::new(
        403,
        "Forbidden",
        format!(
            "{} is forbidden: User \"{user}\" cannot {} resource \"{}\"",
            res.key(),
            method.as_str().to_lowercase(),
            res.plural
        ),
    ))
}

/// Consumes one failure armed by [`Sim::fail_next`](crate::Sim::fail_next), if any.
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
