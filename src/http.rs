//! `/metrics`, `/healthz`, `/readyz` and `/asyncapi.json`.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::registry::{Readiness, Registry};

/// What the endpoint serves.
#[derive(Clone)]
pub struct Served {
    pub metrics: Arc<Metrics>,
    pub registry: Registry,
    /// The AsyncAPI document of what this relay publishes.
    pub asyncapi: Bytes,
}

fn respond(req: &Request<Incoming>, served: &Served) -> Response<Full<Bytes>> {
    let (status, body, ctype) = match req.uri().path() {
        "/metrics" => (
            StatusCode::OK,
            served.metrics.render(),
            "text/plain; version=0.0.4",
        ),
        "/healthz" => match served.registry.health() {
            Ok(()) => (StatusCode::OK, b"ok\n".to_vec(), "text/plain"),
            Err(reason) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("unhealthy: {reason}\n").into_bytes(),
                "text/plain",
            ),
        },
        "/readyz" => match served.registry.readiness() {
            Readiness { ready: true, .. } => (StatusCode::OK, b"ready\n".to_vec(), "text/plain"),
            Readiness {
                blocked: Some(reason),
                ..
            } => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {reason}\n").into_bytes(),
                "text/plain",
            ),
            Readiness { down, problems, .. } => {
                let mut body = format!("not ready; streams not watching: {}\n", down.join(", "));
                for (stream, problem) in problems {
                    body.push_str(&format!("{stream}: {problem}\n"));
                }
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    body.into_bytes(),
                    "text/plain",
                )
            }
        },
        "/asyncapi.json" => (StatusCode::OK, served.asyncapi.to_vec(), "application/json"),
        _ => (StatusCode::NOT_FOUND, b"not found\n".to_vec(), "text/plain"),
    };
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, ctype)
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts are valid")
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` (bound by the caller, so a bad
/// address fails at start) until `cancel`.
pub async fn serve(listener: TcpListener, served: Served, cancel: CancellationToken) {
    loop {
        let (conn, _) = tokio::select! {
            _ = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a metrics connection failed");
                    continue;
                }
            },
        };
        let served = served.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let r = respond(&req, &served);
                async move { Ok::<_, Infallible>(r) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(conn), svc)
                .await;
        });
    }
}
