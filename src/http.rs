//! `/metrics`, `/healthz` and `/readyz`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::Streams;
use crate::metrics::Metrics;

/// Ready means every stream has synced and has its watch open, not merely that the process runs.
/// A standby replica is ready too: it is doing its job, and a rolling update has to be able to
/// start one before the leader stops.
pub fn ready(streams: &Mutex<Streams>) -> (bool, Vec<String>) {
    let s = streams.lock().expect("streams lock poisoned");
    if s.standby {
        return (true, Vec::new());
    }
    let down: Vec<String> = s
        .live
        .values()
        .filter(|st| !st.up.load(Ordering::Acquire))
        .map(|st| st.id.clone())
        .collect();
    (down.is_empty() && !s.live.is_empty(), down)
}

fn respond(
    req: &Request<Incoming>,
    metrics: &Metrics,
    streams: &Mutex<Streams>,
) -> Response<Full<Bytes>> {
    let (status, body, ctype) = match req.uri().path() {
        "/metrics" => (
            StatusCode::OK,
            metrics.render(),
            "text/plain; version=0.0.4",
        ),
        "/healthz" => (StatusCode::OK, b"ok\n".to_vec(), "text/plain"),
        "/readyz" => match ready(streams) {
            (true, _) => (StatusCode::OK, b"ready\n".to_vec(), "text/plain"),
            (false, down) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready; streams not watching: {}\n", down.join(", ")).into_bytes(),
                "text/plain",
            ),
        },
        _ => (StatusCode::NOT_FOUND, b"not found\n".to_vec(), "text/plain"),
    };
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, ctype)
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts are valid")
}

/// Binds now (so a bad address fails at start) and serves until `cancel`.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    streams: Arc<Mutex<Streams>>,
    cancel: CancellationToken,
) {
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
        let metrics = metrics.clone();
        let streams = streams.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let r = respond(&req, &metrics, &streams);
                async move { Ok::<_, Infallible>(r) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(conn), svc)
                .await;
        });
    }
}
