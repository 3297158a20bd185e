//! The real-cluster tier: the relay's binary against a real kube-apiserver and etcd
//! (`scripts/cluster.sh`) and the suite's Kafka broker. Each test ends with what a consumer
//! holds, applying every key's records in partition order, equal to what the API server holds.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use common::bed::{eventually, shard_of};
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

/// Applies `resource` objects named `{prefix}{i}` in `ns`, for each `i` of `names`.
fn make(cluster: &Cluster, resource: &str, ns: &str, prefix: &str, names: std::ops::Range<u32>) {
    let items: Vec<Value> = names
        .map(|i| manifest(resource, ns, &format!("{prefix}{i}")))
        .collect();
    cluster.apply(&json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string());
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
    kafka::create_catalogue_topics(&prefix).await;
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
    let make = |names| make(&cluster, resource, &ns, "np", names);
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
    let watch_event = schema::validator(&schema::watch_event_schema());
    for m in &msgs {
        let errs = schema::errors(&watch_event, &m.value);
        assert!(errs.is_empty(), "{errs:?}\n{}", m.value);
    }
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
    make(&cluster, "services", &ns, "s", 0..5);
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
    let pods = |names| make(&cluster, "pods", &ns, "p", names);
    pods(0..23);
    let topic = kafka::unique("pages");
    kafka::create_topics(&[&topic], 3).await;
    let channels = format!(
        "  - operationId: watchNamespacedPods\n    namespaces: [{ns}]\n    topic: {topic}\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut relay = RelayProcess::start(dir.path(), &config(&cluster, &home, &channels));
    relay.wait_log("sendInitialEvents refused").await;
    wait_streams(&cluster, &home, 1, &relay).await;
    pods(23..30);
    cluster.kubectl(&["-n", &ns, "delete", "pod", "p3", "--wait=false"]);
    let want = cluster_view(&cluster, "pods", |o| {
        o["metadata"]["namespace"] == ns.as_str()
    });
    let in_ns = move |k: &str| k.starts_with(&format!("{ns}/"));
    converge(&topic, want, in_ns).await;
    relay.stop();
}

/// The chart as a user installs it, on a real API server: `helm template` with two replicas,
/// applied with kubectl; each replica runs the binary with the chart's own configuration as its
/// ServiceAccount (a token from the TokenRequest API), under exactly the RBAC the chart
/// rendered. One replica holds the Lease and relays; killed, the other takes the Lease over and
/// relays on. With one permission taken from the rendered ClusterRole, the relay says which.
/// A release of the chart, rendered with `sets` (`--set` values) into a namespace of its own and
/// applied: its RBAC and ServiceAccount exist, and its configuration is pointed at this cluster
/// through the ServiceAccount's token, so the relay may do what the chart grants and no more.
struct Release {
    ns: String,
    /// `config.clusterName`: the namespace's name without dashes, so its topics are its own.
    cluster_name: String,
    /// The chart's configuration, with short intervals and a membership topic of its own.
    cfg: Value,
    /// Holds the ServiceAccount's kubeconfig and the replicas' files.
    dir: tempfile::TempDir,
}

/// A kubeconfig (written in `dir`) that reaches the cluster as ServiceAccount `sa` of `ns`,
/// through a token from the TokenRequest API: what a pod of that ServiceAccount may do.
fn sa_kubeconfig(cluster: &Cluster, ns: &str, sa: &str, dir: &Path) -> std::path::PathBuf {
    let token = cluster.kubectl(&["-n", ns, "create", "token", sa, "--duration=1h"]);
    let admin: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(cluster.kubeconfig()).unwrap()).unwrap();
    let kubeconfig = dir.join(format!("{sa}.kubeconfig"));
    let sa_config = json!({"apiVersion": "v1", "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": "sa", "user": {"token": token.trim()}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": "sa"}}],
        "current-context": "sa"});
    std::fs::write(&kubeconfig, sa_config.to_string()).unwrap();
    kubeconfig
}

