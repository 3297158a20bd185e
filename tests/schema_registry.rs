//! The relay against a schema registry that is down, then up, or that refuses a schema (a
//! registry in this process speaking the Confluent-compatible and Apicurio APIs): nothing is
//! published before the topic's schema is registered, every record after carries its ids, and a
//! refusal stops the relay with the subject and its rule.

mod common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use common::bed::{eventually, Bed, Relay};
use common::view::events;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use serde_json::json;
use watchrelay::testing::Memory;
use watchrelay_sim::objects;

/// What the registry does with a schema.
#[derive(Default)]
struct Registry {
    /// Answers 503 to every registration while set.
    down: AtomicBool,
    /// Refuses every registration (409) while set.
    refusing: AtomicBool,
    /// Registrations answered with an id.
    taken: AtomicUsize,
}

async fn answer(
    registry: Arc<Registry>,
    req: Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let post = req.method() == hyper::Method::POST;
    let _ = req.into_body().collect().await;
    let reply = |status: StatusCode, body: serde_json::Value| {
        Response::builder()
            .status(status)
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap()
    };
    let ccompat = path.strip_prefix("/apis/ccompat/v7");
    match ccompat {
        Some(p) if post && p.ends_with("/versions") => {
            if registry.down.load(Ordering::SeqCst) {
                reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    json!({"message": "starting"}),
                )
            } else if registry.refusing.load(Ordering::SeqCst) {
                reply(
                    StatusCode::CONFLICT,
                    json!({"message": "Incompatible artifact", "error_code": 409}),
                )
            } else {
                registry.taken.fetch_add(1, Ordering::SeqCst);
                reply(StatusCode::OK, json!({"id": 7}))
            }
        }
        Some(p) if post && p.starts_with("/subjects/") => {
            reply(StatusCode::OK, json!({"id": 7, "version": 1}))
        }
        Some(p) if p.starts_with("/config/") => {
            reply(StatusCode::OK, json!({"compatibilityLevel": "FULL"}))
        }
        _ if path.starts_with("/apis/registry/v3/groups/default/artifacts/") => {
            reply(StatusCode::OK, json!({"globalId": 70, "contentId": 7}))
        }
        _ => reply(StatusCode::NOT_FOUND, json!({"message": path})),
    }
}

/// Serves `registry` on a loopback port; its base URL.
async fn serve(registry: Arc<Registry>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (conn, _) = listener.accept().await.unwrap();
            let registry = registry.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let registry = registry.clone();
                    async move { Ok::<_, Infallible>(answer(registry, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(conn), svc)
                    .await;
            });
        }
    });
    url
}

async fn relay_with(registry: &Arc<Registry>) -> (Bed, Arc<Memory>, Relay) {
    let url = serve(registry.clone()).await;
    let bed = Bed::in_memory(watchrelay_sim::SimConfig::default(), &["a"]).await;
    for i in 0..3 {
        bed.sim
            .create("pods", Some("a"), objects::pod("a", &format!("p{i}")))
            .unwrap();
    }
    let producer = Arc::new(Memory::new());
    let cfg = pods_config(&bed, &url, "namespaces: [a]");
    let relay = Relay::start_with(&bed, cfg, Some(producer.clone()));
    (bed, producer, relay)
}

/// The pods channel over `scope`, into topic `pods`, with the registry at `url`.
fn pods_config(bed: &Bed, url: &str, scope: &str) -> watchrelay::config::Config {
    bed.config_with(
        &format!("  - operationId: watchNamespacedPods\n    {scope}\n    topic: pods\n"),
        "",
        &format!("schemaRegistry:\n  url: {url}/apis/ccompat/v7\n"),
    )
}

/// The records of the pods topic, tombstones left out.
fn pods_of(producer: &Memory) -> Vec<watchrelay::producer::Record> {
    events(producer)
        .into_iter()
        .filter(|r| r.topic == "pods" && !r.tombstone)
        .collect()
}

/// Every record carries the topic's schema ids (content id 7, as the registry answers).
fn assert_tagged(records: &[watchrelay::producer::Record]) {
    for r in records {
        assert_eq!(
            r.headers.get_bytes("apicurio.value.contentId"),
            Some(&7u64.to_be_bytes()[..]),
            "a record without its schema's ids: {}",
            String::from_utf8_lossy(&r.value)
        );
    }
}

