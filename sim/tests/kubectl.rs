//! kubectl against the simulator: discovery, get, apply, delete, watch, raw watch.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use watchrelay_sim::{objects, Sim, SimConfig};

struct Kubectl {
    kubeconfig: tempfile::NamedTempFile,
}

impl Kubectl {
    fn new(sim: &Sim) -> Self {
        let kubeconfig = tempfile::NamedTempFile::new().unwrap();
        sim.write_kubeconfig(kubeconfig.path()).unwrap();
        Self { kubeconfig }
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("kubectl");
        c.arg("--kubeconfig").arg(self.kubeconfig.path()).args(args);
        c
    }

    async fn run(&self, args: &[&str]) -> String {
        let mut c = self.cmd(args);
        let out = tokio::task::spawn_blocking(move || c.output().unwrap())
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

async fn sim_with_pods() -> Sim {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    sim.create("namespaces", None, objects::namespace("shop"))
        .unwrap();
    for i in 0..3 {
        sim.create(
            "pods",
            Some("shop"),
            objects::pod("shop", &format!("web-{i}")),
        )
        .unwrap();
    }
    sim
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_apply_delete() {
    let sim = sim_with_pods().await;
    let k = Kubectl::new(&sim);
    let all = k.run(&["get", "pods", "-A"]).await;
    for i in 0..3 {
        assert!(all.contains(&format!("web-{i}")), "{all}");
    }
    let one: serde_json::Value = serde_json::from_str(
        &k.run(&["get", "pod", "web-1", "-n", "shop", "-o", "json"])
            .await,
    )
    .unwrap();
    assert_eq!(one["metadata"]["name"], "web-1");
    assert_eq!(
        one["metadata"]["uid"],
        sim.get("pods", Some("shop"), "web-1").unwrap()["metadata"]["uid"]
    );

    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("cm.yaml");
    let k = &k;
    let apply = |mode: &str, server_side: bool| {
        std::fs::write(
            &manifest,
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: shop\ndata:\n  mode: {mode}\n"),
        )
        .unwrap();
        let mut args = vec![
            "apply",
            "--validate=false",
            "-f",
            manifest.to_str().unwrap(),
        ];
        if server_side {
            args.push("--server-side");
        }
        let args: Vec<String> = args.into_iter().map(str::to_string).collect();
        async move {
            k.run(&args.iter().map(String::as_str).collect::<Vec<_>>())
                .await
        }
    };
    let mode = || sim.get("configmaps", Some("shop"), "settings").unwrap()["data"]["mode"].clone();
    let out = apply("blue", false).await;
    assert!(out.contains("created"), "{out}");
    assert_eq!(mode(), "blue");
    let out = apply("green", false).await;
    assert!(out.contains("configured"), "{out}");
    assert_eq!(mode(), "green");
    let out = apply("red", true).await;
    assert!(out.contains("serverside-applied"), "{out}");
    assert_eq!(mode(), "red");

    let out = k
        .run(&["delete", "pod", "web-0", "-n", "shop", "--wait=false"])
        .await;
    assert!(out.contains("deleted"), "{out}");
    assert!(sim.get("pods", Some("shop"), "web-0").is_none());
    let kinds = k.run(&["api-resources", "-o", "name"]).await;
    for r in [
        "pods",
        "deployments.apps",
        "events.events.k8s.io",
        "httproutes.gateway.networking.k8s.io",
        "endpointslices.discovery.k8s.io",
    ] {
        assert!(
            kinds.lines().any(|l| l == r),
            "{r} missing from api-resources:\n{kinds}"
        );
    }
}

/// (type, name) of the watch events kubectl printed as JSON (compact or pretty).
fn watch_events(lines: &[String]) -> Vec<(String, String)> {
    let text = lines.join("\n");
    serde_json::Deserializer::from_str(&text)
        .into_iter::<serde_json::Value>()
        .map_while(Result::ok)
        .map(|e| {
            let name = e["object"]["metadata"]["name"]
                .as_str()
                .unwrap_or("")
                .to_string();
            (e["type"].as_str().unwrap_or("").to_string(), name)
        })
        .collect()
}

/// Reads lines from a kubectl child until `done` holds for them, then kills it.
async fn lines_from(
    mut cmd: Command,
    done: impl Fn(&[String]) -> bool,
    trigger: impl FnOnce(),
) -> Vec<String> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut out = Vec::new();
    let mut trigger = Some(trigger);
    while !done(&out) {
        match tokio::time::timeout(Duration::from_secs(20), rx.recv()).await {
            Ok(Some(l)) => out.push(l),
            _ => break,
        }
        // Changes are made once the watch has shown its first line, so they are live events.
        if let Some(t) = trigger.take() {
            t();
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_watch_shows_live_changes() {
    let sim = sim_with_pods().await;
    let k = Kubectl::new(&sim);
    let cmd = k.cmd(&[
        "get",
        "pods",
        "-n",
        "shop",
        "-w",
        "--output-watch-events",
        "-o",
        "json",
    ]);
    let s = sim.clone();
    let want = |t: &str, n: &str| (t.to_string(), n.to_string());
    let done = move |l: &[String]| {
        let seen = watch_events(l);
        seen.contains(&want("ADDED", "new")) && seen.contains(&want("DELETED", "web-2"))
    };
    let lines = lines_from(cmd, done, move || {
        s.create("pods", Some("shop"), objects::pod("shop", "new"))
            .unwrap();
        s.delete("pods", Some("shop"), "web-2").unwrap();
    })
    .await;
    let seen = watch_events(&lines);
    assert!(seen.contains(&("ADDED".into(), "web-0".into())), "{seen:?}");
    assert!(seen.contains(&("ADDED".into(), "new".into())), "{seen:?}");
    assert!(
        seen.contains(&("DELETED".into(), "web-2".into())),
        "{seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_watch_from_a_resource_version_replays_history() {
    let sim = sim_with_pods().await;
    let k = Kubectl::new(&sim);
    let rv = sim.current_rv();
    sim.merge_patch(
        "pods",
        Some("shop"),
        "web-1",
        serde_json::json!({"metadata": {"labels": {"v": "2"}}}),
    )
    .unwrap();
    sim.delete("pods", Some("shop"), "web-0").unwrap();
    let path = format!("/api/v1/namespaces/shop/pods?watch=true&resourceVersion={rv}");
    let lines = lines_from(k.cmd(&["get", "--raw", &path]), |l| l.len() >= 2, || {}).await;
    let events: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events[0]["type"], "MODIFIED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "web-1");
    assert_eq!(events[1]["type"], "DELETED");
    assert_eq!(
        events[1]["object"]["metadata"]["resourceVersion"],
        (rv + 2).to_string()
    );

    sim.compact();
    let lines = lines_from(k.cmd(&["get", "--raw", &path]), |l| !l.is_empty(), || {}).await;
    let ev: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(ev["type"], "ERROR");
    assert_eq!(ev["object"]["code"], 410);
    assert_eq!(ev["object"]["reason"], "Expired");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_bearer_token() {
    let sim = Sim::start(SimConfig {
        tls: true,
        token: Some("s3cret".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    sim.create("namespaces", None, objects::namespace("shop"))
        .unwrap();
    sim.create("pods", Some("shop"), objects::pod("shop", "web-0"))
        .unwrap();
    assert!(sim.url().starts_with("https://"));
    let k = Kubectl::new(&sim);
    assert!(k
        .run(&["get", "pods", "-n", "shop"])
        .await
        .contains("web-0"));
    let mut bad = k.cmd(&["get", "pods", "-n", "shop", "--token", "wrong"]);
    let out = tokio::task::spawn_blocking(move || bad.output().unwrap())
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Unauthorized") || err.contains("provide credentials"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_reads_the_openapi_v3_schemas_crds_included() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    sim.register_resource(watchrelay_sim::Resource::new("example.com", "v1", "widgets", "Widget", true, &[]).with_schema(serde_json::json!({
            "type": "object",
            "description": "A widget.",
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {"type": "object"},
                "spec": {"type": "object", "description": "What the widget should be.",
                         "properties": {"size": {"type": "integer", "description": "How big the widget is."}}},
            },
        })),
    );
    let k = Kubectl::new(&sim);
    let index: serde_json::Value =
        serde_json::from_str(&k.run(&["get", "--raw", "/openapi/v3"]).await).unwrap();
    assert!(index["paths"]["api/v1"]["serverRelativeURL"]
        .as_str()
        .unwrap()
        .starts_with("/openapi/v3/api/v1?hash="));
    assert!(index["paths"]["apis/example.com/v1"].is_object());
    let pods = k.run(&["explain", "pods"]).await;
    assert!(pods.contains("KIND:") && pods.contains("Pod"), "{pods}");
    let size = k.run(&["explain", "widgets.spec.size"]).await;
    assert!(size.contains("How big the widget is."), "{size}");
}
