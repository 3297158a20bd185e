//! `/metrics`, `/healthz`, `/readyz` and `/asyncapi.json`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::registry::{Readiness, Registry};

/// What the endpoint serves.
#[derive(Clone)]
pub struct Served {
    /// Rendered at `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Asked by `/healthz` and `/readyz`.
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

/// What one client may hold of the endpoint: it shares the process's file descriptors with the
/// watches and the Kafka connections, so anyone on the pod network must not be able to take
/// them all.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Connections open at once; the next waits in the listen backlog.
    pub connections: usize,
    /// How long a request's headers may take to arrive.
    pub header_timeout: Duration,
    /// How long one connection may stay open, keep-alive included.
    pub lifetime: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            connections: 64,
            header_timeout: Duration::from_secs(10),
            lifetime: Duration::from_secs(60),
        }
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` (bound by the caller, so a bad
/// address fails at start) until `cancel`, within [`Bounds::default`].
pub async fn serve(listener: TcpListener, served: Served, cancel: CancellationToken) {
    serve_within(listener, served, cancel, Bounds::default()).await
}

/// [`serve`] within `bounds`. A failed accept (out of file descriptors, say) is retried after a
/// pause that doubles to a second, and logged once per pause, not in a tight loop.
pub async fn serve_within(
    listener: TcpListener,
    served: Served,
    cancel: CancellationToken,
    bounds: Bounds,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(bounds.connections));
    let mut pause = Duration::from_millis(50);
    loop {
        let slot = tokio::select! {
            _ = cancel.cancelled() => return,
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
        };
        let (conn, _) = tokio::select! {
            _ = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?pause, "accepting a metrics connection failed");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(Duration::from_secs(1));
                    continue;
                }
            },
        };
        pause = Duration::from_millis(50);
        let served = served.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let r = respond(&req, &served);
                async move { Ok::<_, Infallible>(r) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(bounds.header_timeout)
                .serve_connection(TokioIo::new(conn), svc);
            let _ = tokio::time::timeout(bounds.lifetime, connection).await;
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// Idle connections can neither hold the endpoint nor pile up: past the bound a client
    /// waits, an idle one is closed once its headers are late, and then a probe is answered.
    #[tokio::test]
    async fn idle_connections_are_bounded_and_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = Served {
            metrics: Arc::new(Metrics::new()),
            registry: Registry::new(),
            asyncapi: Bytes::from_static(b"{}"),
        };
        let cancel = CancellationToken::new();
        let bounds = Bounds {
            connections: 2,
            header_timeout: Duration::from_millis(200),
            lifetime: Duration::from_secs(30),
        };
        tokio::spawn(serve_within(listener, served, cancel.clone(), bounds));
        let mut idle = Vec::new();
        for _ in 0..2 {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        let mut probe = TcpStream::connect(addr).await.unwrap();
        probe
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        // Hang guards, not timings: without the bounds the probe never gets a slot.
        let guard = Duration::from_secs(10);
        let mut answer = String::new();
        tokio::time::timeout(guard, probe.read_to_string(&mut answer))
            .await
            .expect("the probe is answered once idle connections are closed")
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        for mut c in idle {
            let mut buf = Vec::new();
            tokio::time::timeout(guard, c.read_to_end(&mut buf))
                .await
                .expect("an idle connection is closed")
                .unwrap();
            let text = String::from_utf8_lossy(&buf);
            assert!(
                text.is_empty() || text.starts_with("HTTP/1.1 408"),
                "an idle connection is closed: {text}"
            );
        }
        cancel.cancel();
    }
}
