//! The simulator checked against the real API server, differentially: one request script runs
//! against both (the suite's kube-apiserver and etcd, and a fresh simulator), and what each
//! answered is written down as a transcript of normalised observations (status codes, reasons,
//! event types and their order, the keys of response objects). The transcripts must match line
//! for line, except the differences `sim/README.md` lists as deliberate ([`DELIBERATE`]).

mod common;

use std::path::{Path, PathBuf};

use common::cluster::{unique, Cluster};
use kube::client::Body;
use serde_json::{json, Value};
use watchrelay_sim::{Sim, SimConfig};

/// Where the simulator differs on purpose (the same list is in `sim/README.md`): the step, a
/// normalisation that removes the difference from both lines, and the reason.
type Normalise = fn(&str) -> String;
const DELIBERATE: &[(&str, Normalise, &str)] = &[
    (
        "list page",
        without_remaining_item_count,
        "no remainingItemCount: counting the rest of the collection on every page would make paging a million objects quadratic, and no client of the relay reads it",
    ),
    (
        "sendInitialEvents:",
        bookmarks_as_the_simulator_sends_them,
        "a bookmark's object is the kind's empty object on the API server (spec and status too), only apiVersion, kind and metadata in the simulator; and the simulator sends a bookmark every second (configurable), the API server about once a minute",
    ),
];

fn without_remaining_item_count(line: &str) -> String {
    let line = line.replace("remainingItemCount,", "");
    let mut out = Vec::new();
    let mut words = line.split(' ');
    while let Some(w) = words.next() {
        if w == "remaining" {
            words.next();
        } else {
            out.push(w);
        }
    }
    out.join(" ")
}

fn bookmarks_as_the_simulator_sends_them(line: &str) -> String {
    line.replace(
        "object [apiVersion,kind,metadata,spec,status]",
        "object [apiVersion,kind,metadata]",
    )
    .replace(
        " | BOOKMARK object [apiVersion,kind,metadata] metadata [resourceVersion] annotations []",
        "",
    )
}

/// One server under test: a client, and how to compact its history.
struct Server {
    client: kube::Client,
    compact: Box<dyn Fn() + Send + Sync>,
    lines: Vec<String>,
}

async fn client_of(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// Sorted keys of a JSON object.
fn keys(v: &Value) -> String {
    let mut k: Vec<&str> = v
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    k.sort_unstable();
    k.join(",")
}

fn names(list: &Value) -> String {
    let mut n: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect();
    n.sort_unstable();
    n.join(",")
}

impl Server {
    /// Sends a request; returns the status code and the body (parsed when it is one JSON
    /// document, else the watch events it holds, one per line, as an array).
    async fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let mut req = http::Request::builder().method(method).uri(path);
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let req = req
            .body(Body::from(
                body.map(|b| serde_json::to_vec(b).unwrap())
                    .unwrap_or_default(),
            ))
            .unwrap();
        let resp = self.client.send(req).await.expect("a response");
        let code = resp.status().as_u16();
        let bytes = resp.into_body().collect_bytes().await.unwrap();
        let value = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
            Value::Array(
                bytes
                    .split(|b| *b == b'\n')
                    .filter(|l| !l.is_empty())
                    .map(|l| serde_json::from_slice(l).unwrap_or(Value::Null))
                    .collect(),
            )
        });
        (code, value)
    }

    fn note(&mut self, step: &str, what: impl std::fmt::Display) {
        self.lines.push(format!("{step}: {what}"));
    }

    /// A request whose outcome is noted as its code, and for an error its reason and the keys
    /// of the Status.
    async fn outcome(
        &mut self,
        step: &str,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Value {
        let (code, v) = self.call(method, path, body).await;
        if code >= 400 {
            self.note(
                step,
                format!(
                    "{code} {} status keys [{}]",
                    v["reason"].as_str().unwrap_or("?"),
                    keys(&v)
                ),
            );
        } else {
            self.note(step, code);
        }
        v
    }

    /// A watch's events as `TYPE name`, and for bookmarks the keys of their object and metadata.
    async fn watch(&mut self, step: &str, path: &str, sort_added: bool) {
        let (code, v) = self.call("GET", path, None).await;
        let events = match v {
            Value::Array(events) => events,
            one => vec![one],
        };
        let mut added = Vec::new();
        let mut seen = Vec::new();
        for e in &events {
            let ty = e["type"].as_str().unwrap_or("?");
            let o = &e["object"];
            match ty {
                "ADDED" if sort_added => {
                    added.push(o["metadata"]["name"].as_str().unwrap_or("").to_string())
                }
                "BOOKMARK" => seen.push(format!(
                    "BOOKMARK object [{}] metadata [{}] annotations [{}]",
                    keys(o),
                    keys(&o["metadata"]),
                    keys(&o["metadata"]["annotations"])
                )),
                "ERROR" => seen.push(format!(
                    "ERROR {} {}",
                    o["code"],
                    o["reason"].as_str().unwrap_or("?")
                )),
                _ => seen.push(format!(
                    "{ty} {}",
                    o["metadata"]["name"].as_str().unwrap_or("")
                )),
            }
        }
        added.sort();
        let added = if sort_added {
            format!("ADDED [{}] then ", added.join(","))
        } else {
            String::new()
        };
        self.note(step, format!("{code} {added}{}", seen.join(" | ")));
    }
}