impl Release {
    async fn install(cluster: &Cluster, prefix: &str, sets: &[&str]) -> Self {
        let ns = unique(prefix);
        namespace(cluster, &ns);
        let cluster_name = ns.replace('-', "");
        let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/watchrelay");
        let mut helm = std::process::Command::new("helm");
        // The release's own objects; its preflight hook has a test of its own.
        helm.args(["template", "wr", "--no-hooks"])
            .arg(&chart)
            .args(["--namespace", &ns])
            .args(["--set", &format!("config.clusterName={cluster_name}")])
            .args([
                "--set",
                &format!("config.kafka.bootstrapServers={}", kafka::bootstrap()),
            ]);
        for set in sets {
            helm.args(["--set", set]);
        }
        let rendered = helm
            .output()
            .expect("helm runs (the test command installs it)");
        assert!(rendered.status.success(), "{rendered:?}");
        let rendered = String::from_utf8(rendered.stdout).unwrap();
        cluster.apply(&rendered);
        // No topic is created by hand: the relay creates its channels' topics at start.

        let cm: Value = serde_json::from_str(&cluster.kubectl(&[
            "-n",
            &ns,
            "get",
            "configmap",
            "wr-watchrelay-config",
            "-o",
            "json",
        ]))
        .unwrap();
        let mut cfg: Value =
            serde_saphyr::from_str(cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
        let sa = rendered
            .split("\n---")
            .find(|d| d.contains("kind: ServiceAccount"))
            .and_then(|d| d.lines().find_map(|l| l.trim().strip_prefix("name: ")))
            .expect("the chart renders a ServiceAccount")
            .trim()
            .to_string();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = sa_kubeconfig(cluster, &ns, &sa, dir.path());
        cfg["kubernetes"] =
            json!({"kubeconfig": kubeconfig, "backoffInitialMs": 50, "backoffMaxMs": 1000});
        cfg["checkpoint"]["intervalMs"] = json!(200);
        cfg["checkpoint"]["membership"] = json!({"topic": kafka::unique("membership")});
        cfg["http"] = json!({"listen": "127.0.0.1:0"});
        Self {
            ns,
            cluster_name,
            cfg,
            dir,
        }
    }

    /// The chart's preflight hook for this release with `sets` (`--set` values) applied (its
    /// Job too, which no kubelet runs here), and its command run as the hook's own
    /// ServiceAccount on the hook's own ConfigMap, as the Job would run it.
    fn preflight(&self, cluster: &Cluster, sets: &[&str]) -> std::process::Output {
        let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/watchrelay");
        let mut helm = std::process::Command::new("helm");
        helm.args(["template", "wr"])
            .arg(&chart)
            .args([
                "--namespace",
                &self.ns,
                "--show-only",
                "templates/preflight.yaml",
            ])
            .args([
                "--set",
                &format!("config.clusterName={}", self.cluster_name),
            ])
            .args([
                "--set",
                &format!("config.kafka.bootstrapServers={}", kafka::bootstrap()),
            ]);
        for set in sets {
            helm.args(["--set", set]);
        }
        let rendered = helm.output().expect("helm runs");
        assert!(rendered.status.success(), "{rendered:?}");
        cluster.apply(&String::from_utf8(rendered.stdout).unwrap());
        let cm: Value = serde_json::from_str(&cluster.kubectl(&[
            "-n",
            &self.ns,
            "get",
            "configmap",
            "wr-watchrelay-preflight",
            "-o",
            "json",
        ]))
        .unwrap();
        let mut cfg: Value =
            serde_saphyr::from_str(cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
        let kubeconfig = sa_kubeconfig(
            cluster,
            &self.ns,
            "wr-watchrelay-preflight",
            self.dir.path(),
        );
        cfg["kubernetes"] = json!({"kubeconfig": kubeconfig});
        let file = self.dir.path().join("preflight.yaml");
        std::fs::write(&file, serde_json::to_string(&cfg).unwrap()).unwrap();
        std::process::Command::new(env!("CARGO_BIN_EXE_watchrelay"))
            .args(["check-config", "--live"])
            .arg(&file)
            .output()
            .unwrap()
    }

    /// Starts the binary as replica `pod` of the release, on `config`.
    fn replica(&self, config: &str, pod: &str) -> RelayProcess {
        RelayProcess::replica(self.dir.path(), config, pod)
    }
}

/// The chart's pre-install and pre-upgrade check on a real API server, as its hook Job runs it
/// (its own ServiceAccount, read-only RBAC and ConfigMap): a new release passes; once the
/// release ran, an upgrade that renames its membership topic (as a changed clusterName does to
/// the default) is refused with the relay's own message, before any replica runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_preflight_refuses_an_upgrade_before_any_pod_is_replaced() {
    let cluster = Cluster::from_env();
    let release = Release::install(&cluster, "preflight", &[]).await;
    let membership = release.cfg["checkpoint"]["membership"]["topic"]
        .as_str()
        .unwrap()
        .to_string();
    let keep = format!("config.checkpoint.membership.topic={membership}");
    let out = release.preflight(&cluster, &[&keep]);
    assert!(out.status.success(), "a new release refused: {out:?}");

    let config = serde_json::to_string(&release.cfg).unwrap();
    let mut replica = release.replica(&config, "wr-a");
    let streams = || {
        cluster
            .try_kubectl(
                &[
                    "-n",
                    &release.ns,
                    "get",
                    "configmap",
                    "wr-watchrelay-checkpoints",
                    "-o",
                    "json",
                ],
                None,
            )
            .map_or(0, |text| {
                watchrelay::checkpoint::read(&serde_json::from_str::<ConfigMap>(&text).unwrap())
                    .len()
            })
    };
    for _ in 0..900 {
        if streams() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(streams() >= 3, "the release never ran:\n{}", replica.log());
    replica.stop();
    let out = release.preflight(&cluster, &[&keep]);
    assert!(
        out.status.success(),
        "the same configuration refused: {out:?}"
    );

    let renamed = kafka::unique("renamed");
    let out = release.preflight(
        &cluster,
        &[&format!("config.checkpoint.membership.topic={renamed}")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the rename passed: {stderr}");
    assert!(
        stderr.contains(&format!(
            "checkpoint.membership.topic is {renamed} but this relay's members are in {membership}"
        )),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_rbac_two_replicas_and_a_missing_permission() {
    let cluster = Cluster::from_env();
    let mut release = Release::install(&cluster, "chart", &["replicaCount=2"]).await;
    let (ns, cluster_name) = (release.ns.clone(), release.cluster_name.clone());
    let apps = format!("{ns}-apps");
    namespace(&cluster, &apps);
    let le = &mut release.cfg["leaderElection"];
    le["leaseDurationSeconds"] = json!(4);
    le["renewDeadlineSeconds"] = json!(3);
    le["retryPeriodSeconds"] = json!(1);
    let config = serde_json::to_string(&release.cfg).unwrap();

    let pods = |names| make(&cluster, "pods", &apps, "p", names);
    pods(0..10);
    let mut a = release.replica(&config, "wr-a");
    let mut b = release.replica(&config, "wr-b");
    let holder = || -> Option<String> {
        let lease = cluster
            .try_kubectl(
                &[
                    "-n",
                    &ns,
                    "get",
                    "lease",
                    "wr-watchrelay-leader",
                    "-o",
                    "json",
                ],
                None,
            )
            .ok()?;
        let lease: Value = serde_json::from_str(&lease).unwrap();
        lease["spec"]["holderIdentity"].as_str().map(str::to_string)
    };
    let mut first = None;
    for _ in 0..300 {
        first = holder();
        if first.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first =
        first.unwrap_or_else(|| panic!("no replica took the Lease:\n{}\n{}", a.log(), b.log()));
    let topic = format!("{cluster_name}.pods");
    let in_apps = {
        let apps = apps.clone();
        move |k: &str| k.starts_with(&format!("{apps}/"))
    };
    let want = cluster_view(&cluster, "pods", |o| {
        o["metadata"]["namespace"] == apps.as_str()
    });
    converge(&topic, want, in_apps.clone()).await;

    // A crash of the leader: the other replica takes the Lease once it expires, and relays.
    let (leader, standby) = if first.starts_with("wr-a") {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    leader.kill();
    pods(10..15);
    cluster.kubectl(&["-n", &apps, "delete", "pod", "p0", "--wait=false"]);
    let mut second = None;
    for _ in 0..300 {
        second = holder().filter(|h| *h != first);
        if second.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        second.is_some(),
        "the standby never took the Lease:\n{}",
        standby.log()
    );
    let want = cluster_view(&cluster, "pods", |o| {
        o["metadata"]["namespace"] == apps.as_str()
    });
    converge(&topic, want, in_apps).await;
    standby.stop();

    // The rendered ClusterRole without `watch`: the relay names what it lacks.
    let name = format!("wr-watchrelay-{ns}");
    let role: Value =
        serde_json::from_str(&cluster.kubectl(&["get", "clusterrole", &name, "-o", "json"]))
            .unwrap();
    let mut trimmed = role.clone();
    for rule in trimmed["rules"].as_array_mut().unwrap() {
        if rule["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == "pods")
        {
            rule["verbs"] = json!(["list"]);
        }
    }
    trimmed["metadata"] = json!({ "name": name });
    cluster
        .try_kubectl(&["replace", "-f", "-"], Some(&trimmed.to_string()))
        .unwrap();
    let c = release.replica(&config, "wr-c");
    c.wait_log("cannot watch resource").await;
    assert!(c.log().contains("pods"), "{}", c.log());
    drop(c);
    let mut restored = role;
    restored["metadata"] = json!({ "name": name });
    cluster
        .try_kubectl(&["replace", "-f", "-"], Some(&restored.to_string()))
        .unwrap();
}

/// The chart's sharded release on a real server, three replicas of the binary with the chart's
/// RBAC (shard ConfigMaps, the parked Lease, namespaces): the shards spread over all three; a
/// `kill -9` of one moves its shards to the other two while pods come and go; the consumer's
/// view ends equal to the cluster, every record carries its namespace's shard, and the last
/// record on every key has the highest owner epoch seen on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_sharded_release_three_replicas_and_a_kill() {
    const SHARDS: u32 = 8;
    let cluster = Cluster::from_env();
    let shards = format!("config.sharding.shards={SHARDS}");
    let sets = ["replicaCount=3", "config.sharding.enabled=true", &shards];
    let mut release = Release::install(&cluster, "sharded", &sets).await;
    let ns = release.ns.clone();
    let apps: Vec<String> = (0..4).map(|i| format!("{ns}-a{i}")).collect();
    for a in &apps {
        namespace(&cluster, a);
        make(&cluster, "pods", a, "p", 0..5);
    }
    release.cfg["sharding"]["sessionTimeoutMs"] = json!(6000);
    release.cfg["sharding"]["ownershipDeadlineMs"] = json!(3000);
    let config = serde_json::to_string(&release.cfg).unwrap();
    let checkpoint = release.cfg["checkpoint"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    // Which replica last claimed each shard, from the shards' ConfigMaps.
    let owners = || -> Vec<Option<String>> {
        (0..SHARDS)
            .map(|k| {
                let name = watchrelay::config::ShardingConfig::configmap(&checkpoint, k);
                let cm = cluster
                    .try_kubectl(&["-n", &ns, "get", "configmap", &name, "-o", "json"], None)
                    .ok()?;
                let cm: Value = serde_json::from_str(&cm).ok()?;
                let owner = cm["metadata"]["annotations"]["watchrelay.io/owner"].as_str()?;
                Some(owner.split('_').next().unwrap_or(owner).to_string())
            })
            .collect()
    };
    let owned_by = |pods: &[&str]| {
        let o = owners();
        o.iter()
            .all(|x| x.as_deref().is_some_and(|x| pods.contains(&x)))
            && pods
                .iter()
                .all(|p| o.iter().any(|x| x.as_deref() == Some(*p)))
    };
    let mut replicas: Vec<RelayProcess> = ["wr-0", "wr-1", "wr-2"]
        .iter()
        .map(|pod| release.replica(&config, pod))
        .collect();
    eventually(
        || owned_by(&["wr-0", "wr-1", "wr-2"]),
        || {
            format!(
                "the shards never spread over the three replicas: {:?}\n{}",
                owners(),
                replicas[0].log()
            )
        },
    )
    .await;
    let topic = format!("{}.pods", release.cluster_name);
    let in_apps = {
        let apps = apps.clone();
        move |k: &str| apps.iter().any(|a| k.starts_with(&format!("{a}/")))
    };
    let want = || {
        cluster_view(&cluster, "pods", |o| {
            apps.iter()
                .any(|a| o["metadata"]["namespace"] == a.as_str())
        })
    };
    converge(&topic, want(), in_apps.clone()).await;

    // kill -9 of one replica while pods come and go: the other two take its shards over.
    replicas[1].kill();
    for a in &apps {
        make(&cluster, "pods", a, "p", 5..8);
        cluster.kubectl(&["-n", a, "delete", "pod", "p0", "--wait=false"]);
    }
    // The release's ConfigMap sums it up, for people: who last claimed each shard.
    let summary = || -> Vec<String> {
        cluster
            .try_kubectl(
                &["-n", &ns, "get", "configmap", &checkpoint, "-o", "json"],
                None,
            )
            .ok()
            .and_then(|cm| {
                let cm: Value = serde_json::from_str(&cm).ok()?;
                let owners =
                    cm["metadata"]["annotations"]["watchrelay.io/shard-owners"].as_str()?;
                let owners: BTreeMap<u32, String> = serde_json::from_str(owners).ok()?;
                Some(owners.into_values().collect())
            })
            .unwrap_or_default()
    };
    eventually(
        || owned_by(&["wr-0", "wr-2"]),
        || {
            format!(
                "the killed replica's shards never moved: {:?}\n{}",
                owners(),
                replicas[0].log()
            )
        },
    )
    .await;
    eventually(
        || {
            let owners = summary();
            owners.len() == SHARDS as usize
                && owners
                    .iter()
                    .all(|o| o.starts_with("wr-0") || o.starts_with("wr-2"))
        },
        || format!("the summary of the shards' owners: {:?}", summary()),
    )
    .await;
    let msgs = converge(&topic, want(), in_apps.clone()).await;

    // A resync asked with `kubectl annotate` on the release's checkpoint ConfigMap, as without
    // sharding, reaches the shards: every pod of the four namespaces is announced again.
    cluster.kubectl(&[
        "-n",
        &ns,
        "annotate",
        "configmap",
        &checkpoint,
        "watchrelay.io/resync=watchNamespacedPods",
    ]);
    let pods = want().len();
    let resynced = tokio::task::spawn_blocking({
        let (topic, in_apps) = (topic.clone(), in_apps.clone());
        move || {
            let again = |msgs: &[Msg]| {
                msgs.iter()
                    .filter(|m| m.key.as_deref().is_some_and(&in_apps))
                    .filter(|m| m.value["watchrelay"]["resync"] == true)
                    .count()
            };
            let msgs =
                kafka::read_until(&kafka::bootstrap(), &topic, Duration::from_secs(90), |m| {
                    again(m) >= pods
                });
            again(&msgs)
        }
    })
    .await
    .unwrap();
    assert!(
        resynced >= pods,
        "{resynced} of {pods} pods announced again after the resync request"
    );

    let sharding = watchrelay::config::ShardingConfig {
        shards: SHARDS,
        ..Default::default()
    };
    let mut sorted: Vec<&Msg> = msgs
        .iter()
        .filter(|m| m.key.as_deref().is_some_and(&in_apps))
        .collect();
    sorted.sort_by_key(|m| (m.partition, m.offset));
    let mut epochs: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for m in sorted {
        let ns = m.value["object"]["metadata"]["namespace"].as_str().unwrap();
        assert_eq!(
            m.value["watchrelay"]["shard"],
            sharding.shard_of(ns),
            "a record of {ns} in the wrong shard"
        );
        let epoch = m.value["watchrelay"]["ownerEpoch"]
            .as_u64()
            .expect("an owner epoch");
        let key = m.key.as_deref().unwrap();
        let (highest, last) = epochs.entry(key).or_default();
        *highest = (*highest).max(epoch);
        *last = epoch;
    }
    for (key, (highest, last)) in epochs {
        assert_eq!(
            last, highest,
            "the last record on {key} is not of its newest owner"
        );
    }
    for r in [0, 2] {
        replicas[r].stop();
    }
}

/// A `namespaceSelector` channel on a real server: namespaces labelled into scope are relayed,
/// one unlabelled leaves with an inferred DELETED per object, and `auto` crossing
/// `clusterWideAbove` keeps its per-namespace streams at the next start, saying the count calls
/// for the other shape; an explicit `watchStrategy: clusterWide` then turns them into one
/// filtered cluster-wide watch, the consumer's view unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_follows_labels_and_auto_crosses_its_threshold() {
    let cluster = Cluster::from_env();
    let prefix = unique("sel");
    let home = format!("{prefix}-relay");
    namespace(&cluster, &home);
    let label = prefix.clone();
    let nss: Vec<String> = (0..4).map(|i| format!("{prefix}-n{i}")).collect();
    for ns in &nss {
        namespace(&cluster, ns);
        make(&cluster, "services", ns, "s", 0..3);
    }
    let set_label = |ns: &str, on: bool| {
        let arg = if on {
            format!("{label}=yes")
        } else {
            format!("{label}-")
        };
        cluster.kubectl(&["label", "namespace", ns, &arg, "--overwrite"]);
    };
    set_label(&nss[0], true);
    set_label(&nss[1], true);
    let topic = kafka::unique("sel");
    kafka::create_topics(&[&topic], 3).await;
    let channels = format!(
        "  - operationId: watchNamespacedServices\n    namespaceSelector: {label}=yes\n    topic: {topic}\n"
    );
    // auto: cluster-wide above two namespaces.
    let relay_config = config(&cluster, &home, &channels)
        .replace("kubernetes:\n", "kubernetes:\n  clusterWideAbove: 2\n");
    let labelled = |cluster: &Cluster| {
        cluster_view(cluster, "services", |o| {
            let ns = o["metadata"]["namespace"].as_str().unwrap_or("");
            nss.iter().any(|n| n == ns)
                && cluster.list("namespaces", None).iter().any(|n| {
                    n["metadata"]["name"] == ns && n["metadata"]["labels"][&label] == "yes"
                })
        })
    };
    let in_test = {
        let prefix = prefix.clone();
        move |k: &str| k.starts_with(&prefix)
    };
    let dir = tempfile::tempdir().unwrap();
    let mut relay = RelayProcess::start(dir.path(), &relay_config);
    wait_streams(&cluster, &home, 2, &relay).await;
    converge(&topic, labelled(&cluster), in_test.clone()).await;
    set_label(&nss[2], true);
    set_label(&nss[0], false);
    converge(&topic, labelled(&cluster), in_test.clone()).await;
    relay.stop();
    assert!(
        checkpoints(&cluster, &home)
            .keys()
            .any(|k| k == &format!("watchNamespacedServices.{}", nss[1])),
        "two namespaces: one stream each"
    );

    // Three labelled namespaces, over a threshold of 2: the next start keeps its shape (a
    // switch retracts and re-announces every object) and says so.
    set_label(&nss[3], true);
    relay.restart();
    relay
        .wait_log("watchStrategy auto keeps the shape it ran")
        .await;
    converge(&topic, labelled(&cluster), in_test.clone()).await;
    relay.stop();
    assert!(
        !checkpoints(&cluster, &home).contains_key("watchNamespacedServices._all"),
        "auto does not switch by a count at a restart"
    );
    // Told: cluster-wide.
    let told = relay_config.replace(
        &format!("    topic: {topic}\n"),
        &format!("    topic: {topic}\n    watchStrategy: clusterWide\n"),
    );
    std::fs::write(&relay.config, told).unwrap();
    relay.restart();
    wait_streams(&cluster, &home, 1, &relay).await;
    for _ in 0..300 {
        if checkpoints(&cluster, &home).contains_key("watchNamespacedServices._all") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        checkpoints(&cluster, &home).contains_key("watchNamespacedServices._all"),
        "told, it watches cluster-wide:\n{}",
        relay.log()
    );
    converge(&topic, labelled(&cluster), in_test).await;
    relay.stop();
}

/// `watchrelay asyncapi --cluster` reads the real server's `/openapi/v3` (the Gateway API
/// kinds from their CRDs), and the document passes the AsyncAPI parser.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asyncapi_from_the_real_openapi_passes_the_parser() {
    let cluster = Cluster::from_env();
    install_gateway_crds(&cluster);
    let dir = tempfile::tempdir().unwrap();
    let mut channels = String::new();
    for c in CATALOGUE {
        let scope = if ChannelPath::parse(c.path).unwrap().namespaced {
            "    allNamespaces: true\n"
        } else {
            ""
        };
        channels.push_str(&format!(
            "  - operationId: {}\n{scope}    topic: \"real.{{operationId}}\"\n",
            c.operation_id
        ));
    }
    // The server publishes a new CRD's group in /openapi/v3 a little after it is established.
    for _ in 0..600 {
        let index = cluster.kubectl(&["get", "--raw", "/openapi/v3"]);
        if index.contains("apis/gateway.networking.k8s.io/v1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, config(&cluster, "default", &channels)).unwrap();
    let out = std::process::Command::new(common::cluster::BIN)
        .args(["asyncapi", "--cluster", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let gateway = &doc["components"]["schemas"];
    assert!(
        gateway
            .as_object()
            .unwrap()
            .keys()
            .any(|k| k.contains("Gateway")),
        "the Gateway kind's schema comes from the server"
    );
    let file = dir.path().join("cluster.json");
    std::fs::write(&file, &out.stdout).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let parser = root.join(".tools/asyncapi/node_modules");
    let checked = std::process::Command::new("node")
        .arg(root.join("scripts/check-asyncapi.mjs"))
        .arg(&file)
        .env("NODE_PATH", &parser)
        .output()
        .unwrap();
    assert!(
        checked.status.success(),
        "the AsyncAPI parser refused the document: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
}

/// The value of the series `series` (name and labels, as `/metrics` writes them) of the relay
/// listening on `port`; 0 when absent.
fn scraped(port: u16, series: &str) -> f64 {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return 0.0;
    };
    let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// One watch, many shards, on a real API server with its sharded lists and watches
/// (`ShardedListAndWatch`) on or off: two replicas of eight shards relay `watchAllPods`. The
/// first relays alone, the second joins and takes shards over, a namespace is created, the
/// second stops and hands its shards back. Each time the consumer's view equals the cluster,
/// and every record comes from its namespace's shard. With the gate on (`filtered`), the server
/// sends each replica its shards' objects and none of the other's; with it off, each reads the
/// whole collection and drops the other's.
async fn fanned_out(gates: &str, filtered: bool) {
    const SHARDS: u32 = 8;
    let cluster = Cluster::start_own(gates);
    let prefix = unique("fan");
    let home = format!("{prefix}-relay");
    namespace(&cluster, &home);
    // One namespace in each shard: whichever shards the second replica takes, it relays pods
    // (with six names drawn at random, both of its halves could miss all of them).
    let apps: Vec<String> = (0..SHARDS)
        .map(|k| {
            (0..)
                .map(|i| format!("{prefix}-a{i}"))
                .find(|ns| shard_of(SHARDS, ns) == k)
                .unwrap()
        })
        .collect();
    for a in &apps {
        namespace(&cluster, a);
        make(&cluster, "pods", a, "p", 0..4);
    }
    let topic = kafka::unique("fanned");
    kafka::create_topics(&[&topic], 3).await;
    let ports: Vec<u16> = (0..2)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        })
        .collect();
    let channels = format!("  - operationId: watchAllPods\n    topic: {topic}\n");
    let sharding = format!(
        "sharding:\n  enabled: true\n  shards: {SHARDS}\n  topic: {}\n  sessionTimeoutMs: 6000\n  ownershipDeadlineMs: 3000\nchannels:\n",
        kafka::unique("shards")
    );
    let base = config(&cluster, &home, &channels).replacen("channels:\n", &sharding, 1);
    let dir = tempfile::tempdir().unwrap();
    let replica = |r: usize| {
        let cfg = base.replace("127.0.0.1:0", &format!("127.0.0.1:{}", ports[r]));
        RelayProcess::replica(dir.path(), &cfg, &format!("wr-{r}"))
    };
    let want = || cluster_view(&cluster, "pods", |_| true);
    let everything = |_: &str| true;
    let other = |r: usize| {
        scraped(
            ports[r],
            "watchrelay_fanout_objects_received_total{whose=\"other\"}",
        )
    };
    let own = |r: usize| {
        scraped(
            ports[r],
            "watchrelay_fanout_objects_received_total{whose=\"own\"}",
        )
    };
    let owned = |r: usize| scraped(ports[r], "watchrelay_shards_owned");

    let mut a = replica(0);
    converge(&topic, want(), everything).await;
    if filtered {
        // Its catch-ups asked for the shards then waiting only.
        assert_eq!(
            other(0),
            0.0,
            "alone, the server sent only the replica's shards"
        );
    }
    assert_eq!(
        scraped(ports[0], "watchrelay_fanout_server_filtered"),
        if filtered { 1.0 } else { 0.0 },
        "{}",
        a.log()
    );

    // A second replica joins and takes shards over; pods come and go meanwhile.
    let mut b = replica(1);
    eventually(
        || owned(0) > 0.0 && owned(1) > 0.0 && owned(0) + owned(1) == f64::from(SHARDS),
        || {
            format!(
                "the shards never spread: {} and {}\n{}",
                owned(0),
                owned(1),
                b.log()
            )
        },
    )
    .await;
    for ns in &apps {
        make(&cluster, "pods", ns, "p", 4..6);
        cluster.kubectl(&["-n", ns, "delete", "pod", "p0", "--wait=false"]);
    }
    converge(&topic, want(), everything).await;
    assert!(
        own(1) > 0.0,
        "the second replica relays its shards' objects"
    );

    // Steady: what the server sends each replica now.
    let before = [other(0), other(1)];
    for ns in &apps {
        make(&cluster, "pods", ns, "p", 6..8);
        cluster.kubectl(&["-n", ns, "label", "pod", "p1", "touched=yes"]);
    }
    converge(&topic, want(), everything).await;
    let after = [other(0), other(1)];
    if filtered {
        assert_eq!(
            after,
            before,
            "the server sent a replica another's objects\n{}",
            a.log()
        );
    } else {
        assert!(
            after[0] > before[0] && after[1] > before[1],
            "without the server's filter every replica reads every object: {before:?} {after:?}"
        );
    }

    // A namespace created now, hashed below every namespace there is, so that no range a
    // replica asked for holds it: with the filter, the shard that has it relists to take it in.
    let lowest = cluster
        .list("namespaces", None)
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str())
        .map(watchrelay::config::fnv1a64)
        .min()
        .unwrap();
    let late = (0..)
        .map(|i| format!("{prefix}-late{i}"))
        .find(|n| watchrelay::config::fnv1a64(n) < lowest)
        .unwrap();
    namespace(&cluster, &late);
    make(&cluster, "pods", &late, "p", 0..3);
    converge(&topic, want(), everything).await;
    if filtered {
        let logs = a.log() + &b.log();
        assert!(
            logs.contains("namespaces the API server was not asked for"),
            "the new namespace's shard never relisted:\n{logs}"
        );
    }

    // The second replica stops: its shards go back to the first, which relays on.
    b.stop();
    eventually(
        || owned(0) == f64::from(SHARDS),
        || format!("the shards never came back: {}\n{}", owned(0), a.log()),
    )
    .await;
    for ns in apps.iter().chain([&late]) {
        make(&cluster, "pods", ns, "q", 0..2);
    }
    let msgs = converge(&topic, want(), everything).await;

    let config = watchrelay::config::ShardingConfig {
        shards: SHARDS,
        ..Default::default()
    };
    for m in &msgs {
        // Tombstones carry no object.
        let Some(ns) = m.value["object"]["metadata"]["namespace"].as_str() else {
            continue;
        };
        assert_eq!(
            m.value["watchrelay"]["shard"],
            config.shard_of(ns),
            "a record of {ns} from another shard"
        );
    }
    a.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_with_the_servers_sharded_lists_and_watches() {
    fanned_out("WatchList=true,ShardedListAndWatch=true", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_without_the_servers_sharded_lists_and_watches() {
    fanned_out("WatchList=true", false).await;
}