fn pending(relay: &Relay) -> bool {
    String::from_utf8(relay.metrics.render())
        .unwrap()
        .lines()
        .any(|l| l == "watchrelay_schema_registry_pending_topics 1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_published_before_the_registry_has_the_schema() {
    let registry = Arc::new(Registry::default());
    registry.down.store(true, Ordering::SeqCst);
    let (_bed, producer, relay) = relay_with(&registry).await;
    eventually(|| pending(&relay), || "the topic was never pending".into()).await;
    // The registry stays down a while: the stream waits, publishing nothing.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert!(pending(&relay));
    assert!(
        events(&producer).iter().all(|r| r.topic != "pods"),
        "a record was published before its schema was registered"
    );

    registry.down.store(false, Ordering::SeqCst);
    eventually(
        || {
            events(&producer)
                .iter()
                .filter(|r| r.topic == "pods")
                .count()
                >= 3
        },
        || "the pods were never published once the registry came up".into(),
    )
    .await;
    assert!(!pending(&relay));
    for r in events(&producer).iter().filter(|r| r.topic == "pods") {
        assert_eq!(
            r.headers.get_bytes("apicurio.value.contentId"),
            Some(&7u64.to_be_bytes()[..])
        );
        assert_eq!(
            r.headers.get_bytes("apicurio.value.globalId"),
            Some(&70u64.to_be_bytes()[..])
        );
    }
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_schema_stops_the_relay_naming_the_subject_and_its_rule() {
    let registry = Arc::new(Registry::default());
    registry.refusing.store(true, Ordering::SeqCst);
    let (_bed, producer, relay) = relay_with(&registry).await;
    eventually(
        || relay.ended(),
        || "the relay went on though its schema was refused".into(),
    )
    .await;
    let error = relay.outcome().await.unwrap_err();
    assert!(
        error.contains("subject pods-value") && error.contains("FULL"),
        "the error names the subject and its rule: {error}"
    );
    assert!(events(&producer).iter().all(|r| r.topic != "pods"));
    assert_eq!(registry.taken.load(Ordering::SeqCst), 0);
}

/// A stream that starts out of its scope (its namespace unlabelled while the relay was down)
/// deletes what it announced only once the registry has the topic's schema: its inferred
/// DELETEDs carry the ids, like every other record, even when the registry is down at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_leaving_at_start_waits_for_the_schema() {
    let registry = Arc::new(Registry::default());
    let url = serve(registry.clone()).await;
    let bed = Bed::in_memory(watchrelay_sim::SimConfig::default(), &["a"]).await;
    bed.label("a", true);
    for i in 0..3 {
        bed.sim
            .create("pods", Some("a"), objects::pod("a", &format!("p{i}")))
            .unwrap();
    }
    let producer = Arc::new(Memory::new());
    let cfg = pods_config(&bed, &url, "namespaceSelector: relay=yes");
    let pods = || pods_of(&producer);
    let relay = Relay::start_with(&bed, cfg.clone(), Some(producer.clone()));
    eventually(
        || pods().len() >= 3,
        || "the pods were never published".into(),
    )
    .await;
    relay.stop().await;
    bed.label("a", false);
    registry.down.store(true, Ordering::SeqCst);
    let relay = Relay::start_with(&bed, cfg, Some(producer.clone()));
    eventually(|| pending(&relay), || "the topic was never pending".into()).await;
    registry.down.store(false, Ordering::SeqCst);
    let deleted = || {
        pods()
            .iter()
            .filter(|r| common::view::json(r)["type"] == "DELETED")
            .count()
    };
    eventually(|| deleted() == 3, || "the pods were never deleted".into()).await;
    relay.stop().await;
    assert_tagged(&pods());
}

/// A namespace dropped from a channel's list is retired: its objects' DELETEDs go to the topic
/// the channel still publishes to, so they carry the topic's schema ids like every record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retirement_on_a_configured_topic_carries_the_schema() {
    let registry = Arc::new(Registry::default());
    let url = serve(registry.clone()).await;
    let bed = Bed::in_memory(watchrelay_sim::SimConfig::default(), &["a", "b"]).await;
    for ns in ["a", "b"] {
        bed.sim
            .create("pods", Some(ns), objects::pod(ns, "p"))
            .unwrap();
    }
    let producer = Arc::new(Memory::new());
    let cfg = |namespaces: &str| pods_config(&bed, &url, &format!("namespaces: [{namespaces}]"));
    let pods = || pods_of(&producer);
    let relay = Relay::start_with(&bed, cfg("a, b"), Some(producer.clone()));
    eventually(
        || pods().len() >= 2,
        || "the pods were never published".into(),
    )
    .await;
    relay.stop().await;
    let relay = Relay::start_with(&bed, cfg("a"), Some(producer.clone()));
    eventually(
        || {
            pods()
                .iter()
                .any(|r| r.key == "b/p" && common::view::json(r)["type"] == "DELETED")
        },
        || "b's pod was never retired".into(),
    )
    .await;
    relay.stop().await;
    assert_tagged(&pods());
}