fn service(ns: &str, name: &str, app: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": {"clusterIP": "None", "ports": [{"port": 80}]}})
}

fn configmap(ns: &str, name: &str, data: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns}, "data": {"d": data}})
}

/// Creates namespace `ns`.
async fn create_namespace(s: &mut Server, ns: &str) {
    let ns_obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
    s.outcome(
        "create namespace",
        "POST",
        "/api/v1/namespaces",
        Some(&ns_obj),
    )
    .await;
}

/// The script: the same requests, in the same order, against either server.
async fn script(s: &mut Server, ns: &str) {
    let svc = format!("/api/v1/namespaces/{ns}/services");
    let cms = format!("/api/v1/namespaces/{ns}/configmaps");
    create_namespace(s, ns).await;
    for i in 0..5 {
        let app = if i % 2 == 0 { "even" } else { "odd" };
        s.outcome(
            "create service",
            "POST",
            &svc,
            Some(&service(ns, &format!("s{i}"), app)),
        )
        .await;
    }
    s.outcome(
        "create an existing name",
        "POST",
        &svc,
        Some(&service(ns, "s0", "even")),
    )
    .await;

    // Paginated lists and continue tokens.
    let (code, first) = s.call("GET", &format!("{svc}?limit=2"), None).await;
    s.note(
        "list page 1",
        format!(
            "{code} keys [{}] metadata [{}] items {} remaining {}",
            keys(&first),
            keys(&first["metadata"]),
            first["items"].as_array().unwrap().len(),
            first["metadata"]["remainingItemCount"]
        ),
    );
    let mut token = first["metadata"]["continue"].as_str().unwrap().to_string();
    let mut page = 2;
    while !token.is_empty() {
        let (code, next) = s
            .call("GET", &format!("{svc}?limit=2&continue={token}"), None)
            .await;
        s.note(
            &format!("list page {page}"),
            format!(
                "{code} items {} remaining {} more {}",
                next["items"].as_array().unwrap().len(),
                next["metadata"]["remainingItemCount"],
                next["metadata"]["continue"]
                    .as_str()
                    .is_some_and(|c| !c.is_empty())
            ),
        );
        token = next["metadata"]["continue"]
            .as_str()
            .unwrap_or("")
            .to_string();
        page += 1;
    }

    // Selectors.
    let (code, even) = s
        .call("GET", &format!("{svc}?labelSelector=app%3Deven"), None)
        .await;
    s.note("label selector", format!("{code} {}", names(&even)));
    let (code, notodd) = s
        .call("GET", &format!("{svc}?labelSelector=app%21%3Dodd"), None)
        .await;
    s.note("label selector !=", format!("{code} {}", names(&notodd)));
    let (code, one) = s
        .call(
            "GET",
            &format!("{svc}?fieldSelector=metadata.name%3Ds1"),
            None,
        )
        .await;
    s.note("field selector", format!("{code} {}", names(&one)));

    // Optimistic concurrency, and a watch from a resourceVersion.
    let (_, list) = s.call("GET", &svc, None).await;
    let rv0 = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, mut s1) = s.call("GET", &format!("{svc}/s1"), None).await;
    let stale = s1.clone();
    s1["metadata"]["labels"]["touched"] = json!("yes");
    s.outcome("update", "PUT", &format!("{svc}/s1"), Some(&s1))
        .await;
    let mut stale = stale;
    stale["metadata"]["labels"]["touched"] = json!("again");
    s.outcome(
        "update from a stale version",
        "PUT",
        &format!("{svc}/s1"),
        Some(&stale),
    )
    .await;
    s.outcome("delete", "DELETE", &format!("{svc}/s2"), None)
        .await;
    s.outcome("delete a missing one", "DELETE", &format!("{svc}/s2"), None)
        .await;
    s.watch(
        "watch from a resourceVersion",
        &format!("{svc}?watch=1&resourceVersion={rv0}&timeoutSeconds=1"),
        false,
    )
    .await;
    s.watch(
        "watch with a label selector",
        &format!("{svc}?watch=1&resourceVersion={rv0}&labelSelector=app%3Dodd&timeoutSeconds=1"),
        false,
    )
    .await;

    // The initial state as events, ended by a bookmark.
    s.watch(
        "sendInitialEvents",
        &format!(
            "{svc}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1"
        ),
        true,
    )
    .await;
    s.watch(
        "sendInitialEvents without bookmarks",
        &format!("{svc}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=1"),
        true,
    )
    .await;

    // The ConfigMap size limit (1 MiB of data).
    let big = "x".repeat(1024 * 1024 + 1);
    s.outcome(
        "a ConfigMap over 1 MiB",
        "POST",
        &cms,
        Some(&configmap(ns, "big", &big)),
    )
    .await;

    // Leases, as leader election updates them.
    let leases = format!("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases");
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "leader", "namespace": ns},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}});
    let created = s
        .outcome("create lease", "POST", &leases, Some(&lease))
        .await;
    let mut renewed = created.clone();
    renewed["spec"]["renewTime"] = json!("2026-11-26T10:00:00.000000Z");
    s.outcome(
        "renew lease",
        "PUT",
        &format!("{leases}/leader"),
        Some(&renewed),
    )
    .await;
    let mut taken = created;
    taken["spec"]["holderIdentity"] = json!("b");
    s.outcome(
        "take lease from a stale version",
        "PUT",
        &format!("{leases}/leader"),
        Some(&taken),
    )
    .await;

    // 410: history compacted under a watch position and under a continue token.
    for i in 0..3 {
        s.outcome(
            "create configmap",
            "POST",
            &cms,
            Some(&configmap(ns, &format!("c{i}"), "v")),
        )
        .await;
    }
    let (_, page1) = s.call("GET", &format!("{cms}?limit=1"), None).await;
    let token = page1["metadata"]["continue"].as_str().unwrap().to_string();
    let old = page1["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    for i in 0..3 {
        let (_, mut c) = s.call("GET", &format!("{cms}/c{i}"), None).await;
        c["data"]["d"] = json!("changed");
        s.call("PUT", &format!("{cms}/c{i}"), Some(&c)).await;
    }
    (s.compact)();
    s.watch(
        "watch from a compacted resourceVersion",
        &format!("{cms}?watch=1&resourceVersion={old}&timeoutSeconds=1"),
        false,
    )
    .await;
    s.outcome(
        "continue a list across a compaction",
        "GET",
        &format!("{cms}?limit=1&continue={token}"),
        None,
    )
    .await;
    s.outcome(
        "list at a compacted resourceVersion",
        "GET",
        &format!("{cms}?resourceVersion={old}&resourceVersionMatch=Exact"),
        None,
    )
    .await;
}

