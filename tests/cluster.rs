//! The real-cluster tier: the relay's binary against a real kube-apiserver and etcd
//! (`scripts/cluster.sh`) and the suite's Kafka broker. Each test ends with what a consumer
//! holds, applying every key's records in partition order, equal to what the API server holds.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use common::cluster::{unique, Cluster, RelayProcess};
use common::kafka::{self, Msg};
use common::schema;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::{json, Value};
use watchrelay::catalogue::{ChannelPath, CATALOGUE};

const CHECKPOINTS: &str = "watchrelay-checkpoints";

/// A manifest of the catalogue kind `resource` named `name` (in `ns` when namespaced), as a
/// user would apply it: no server-set fields.
fn manifest(resource: &str, ns: &str, name: &str) -> Value {
    let md = json!({"name": name, "namespace": ns, "labels": {"app": name}});
    match resource {
        "pods" => json!({"apiVersion": "v1", "kind": "Pod", "metadata": md,
            "spec": {"containers": [{"name": "c", "image": "registry.example/app:1"}]}}),
        "deployments.apps" => json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": md,
            "spec": {"selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "c", "image": "registry.example/app:1"}]}}}}),
        "services" => json!({"apiVersion": "v1", "kind": "Service", "metadata": md,
            "spec": {"clusterIP": "None", "selector": {"app": name}, "ports": [{"port": 80}]}}),
        "nodes" => json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
        "namespaces" => {
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        }
        "events.events.k8s.io" => json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": md, "eventTime": "2026-11-26T00:00:00.000000Z",
            "reportingController": "watchrelay.test/churn", "reportingInstance": "test",
            "action": "Test", "reason": "Test", "type": "Normal", "note": "made by a test",
            "regarding": {"kind": "Pod", "name": name, "namespace": ns}}),
        "ingresses.networking.k8s.io" => json!({"apiVersion": "networking.k8s.io/v1",
            "kind": "Ingress", "metadata": md,
            "spec": {"defaultBackend": {"service": {"name": name, "port": {"number": 80}}}}}),
        "endpointslices.discovery.k8s.io" => json!({"apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice", "metadata": md, "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.1.2.3"]}], "ports": [{"port": 80}]}),
        "networkpolicies.networking.k8s.io" => json!({"apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy", "metadata": md, "spec": {"podSelector": {}}}),
        "gateways.gateway.networking.k8s.io" => {
            json!({"apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway", "metadata": md,
            "spec": {"gatewayClassName": "test",
                "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}})
        }
        "httproutes.gateway.networking.k8s.io" => {
            json!({"apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute", "metadata": md,
            "spec": {"parentRefs": [{"name": name}]}})
        }
        other => panic!("no manifest for {other}"),
    }
}

/// Every catalogue resource, by its resource name, once (the cluster-wide operations share the
/// namespaced ones' resources).
fn resources() -> Vec<String> {
    let mut v: Vec<String> = CATALOGUE
        .iter()
        .map(|c| ChannelPath::parse(c.path).unwrap().resource_name())
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Creates three objects of every kind per namespace (`round-0..2`), labels the second and
/// deletes the third; cluster-scoped kinds get `prefix-round-i` names. Namespaces are only
/// created: without a controller-manager a deleted namespace never goes away.
fn churn(cluster: &Cluster, namespaces: &[&str], prefix: &str, round: &str) {
    let mut objects = Vec::new();
    let mut changes = Vec::new();
    for resource in resources() {
        let scoped: Vec<Option<&str>> = match resource.as_str() {
            "nodes" | "namespaces" => vec![None],
            _ => namespaces.iter().map(|n| Some(*n)).collect(),
        };
        for ns in scoped {
            for i in 0..3 {
                let name = match ns {
                    Some(_) => format!("{round}-{i}"),
                    None => format!("{prefix}-{round}-{i}"),
                };
                objects.push(manifest(&resource, ns.unwrap_or(""), &name));
                if i > 0 && resource != "namespaces" {
                    changes.push((resource.clone(), ns, name, i));
                }
            }
        }
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    cluster.apply(&list.to_string());
    for (resource, ns, name, i) in changes {
        let mut args = vec![];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        if i == 1 {
            args.extend(["label", &resource, &name, "touched=yes"]);
        } else {
            args.extend(["delete", &resource, &name, "--wait=false"]);
        }
        cluster.kubectl(&args);
    }
}

/// What a consumer holds after applying every key's records in partition order: key -> (uid,
/// resourceVersion).
fn consumer_view(msgs: &[Msg]) -> BTreeMap<String, (String, String)> {
    let mut sorted: Vec<&Msg> = msgs.iter().collect();
    sorted.sort_by_key(|m| (m.partition, m.offset));
    let mut view = BTreeMap::new();
    for m in sorted {
        let Some(key) = &m.key else { continue };
        let md = &m.value["object"]["metadata"];
        match m.value["type"].as_str() {
            Some("ADDED" | "MODIFIED") => {
                view.insert(
                    key.clone(),
                    (
                        md["uid"].as_str().unwrap().to_string(),
                        md["resourceVersion"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    ),
                );
            }
            Some("DELETED") => {
                view.remove(key);
            }
            _ => {}
        }
    }
    view
}

/// What the API server holds of `resource`, keyed as the relay keys it, keeping what `keep`
/// accepts.
fn cluster_view(
    cluster: &Cluster,
    resource: &str,
    keep: impl Fn(&Value) -> bool,
) -> BTreeMap<String, (String, String)> {
    cluster
        .list(resource, None)
        .into_iter()
        .filter(|o| keep(o))
        .map(|o| {
            let md = &o["metadata"];
            let name = md["name"].as_str().unwrap();
            let key = match md["namespace"].as_str() {
                Some(ns) => format!("{ns}/{name}"),
                None => name.to_string(),
            };
            (
                key,
                (
                    md["uid"].as_str().unwrap().to_string(),
                    md["resourceVersion"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect()
}

/// Reads `topic` until the consumer's view of what `keep` accepts equals `want` (hang guard:
/// 90 s); returns every record read.
async fn converge(
    topic: &str,
    want: BTreeMap<String, (String, String)>,
    keep: impl Fn(&str) -> bool + Send + 'static,
) -> Vec<Msg> {
    let topic = topic.to_string();
    let msgs = tokio::task::spawn_blocking({
        let want = want.clone();
        move || {
            kafka::read_until(
                &kafka::bootstrap(),
                &topic,
                Duration::from_secs(90),
                |msgs| {
                    let mut view = consumer_view(msgs);
                    view.retain(|k, _| keep(k));
                    view == want
                },
            )
        }
    })
    .await
    .unwrap();
    msgs
}

/// The relay's configuration for this cluster: `channels` is the YAML list body.
fn config(cluster: &Cluster, checkpoint_ns: &str, channels: &str) -> String {
    format!(
        "clusterName: real\n\
         kubernetes:\n  kubeconfig: {}\n  backoffInitialMs: 50\n  backoffMaxMs: 1000\n  listPageSize: 5\n\
         kafka:\n  bootstrapServers: {}\n  oversize: trim\n  properties:\n    linger.ms: \"2\"\n\
         checkpoint:\n  namespace: {checkpoint_ns}\n  intervalMs: 200\n  membership:\n    topic: {}\n\
         http:\n  listen: \"127.0.0.1:0\"\n\
         channels:\n{channels}",
        cluster.kubeconfig().display(),
        kafka::bootstrap(),
        kafka::unique("membership"),
    )
}

/// The checkpoint entries the relay wrote in `ns`.
fn checkpoints(cluster: &Cluster, ns: &str) -> HashMap<String, watchrelay::checkpoint::Saved> {
    match cluster.try_kubectl(
        &["-n", ns, "get", "configmap", CHECKPOINTS, "-o", "json"],
        None,
    ) {
        Ok(text) => {
            watchrelay::checkpoint::read(&serde_json::from_str::<ConfigMap>(&text).unwrap())
        }
        Err(_) => HashMap::new(),
    }
}

/// Waits until the relay checkpointed `n` streams (each has synced once).
async fn wait_streams(cluster: &Cluster, ns: &str, n: usize, relay: &RelayProcess) {
    for _ in 0..900 {
        if checkpoints(cluster, ns).len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "only {:?} of {n} streams checkpointed:\n{}",
        checkpoints(cluster, ns).keys().collect::<Vec<_>>(),
        relay.log()
    );
}

fn namespace(cluster: &Cluster, name: &str) {
    cluster.apply(&manifest("namespaces", "", name).to_string());
}

fn install_gateway_crds(cluster: &Cluster) {
    let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gateway-api-crds.yaml");
    cluster.kubectl(&["apply", "-f", crds.to_str().unwrap()]);
    cluster.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/gateways.gateway.networking.k8s.io",
        "crd/httproutes.gateway.networking.k8s.io",
    ]);
}

/// Every catalogue channel from a real API server, with `strategy` for the namespaced ones:
/// objects made before the relay starts arrive through the initial sync, the rest through
/// the watch; every record validates against the published WatchEvent schema, and the consumer
/// ends holding exactly what the server holds.
async fn every_channel(strategy: &str) {
    let cluster = Cluster::from_env();
    install_gateway_crds(&cluster);
    let prefix = unique(&format!("ch-{}", strategy.to_ascii_lowercase()));
    let (shop, infra, other, home) = (
        format!("{prefix}-shop"),
        format!("{prefix}-infra"),
        format!("{prefix}-other"),
        format!("{prefix}-relay"),
    );
    for ns in [&shop, &infra, &other, &home] {
        namespace(&cluster, ns);
    }
    let topics: Vec<String> = CATALOGUE
        .iter()
        .map(|c| format!("{prefix}.{}", c.operation_id))
        .collect();
    kafka::create_topics(&topics.iter().map(String::as_str).collect::<Vec<_>>(), 3).await;
    let mut channels = String::new();
    for c in CATALOGUE {
        let scope = if ChannelPath::parse(c.path).unwrap().namespaced {
            format!("    namespaces: [{shop}, {infra}]\n    watchStrategy: {strategy}\n")
        } else {
            String::new()
        };
        channels.push_str(&format!(
            "  - operationId: {}\n{scope}    topic: \"{prefix}.{{operationId}}\"\n",
            c.operation_id
        ));
    }
    let namespaces = [shop.as_str(), infra.as_str(), other.as_str()];
    churn(&cluster, &namespaces, &prefix, "before");
    let dir = tempfile::tempdir().unwrap();
    let mut relay = RelayProcess::start(dir.path(), &config(&cluster, &home, &channels));
    let streams = CATALOGUE
        .iter()
        .map(|c| match (c.path.contains("{namespace}"), strategy) {
            (true, "perNamespace") => 2,
            _ => 1,
        })
        .sum();
    wait_streams(&cluster, &home, streams, &relay).await;
    churn(&cluster, &namespaces, &prefix, "after");

    let watch_event = schema::validator(&schema::watch_event_schema());
    for c in CATALOGUE {
        let path = ChannelPath::parse(c.path).unwrap();
        let resource = path.resource_name();
        let in_scope = {
            let (shop, infra, prefix) = (shop.clone(), infra.clone(), prefix.clone());
            move |key: &str| {
                if path.namespaced {
                    key.starts_with(&format!("{shop}/")) || key.starts_with(&format!("{infra}/"))
                } else {
                    key.starts_with(&prefix)
                }
            }
        };
        let want = cluster_view(&cluster, &resource, |o| {
            let md = &o["metadata"];
            let key = match md["namespace"].as_str() {
                Some(ns) => format!("{ns}/{}", md["name"].as_str().unwrap()),
                None => md["name"].as_str().unwrap().to_string(),
            };
            in_scope(&key)
        });
        assert!(!want.is_empty(), "{}: nothing made", c.operation_id);
        let topic = format!("{prefix}.{}", c.operation_id);
        let msgs = converge(&topic, want.clone(), in_scope.clone()).await;
        let mut got = consumer_view(&msgs);
        got.retain(|k, _| in_scope(k));
        assert_eq!(got, want, "{}: the consumer's view", c.operation_id);
        for m in &msgs {
            let errs = schema::errors(&watch_event, &m.value);
            assert!(
                errs.is_empty(),
                "{}: a record does not validate as a WatchEvent: {errs:?}\n{}",
                c.operation_id,
                m.value
            );
        }
    }
    assert!(
        !relay.log().contains("sendInitialEvents refused"),
        "the WatchList gate is on: initial events, not lists"
    );
    relay.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_channel_per_namespace() {
    every_channel("perNamespace").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_channel_cluster_wide() {
    every_channel("clusterWide").await;
}

/// A real 410: the relay is stopped, NetworkPolicies (served from etcd, uncached, by the test
/// cluster's flags) are deleted and created, and etcd is compacted past the relay's position.
/// The restarted relay's watch gets 410 Gone; its resync re-lists, and what was deleted while
/// it was down gets an inferred DELETED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_compaction_forces_a_410_and_the_resync_infers_the_deletes() {
    let cluster = Cluster::from_env();
    let ns = unique("gone");
    let home = format!("{ns}-relay");
    namespace(&cluster, &ns);
    namespace(&cluster, &home);
    let resource = "networkpolicies.networking.k8s.io";
    let make = |names: std::ops::Range<u32>| {
        let items: Vec<Value> = names
            .map(|i| manifest(resource, &ns, &format!("np{i}")))
            .collect();
        cluster.apply(&json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string());
    };
    make(0..10);
    let topic = kafka::unique("netpol");
    kafka::create_topics(&[&topic], 3).await;
    let channels = format!(
        "  - operationId: watchNamespacedNetworkPolicies\n    namespaces: [{ns}]\n    topic: {topic}\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut relay = RelayProcess::start(dir.path(), &config(&cluster, &home, &channels));
    let stream = format!("watchNamespacedNetworkPolicies.{ns}");
    wait_streams(&cluster, &home, 1, &relay).await;
    let in_ns = {
        let ns = ns.clone();
        move |k: &str| k.starts_with(&format!("{ns}/"))
    };
    let want = cluster_view(&cluster, resource, |o| {
        o["metadata"]["namespace"] == ns.as_str()
    });
    converge(&topic, want, in_ns.clone()).await;
    relay.stop();
    let position = checkpoints(&cluster, &home)[&stream].rv.clone().unwrap();

    for i in 0..4 {
        cluster.kubectl(&["-n", &ns, "delete", resource, &format!("np{i}")]);
    }
    make(10..13);
    cluster.compact();
    // The server no longer serves the relay's position.
    let gone = cluster.try_kubectl(
        &[
            "get",
            "--raw",
            &format!(
                "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies?watch=1&resourceVersion={position}&timeoutSeconds=1"
            ),
        ],
        None,
    );
    assert!(
        gone.as_ref()
            .is_ok_and(|body| body.contains("\"code\":410"))
            || gone.is_err(),
        "a watch from {position} still works after the compaction: {gone:?}"
    );

    relay.restart();
    relay.wait_log("resourceVersion expired").await;
    let want = cluster_view(&cluster, resource, |o| {
        o["metadata"]["namespace"] == ns.as_str()
    });
    assert_eq!(want.len(), 9);
    let msgs = converge(&topic, want, in_ns).await;
    let inferred = msgs
        .iter()
        .filter(|m| m.value["type"] == "DELETED" && m.value["watchrelay"]["synthetic"] == true)
        .count();
    assert_eq!(
        inferred, 4,
        "one inferred DELETED per policy deleted while down"
    );
    relay.stop();
}

/// `kubectl annotate` on the checkpoint ConfigMap asks the running relay for a resync: every
/// object is announced again, flagged as a resync, and the annotation is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_requested_with_kubectl_annotate() {
    let cluster = Cluster::from_env();
    let ns = unique("resync");
    let home = format!("{ns}-relay");
    namespace(&cluster, &ns);
    namespace(&cluster, &home);
    let items: Vec<Value> = (0..5)
        .map(|i| manifest("services", &ns, &format!("s{i}")))
        .collect();
    cluster.apply(&json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string());
    let topic = kafka::unique("svc");
    kafka::create_topics(&[&topic], 3).await;
    let channels = format!(
        "  - operationId: watchNamespacedServices\n    namespaces: [{ns}]\n    topic: {topic}\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut relay = RelayProcess::start(dir.path(), &config(&cluster, &home, &channels));
    wait_streams(&cluster, &home, 1, &relay).await;
    cluster.kubectl(&[
        "-n",
        &home,
        "annotate",
        "configmap",
        CHECKPOINTS,
        "watchrelay.io/resync=watchNamespacedServices",
    ]);
    let msgs = tokio::task::spawn_blocking(move || {
        kafka::read_until(
            &kafka::bootstrap(),
            &topic,
            Duration::from_secs(60),
            |msgs| msgs.iter().filter(|m| m.value["type"] == "ADDED").count() >= 10,
        )
    })
    .await
    .unwrap();
    let announced = msgs.iter().filter(|m| m.value["type"] == "ADDED").count();
    assert_eq!(announced, 10, "each service announced again once");
    for _ in 0..100 {
        let cm: Value = serde_json::from_str(&cluster.kubectl(&[
            "-n",
            &home,
            "get",
            "configmap",
            CHECKPOINTS,
            "-o",
            "json",
        ]))
        .unwrap();
        if cm["metadata"]["annotations"]["watchrelay.io/resync"].is_null() {
            relay.stop();
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the relay never removed the annotation");
}

/// With the API server's WatchList gate off, the relay's `sendInitialEvents` watch is refused
/// and it falls back to paginated lists (pages of 5 here), with the same result for a consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_watchlist_gate_paginated_lists_do_the_same() {
    let cluster = Cluster::start_own("WatchList=false");
    let ns = unique("pages");
    let home = format!("{ns}-relay");
    namespace(&cluster, &ns);
    namespace(&cluster, &home);
    let pods = |names: std::ops::Range<u32>| {
        let items: Vec<Value> = names
            .map(|i| manifest("pods", &ns, &format!("p{i}")))
            .collect();
        json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
    };
    cluster.apply(&pods(0..23));
    let topic = kafka::unique("pages");
    kafka::create_topics(&[&topic], 3).await;
    let channels = format!(
        "  - operationId: watchNamespacedPods\n    namespaces: [{ns}]\n    topic: {topic}\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut relay = RelayProcess::start(dir.path(), &config(&cluster, &home, &channels));
    relay.wait_log("sendInitialEvents refused").await;
    wait_streams(&cluster, &home, 1, &relay).await;
    cluster.apply(&pods(23..30));
    cluster.kubectl(&["-n", &ns, "delete", "pod", "p3", "--wait=false"]);
    let want = cluster_view(&cluster, "pods", |o| {
        o["metadata"]["namespace"] == ns.as_str()
    });
    let in_ns = move |k: &str| k.starts_with(&format!("{ns}/"));
    converge(&topic, want, in_ns).await;
    relay.stop();
}
