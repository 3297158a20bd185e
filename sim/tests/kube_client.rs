//! The kube crate against the simulator: discovery, the runtime watcher (including its 410
//! relist), and `Api::watch` from an exact resourceVersion.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
mod common;

use common::setup;
use watchrelay_sim::{objects, Fault};

fn name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

#[tokio::test]
async fn discovery_finds_builtin_gateway_and_late_crd_types() {
    let (sim, client) = setup().await;
    let d = kube::discovery::Discovery::new(client.clone())
        .run()
        .await
        .unwrap();
    let has = |group: &str, kind: &str| {
        d.groups().any(|g| {
            g.name() == group
                && g.recommended_resources()
                    .iter()
                    .any(|(r, _)| r.kind == kind)
        })
    };
    assert!(
        has("", "Pod")
            && has("apps", "Deployment")
            && has("gateway.networking.k8s.io", "HTTPRoute")
            && has("events.k8s.io", "Event")
    );
    assert!(!has("example.com", "Widget"));
    sim.register_crd("example.com", "v1", "widgets", "Widget", true);
    let d = kube::discovery::Discovery::new(client.clone())
        .run()
        .await
        .unwrap();
    assert!(d.groups().any(|g| g.name() == "example.com"
        && g.recommended_resources().iter().any(
            |(r, caps)| r.kind == "Widget" && caps.scope == kube::discovery::Scope::Namespaced
        )));
    assert_eq!(client.apiserver_version().await.unwrap().major, "1");
}

#[tokio::test]
async fn api_watch_from_an_exact_version_returns_exactly_the_later_changes() {
    let (sim, client) = setup().await;
    for i in 0..3 {
        sim.create("pods", Some("shop"), objects::pod("shop", &format!("p{i}")))
            .unwrap();
    }
    let api: Api<Pod> = Api::namespaced(client, "shop");
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    sim.merge_patch(
        "pods",
        Some("shop"),
        "p1",
        serde_json::json!({"metadata": {"labels": {"x": "y"}}}),
    )
    .unwrap();
    sim.delete("pods", Some("shop"), "p2").unwrap();
    sim.create("pods", Some("shop"), objects::pod("shop", "p3"))
        .unwrap();
    let events: Vec<_> = api
        .watch(&WatchParams::default().timeout(2), &rv)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let seen: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            WatchEvent::Added(p) => Some(format!("ADDED {}", name(p))),
            WatchEvent::Modified(p) => Some(format!("MODIFIED {}", name(p))),
            WatchEvent::Deleted(p) => Some(format!("DELETED {}", name(p))),
            _ => None,
        })
        .collect();
    assert_eq!(seen, ["MODIFIED p1", "DELETED p2", "ADDED p3"]);

    sim.compact();
    let mut stream = api
        .watch(&WatchParams::default().timeout(2), &rv)
        .await
        .unwrap()
        .boxed();
    match stream.next().await {
        Some(Ok(WatchEvent::Error(status))) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
}

async fn next(
    events: &mut (impl futures::Stream<Item = Result<Event<Pod>, watcher::Error>> + Unpin),
) -> Event<Pod> {
    loop {
        // Errors are reported as items; the watcher backs off and carries on.
        if let Ok(ev) = tokio::time::timeout(Duration::from_secs(20), events.next())
            .await
            .expect("watcher event in time")
            .unwrap()
        {
            return ev;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_watcher_syncs_follows_and_relists_after_410() {
    let (sim, client) = setup().await;
    for i in 0..5 {
        sim.create("pods", Some("shop"), objects::pod("shop", &format!("p{i}")))
            .unwrap();
    }
    let api: Api<Pod> = Api::namespaced(client, "shop");
    let mut events = watcher::watcher(api, watcher::Config::default().page_size(2))
        .default_backoff()
        .boxed();
    assert!(matches!(next(&mut events).await, Event::Init));
    let mut listed = Vec::new();
    loop {
        match next(&mut events).await {
            Event::InitApply(p) => listed.push(name(&p)),
            Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(listed, ["p0", "p1", "p2", "p3", "p4"]);
    sim.delete("pods", Some("shop"), "p0").unwrap();
    match next(&mut events).await {
        Event::Delete(p) => assert_eq!(name(&p), "p0"),
        other => panic!("unexpected {other:?}"),
    }
    // Drop the watcher's connection and fail its reconnect, so it backs off; meanwhile changes
    // happen and the history is compacted past its position: it must relist. The watcher only
    // reconnects when polled, so all of this happens before its next request.
    sim.fail_next(1, Fault::ServerError);
    sim.drop_watches();
    // The changes come once the dropped watch has ended on the server's side.
    for _ in 0..600 {
        if sim.requests().watches_open == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        sim.requests().watches_open,
        0,
        "the dropped watch never ended"
    );
    sim.delete("pods", Some("shop"), "p1").unwrap();
    sim.create("pods", Some("shop"), objects::pod("shop", "p9"))
        .unwrap();
    sim.compact();
    let mut relisted = Vec::new();
    loop {
        match next(&mut events).await {
            Event::Init => relisted.clear(),
            Event::InitApply(p) => relisted.push(name(&p)),
            Event::InitDone => break,
            Event::Delete(p) if name(&p) == "p1" => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(relisted, ["p2", "p3", "p4", "p9"]);
}