/// Why `real` and `sim` differ, when it is on purpose.
fn deliberate(real: &str, sim: &str) -> Option<&'static str> {
    DELIBERATE
        .iter()
        .find(|(step, normalise, _)| real.starts_with(step) && normalise(real) == normalise(sim))
        .map(|(_, _, why)| *why)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_answers_the_script_as_the_api_server_does() {
    let cluster = Cluster::from_env();
    let mut real = Server {
        client: client_of(&cluster.kubeconfig()).await,
        compact: Box::new(move || Cluster::from_env().compact()),
        lines: Vec::new(),
    };
    let sim = std::sync::Arc::new(Sim::start(SimConfig::default()).await.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig: PathBuf = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    let compacting = sim.clone();
    let mut simulated = Server {
        client: client_of(&kubeconfig).await,
        compact: Box::new(move || compacting.compact()),
        lines: Vec::new(),
    };
    let ns = unique("fidelity");
    script(&mut real, &ns).await;
    script(&mut simulated, &ns).await;

    compare(&real, &simulated);
}

/// The two transcripts match line for line, except for the deliberate differences.
fn compare(real: &Server, simulated: &Server) {
    let mut unexplained = Vec::new();
    let mut explained = Vec::new();
    for i in 0..real.lines.len().max(simulated.lines.len()) {
        let r = real.lines.get(i).map_or("(none)", String::as_str);
        let s = simulated.lines.get(i).map_or("(none)", String::as_str);
        if r == s {
            continue;
        }
        let entry = format!("  real: {r}\n  sim:  {s}");
        match deliberate(r, s) {
            Some(why) => explained.push(format!("{entry}\n  deliberate: {why}")),
            None => unexplained.push(entry),
        }
    }
    eprintln!(
        "the script, as the API server answered it:\n  {}",
        real.lines.join("\n  ")
    );
    if !explained.is_empty() {
        eprintln!("deliberate differences:\n{}", explained.join("\n"));
    }
    assert!(
        unexplained.is_empty(),
        "the simulator differs from the API server:\n{}",
        unexplained.join("\n")
    );
}

/// A `shardSelector` of the namespaces hashed in `[start, end)`, as a query value.
fn shard_range(start: &str, end: &str) -> String {
    form_urlencoded::byte_serialize(
        format!("shardRange(object.metadata.namespace, '{start}', '{end}')").as_bytes(),
    )
    .collect()
}

/// Creates ConfigMap `name` in `ns`, labelled with the run (`prefix`).
async fn create_run_configmap(s: &mut Server, ns: &str, name: &str, prefix: &str) {
    let mut cm = configmap(ns, name, "x");
    cm["metadata"]["labels"] = json!({"run": prefix.trim_end_matches('-')});
    let path = format!("/api/v1/namespaces/{ns}/configmaps");
    s.outcome("create configmap", "POST", &path, Some(&cm))
        .await;
}

/// Notes the namespaces of the objects the watch at `path` announced as ADDED.
async fn note_added(s: &mut Server, step: &str, path: &str, prefix: &str) {
    let (_, events) = s.call("GET", path, None).await;
    let added: Vec<Value> = events
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e["type"] == "ADDED")
        .map(|e| e["object"].clone())
        .collect();
    s.note(step, format!("[{}]", namespaces_of(&added, prefix)));
}

