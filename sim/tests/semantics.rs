//! API semantics at the HTTP level: resourceVersion rules, pagination, concurrency, bookmarks,
//! initial events, timeouts and selectors.

use serde_json::{json, Value};
mod common;

use common::setup;
use watchrelay_sim::{objects, Sim};

async fn get(client: &kube::Client, path: &str) -> Result<Value, kube::Error> {
    let text = client
        .request_text(http::Request::get(path).body(Vec::new()).unwrap())
        .await?;
    Ok(serde_json::from_str(&text).unwrap())
}

/// A whole watch response: `timeoutSeconds` ends it.
async fn watch(client: &kube::Client, query: &str) -> Vec<Value> {
    let text = client
        .request_text(
            http::Request::get(format!(
                "/api/v1/namespaces/shop/pods?watch=true&timeoutSeconds=1&{query}"
            ))
            .body(Vec::new())
            .unwrap(),
        )
        .await
        .unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn summary(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["type"].as_str().unwrap(),
                e["object"]["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[tokio::test]
async fn watch_start_positions() {
    let (sim, client) = setup().await;
    sim.create("pods", Some("shop"), objects::pod("shop", "a"))
        .unwrap();
    let rv = sim.current_rv();
    sim.create("pods", Some("shop"), objects::pod("shop", "b"))
        .unwrap();
    // Unset and "0": the current state as ADDED events.
    assert_eq!(summary(&watch(&client, "").await), ["ADDED a", "ADDED b"]);
    assert_eq!(
        summary(&watch(&client, "resourceVersion=0").await),
        ["ADDED a", "ADDED b"]
    );
    // Exact: only what came after.
    assert_eq!(
        summary(&watch(&client, &format!("resourceVersion={rv}")).await),
        ["ADDED b"]
    );
    // Too old: HTTP 200 with one ERROR event carrying a 410 Status.
    sim.compact();
    let ev = watch(&client, &format!("resourceVersion={rv}")).await;
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0]["type"], "ERROR");
    assert_eq!(ev[0]["object"]["kind"], "Status");
    assert_eq!(ev[0]["object"]["code"], 410);
    assert_eq!(ev[0]["object"]["reason"], "Expired");
}

#[tokio::test]
async fn bookmarks_and_initial_events_end() {
    let (sim, client) = setup().await;
    sim.create("pods", Some("shop"), objects::pod("shop", "a"))
        .unwrap();
    let rv = sim.current_rv();
    let ev = watch(
        &client,
        &format!("resourceVersion={rv}&allowWatchBookmarks=true"),
    )
    .await;
    let bookmarks: Vec<&Value> = ev.iter().filter(|e| e["type"] == "BOOKMARK").collect();
    assert!(
        !bookmarks.is_empty(),
        "a bookmark within a second at a 300 ms interval"
    );
    let b = &bookmarks[0]["object"];
    assert_eq!(b["kind"], "Pod");
    assert_eq!(b["apiVersion"], "v1");
    assert_eq!(
        b["metadata"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["resourceVersion"]
    );

    let ev = watch(
        &client,
        "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
    )
    .await;
    assert_eq!(ev[0]["type"], "ADDED");
    assert_eq!(ev[1]["type"], "BOOKMARK");
    assert_eq!(
        ev[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(
        ev[1]["object"]["metadata"]["resourceVersion"],
        rv.to_string()
    );
    // Without bookmarks the initial state still arrives, with no end marker (kube-apiserver
    // 1.37 answers so); without resourceVersionMatch=NotOlderThan it is refused.
    let ev = watch(
        &client,
        "sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
    )
    .await;
    assert_eq!(summary(&ev), ["ADDED a"]);
    let err = client
        .request_text(
            http::Request::get("/api/v1/namespaces/shop/pods?watch=true&sendInitialEvents=true")
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 422));
}

/// Pod `a` labelled `tier: gold`, then silver, with pod `other` created after, `changes` more
/// changes of `other`, then `a` gold again: a watch from before the first change through the
/// selector `tier=gold` sees `a` leave and enter. Returns that position and the silver one.
async fn leaves_and_enters(sim: &Sim, client: &kube::Client, changes: usize) -> (u64, u64) {
    let mut p = objects::pod("shop", "a");
    p["metadata"]["labels"] = json!({"tier": "gold"});
    sim.create("pods", Some("shop"), p).unwrap();
    let rv = sim.current_rv();
    let tier = |t: &str| json!({"metadata": {"labels": {"tier": t}}});
    sim.merge_patch("pods", Some("shop"), "a", tier("silver"))
        .unwrap();
    let silver = sim.current_rv();
    sim.create("pods", Some("shop"), objects::pod("shop", "other"))
        .unwrap();
    for i in 0..changes {
        let patch = json!({"metadata": {"annotations": {"turn": i.to_string()}}});
        sim.merge_patch("pods", Some("shop"), "other", patch)
            .unwrap();
    }
    sim.merge_patch("pods", Some("shop"), "a", tier("gold"))
        .unwrap();
    let ev = watch(
        client,
        &format!("resourceVersion={rv}&labelSelector=tier%3Dgold"),
    )
    .await;
    assert_eq!(summary(&ev), ["DELETED a", "ADDED a"]);
    (rv, silver)
}

#[tokio::test]
async fn label_selector_watch_reports_objects_leaving_and_entering() {
    let (sim, client) = setup().await;
    let (rv, _) = leaves_and_enters(&sim, &client, 0).await;
    let ev = watch(
        &client,
        &format!("resourceVersion={rv}&fieldSelector=metadata.name%3Dother"),
    )
    .await;
    assert_eq!(summary(&ev), ["ADDED other"]);
}

/// The store keeps old changes as text and parses them again when asked: a change more than
/// the 1,024 newest back still replays through a selector and lists as it was.
#[tokio::test]
async fn an_old_change_replays_and_lists_as_a_recent_one() {
    let (sim, client) = setup().await;
    let (_, silver) = leaves_and_enters(&sim, &client, 1_500).await;
    let then = get(
        &client,
        &format!(
            "/api/v1/namespaces/shop/pods?resourceVersion={silver}&resourceVersionMatch=Exact"
        ),
    )
    .await
    .unwrap();
    let items = then["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["metadata"]["labels"]["tier"], "silver");
}

#[tokio::test]
async fn pagination_is_a_consistent_snapshot() {
    let (sim, client) = setup().await;
    for i in 0..5 {
        sim.create("pods", Some("shop"), objects::pod("shop", &format!("p{i}")))
            .unwrap();
    }
    let first = get(&client, "/api/v1/namespaces/shop/pods?limit=2")
        .await
        .unwrap();
    let snapshot = first["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut names: Vec<String> = first["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    // Writes between pages do not show in later pages.
    sim.delete("pods", Some("shop"), "p3").unwrap();
    sim.create("pods", Some("shop"), objects::pod("shop", "p9"))
        .unwrap();
    sim.merge_patch(
        "pods",
        Some("shop"),
        "p4",
        json!({"metadata": {"labels": {"changed": "after"}}}),
    )
    .unwrap();
    let mut token = first["metadata"]["continue"].as_str().map(str::to_string);
    while let Some(t) = token {
        let page = get(
            &client,
            &format!("/api/v1/namespaces/shop/pods?limit=2&continue={t}"),
        )
        .await
        .unwrap();
        assert_eq!(page["metadata"]["resourceVersion"], snapshot.as_str());
        for o in page["items"].as_array().unwrap() {
            assert!(
                o["metadata"]["labels"].get("changed").is_none(),
                "a page shows its snapshot's version, not a later one"
            );
        }
        names.extend(
            page["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o["metadata"]["name"].as_str().unwrap().to_string()),
        );
        token = page["metadata"]["continue"].as_str().map(str::to_string);
    }
    assert_eq!(names, ["p0", "p1", "p2", "p3", "p4"]);
    // A continue token whose snapshot was compacted is 410.
    let first = get(&client, "/api/v1/namespaces/shop/pods?limit=2")
        .await
        .unwrap();
    sim.create("pods", Some("shop"), objects::pod("shop", "late"))
        .unwrap();
    sim.compact();
    let t = first["metadata"]["continue"].as_str().unwrap();
    let err = get(
        &client,
        &format!("/api/v1/namespaces/shop/pods?limit=2&continue={t}"),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 410 && s.reason == "Expired"));
    // resourceVersionMatch=Exact lists an older state.
    let old = get(
        &client,
        &format!(
            "/api/v1/namespaces/shop/pods?resourceVersion={}&resourceVersionMatch=Exact",
            sim.current_rv()
        ),
    )
    .await
    .unwrap();
    assert_eq!(old["items"].as_array().unwrap().len(), 6);
}

#[tokio::test]
async fn stale_updates_conflict_and_deletes_bump_the_version() {
    let (sim, _client) = setup().await;
    let created = sim
        .create("pods", Some("shop"), objects::pod("shop", "a"))
        .unwrap();
    let mut stale = created.clone();
    sim.merge_patch(
        "pods",
        Some("shop"),
        "a",
        json!({"metadata": {"labels": {"x": "1"}}}),
    )
    .unwrap();
    stale["metadata"]["labels"]["y"] = "2".into();
    let err = sim.update("pods", Some("shop"), stale).unwrap_err();
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    let err = sim
        .create("pods", Some("shop"), objects::pod("shop", "a"))
        .unwrap_err();
    assert_eq!((err.code, err.reason.as_str()), (409, "AlreadyExists"));
    let before = sim.current_rv();
    let deleted = sim.delete("pods", Some("shop"), "a").unwrap();
    assert_eq!(
        deleted["metadata"]["resourceVersion"],
        (before + 1).to_string()
    );
    let j = sim.journal();
    assert_eq!(j.last().unwrap().event_type, "DELETED");
    assert_eq!(j.last().unwrap().rv, before + 1);
    let mut g = objects::pod("shop", "");
    g["metadata"]["generateName"] = "web-".into();
    let made = sim.create("pods", Some("shop"), g).unwrap();
    assert!(made["metadata"]["name"]
        .as_str()
        .unwrap()
        .starts_with("web-"));
}