/// The namespaces of a list's items, sorted and without the run's prefix.
fn namespaces_of(items: &[Value], prefix: &str) -> String {
    let mut n: Vec<&str> = items
        .iter()
        .filter_map(|o| o["metadata"]["namespace"].as_str()?.strip_prefix(prefix))
        .collect();
    n.sort_unstable();
    n.join(",")
}

/// Sharded lists and watches (`shardSelector`, gate `ShardedListAndWatch` on): which of eight
/// namespaces' objects each half of the hash space holds in a list, in pages (the selector
/// sent again with each), in a watch and in a `sendInitialEvents` watch; what a list says of
/// its filter (`metadata.shardInfo`); and what a malformed selector gets.
async fn shard_script(s: &mut Server, prefix: &str) {
    for i in 0..8 {
        let ns = format!("{prefix}{i}");
        create_namespace(s, &ns).await;
        create_run_configmap(s, &ns, "c", prefix).await;
    }
    let cms = format!(
        "/api/v1/configmaps?labelSelector=run%3D{}",
        prefix.trim_end_matches('-')
    );
    let halves = [
        (
            "low half",
            shard_range("0x0000000000000000", "0x8000000000000000"),
        ),
        (
            "high half",
            shard_range("0x8000000000000000", "0x10000000000000000"),
        ),
    ];
    for (half, sel) in &halves {
        let (code, list) = s
            .call("GET", &format!("{cms}&shardSelector={sel}"), None)
            .await;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        s.note(
            &format!("list, {half}"),
            format!(
                "{code} [{}] metadata [{}]",
                namespaces_of(&items, prefix),
                keys(&list["metadata"])
            ),
        );
        // Pages of two, the selector sent with each.
        let mut all = Vec::new();
        let mut token = String::new();
        for _ in 0..10 {
            let (_, page) = s
                .call(
                    "GET",
                    &format!("{cms}&shardSelector={sel}&limit=2&continue={token}"),
                    None,
                )
                .await;
            all.extend(page["items"].as_array().cloned().unwrap_or_default());
            match page["metadata"]["continue"].as_str() {
                Some(c) if !c.is_empty() => token = c.to_string(),
                _ => break,
            }
        }
        s.note(
            &format!("pages, {half}"),
            format!("[{}]", namespaces_of(&all, prefix)),
        );
        let initial = format!("{cms}&shardSelector={sel}&watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1");
        note_added(s, &format!("sendInitialEvents, {half}"), &initial, prefix).await;
    }
    // A watch of each half from before a new object in every namespace.
    let (_, now) = s.call("GET", &cms, None).await;
    let rv = now["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    for i in 0..8 {
        create_run_configmap(s, &format!("{prefix}{i}"), "d", prefix).await;
    }
    for (half, sel) in &halves {
        let watch =
            format!("{cms}&shardSelector={sel}&watch=1&resourceVersion={rv}&timeoutSeconds=1");
        note_added(s, &format!("watch, {half}"), &watch, prefix).await;
    }
    let bad: String =
        form_urlencoded::byte_serialize(b"shardRange(object.metadata.name, '0x0', '0x1')")
            .collect();
    s.outcome(
        "a selector on another field",
        "GET",
        &format!("{cms}&shardSelector={bad}"),
        None,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_lists_and_watches_as_the_api_server_serves_them() {
    let cluster = Cluster::start_own("WatchList=true,ShardedListAndWatch=true");
    let mut real = Server {
        client: client_of(&cluster.kubeconfig()).await,
        compact: Box::new(|| {}),
        lines: Vec::new(),
    };
    let sim = Sim::start(SimConfig {
        sharded_list_and_watch: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig: PathBuf = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    let mut simulated = Server {
        client: client_of(&kubeconfig).await,
        compact: Box::new(|| {}),
        lines: Vec::new(),
    };
    let prefix = format!("{}-", unique("shards"));
    shard_script(&mut real, &prefix).await;
    shard_script(&mut simulated, &prefix).await;
    compare(&real, &simulated);
}
