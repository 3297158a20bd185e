#!/usr/bin/env bash
# Checks the installation artefacts: the Helm chart lints and renders to manifests that validate
# against the Kubernetes schemas, its values schema refuses misspelt values, deploy/watchrelay.yaml
# is the chart's current rendering, the configurations pass `watchrelay check-config`, the alert
# rules pass promtool, the Dockerfile keeps its promises and its build stage builds a binary that
# works (scripts/check-image.py), and (scripts/check-observability.sh) a real Prometheus evaluates
# every dashboard and alert expression against a running relay whose AsyncAPI documents pass the
# AsyncAPI parser. Installs helm, kubernetes-validate, Prometheus and the parser when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
tools=$PWD/.tools
export PATH=$tools/bin:$PATH
bin=${WATCHRELAY_BIN:-$(target_dir)/debug/watchrelay}
# The chart has no placeholder identity: every render below gives it, as a user must.
id=(--set config.clusterName=my-cluster --set config.kafka.bootstrapServers=kafka:9092)

ensure_helm
if ! python3 -c 'import kubernetes_validate' 2>/dev/null; then
  echo "== installing kubernetes-validate"
  python3 -m pip install -q kubernetes-validate
fi
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  echo "== installing Prometheus and promtool (Debian package prometheus)"
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null
fi
[[ -x $bin ]] || cargo build --locked -q --bin watchrelay
sim_bin=${WATCHRELAY_SIM_BIN:-$(target_dir)/debug/watchrelay-sim}
[[ -x $sim_bin ]] || cargo build --locked -q -p watchrelay-sim --bin watchrelay-sim

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== helm lint"
helm lint --strict charts/watchrelay "${id[@]}"
helm lint --strict charts/watchrelay "${id[@]}" --set metrics.serviceMonitor.enabled=true

echo "== the values schema refuses a misspelt value"
# charts/watchrelay/values.schema.json: helm checks it at install, upgrade, lint and template.
# Its config subtree names exactly the relay's configuration keys (tests/chart_schema.rs).
for bad in replicaCont=2 config.sharding.shardz=3 config.channels[0].namespace=shop metrics.serviceMonitor.enable=true; do
  if out=$(helm template watchrelay charts/watchrelay "${id[@]}" --namespace watchrelay --set "$bad" 2>&1); then
    echo "the chart rendered with the misspelt value $bad" >&2
    exit 1
  fi
  key=${bad%%=*}
  key=${key##*.}
  grep -q "Additional property $key is not allowed" <<<"$out" \
    || { echo "the chart refused $bad without the schema's message: $out" >&2; exit 1; }
  if helm lint --strict charts/watchrelay "${id[@]}" --set "$bad" >/dev/null 2>&1; then
    echo "helm lint passed the misspelt value $bad" >&2
    exit 1
  fi
done
# And `helm install` itself, against the test bed's API server when there is one.
if [[ -n ${WATCHRELAY_TEST_CLUSTER:-} ]]; then
  if out=$(helm install --dry-run=server watchrelay charts/watchrelay "${id[@]}" --namespace default \
    --kubeconfig "$WATCHRELAY_TEST_CLUSTER/kubeconfig" --set replicaCont=2 2>&1); then
    echo "helm install --dry-run took the misspelt value replicaCont" >&2
    exit 1
  fi
  grep -q "Additional property replicaCont is not allowed" <<<"$out" \
    || { echo "helm install refused replicaCont without the schema's message: $out" >&2; exit 1; }
fi

echo "== the chart refuses a release without its identity"
for missing in config.clusterName config.kafka.bootstrapServers; do
  if helm template watchrelay charts/watchrelay "${id[@]}" --set "$missing=" >/dev/null 2>&1; then
    echo "the chart rendered without $missing" >&2
    exit 1
  fi
done

echo "== the values schema refuses what the relay refuses"
python3 scripts/check-schema-agrees.py "$bin"

echo "== rendered manifests validate against Kubernetes 1.30 schemas"
# deploy/watchrelay.yaml is the release without its hooks (kubectl apply runs no hook).
helm template watchrelay charts/watchrelay "${id[@]}" --namespace watchrelay --no-hooks >"$work/default.yaml"
kubernetes-validate --quiet --strict --kubernetes-version 1.30.0 "$work/default.yaml"
# The pre-install and pre-upgrade check: its Job, its ConfigMap and its own read-only RBAC,
# single-leader and sharded.
helm template watchrelay charts/watchrelay "${id[@]}" --namespace watchrelay >"$work/hooks.yaml"
helm template watchrelay charts/watchrelay "${id[@]}" --namespace watchrelay --set config.sharding.enabled=true \
  --set config.sharding.shards=8 --set replicaCount=3 >>"$work/hooks.yaml"
kubernetes-validate --quiet --strict --kubernetes-version 1.30.0 "$work/hooks.yaml"
python3 - "$work/hooks.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
hooks = [d for d in docs if "helm.sh/hook" in (d["metadata"].get("annotations") or {})]
jobs = [d for d in hooks if d["kind"] == "Job"]
assert len(jobs) == 2, f"one preflight Job a render, found {len(jobs)}"
for job in jobs:
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["check-config", "--live"], container["args"]
    assert job["spec"]["backoffLimit"] == 0
for role in (d for d in hooks if d["kind"] in ("Role", "ClusterRole")):
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert verbs <= {"get", "list"}, f"{role['metadata']['name']} may {verbs}: the check writes nothing"
PY
helm template watchrelay charts/watchrelay "${id[@]}" --namespace watchrelay --set metrics.serviceMonitor.enabled=true \
  --set 'extraWatchRules[0].apiGroups[0]=example.com' --set 'extraWatchRules[0].resources[0]=widgets' >"$work/full.yaml"
# The ServiceMonitor is a CRD kind without a built-in schema: check it is there, validate the rest.
python3 - "$work/full.yaml" "$work/core.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
assert any(d["kind"] == "ServiceMonitor" for d in docs), "ServiceMonitor not rendered"
yaml.safe_dump_all([d for d in docs if d["kind"] != "ServiceMonitor"], open(sys.argv[2], "w"))
PY
kubernetes-validate --quiet --strict --kubernetes-version 1.30.0 "$work/core.yaml"

echo "== the split recipe (docs/scale-out.md) makes a valid one-off Pod of a sharded replica"
# The recipe's jq program (the release named watchrelay), on the Deployment as `kubectl get -o
# json` gives it.
helm template watchrelay charts/watchrelay "${id[@]}" --namespace watchrelay --no-hooks --set config.sharding.enabled=true \
  --set config.sharding.shards=8 --set replicaCount=3 >"$work/sharded.yaml"
python3 - "$work/sharded.yaml" >"$work/deployment.json" <<'PY'
import json, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Deployment"]
assert len(docs) == 1, f"one Deployment, found {len(docs)}"
json.dump(docs[0], sys.stdout)
PY
jq '{apiVersion: "v1", kind: "Pod",
  metadata: {name: "watchrelay-split-whole"},
  spec: (.spec.template.spec | .restartPolicy = "Never"
    | .containers[0] |= (.args = ["split-whole", "--config", "/etc/watchrelay/config.yaml"]
      | del(.livenessProbe, .readinessProbe, .startupProbe)))}' "$work/deployment.json" >"$work/split.json"
kubernetes-validate --quiet --strict --kubernetes-version 1.30.0 "$work/split.json"
python3 - "$work/deployment.json" "$work/split.json" <<'PY'
import json, sys
deployment, pod = (json.load(open(p)) for p in sys.argv[1:3])
replica, split = deployment["spec"]["template"]["spec"], pod["spec"]
for key in ("serviceAccountName", "volumes"):
    assert split.get(key) == replica.get(key), f"the split's {key} is not the replicas'"
c, r = split["containers"][0], replica["containers"][0]
assert r["args"] == ["run", "--config", "/etc/watchrelay/config.yaml"], r["args"]
assert c["args"][0] == "split-whole" and c["args"][1:] == r["args"][1:], c["args"]
for key in ("image", "env", "envFrom", "volumeMounts"):
    assert c.get(key) == r.get(key), f"the split's {key} is not the replicas'"
assert not {"livenessProbe", "readinessProbe", "startupProbe"} & c.keys(), "the split would be probed"
PY

echo "== several replicas need leader election"
helm template watchrelay charts/watchrelay "${id[@]}" --namespace watchrelay --set replicaCount=2 >"$work/ha.yaml"
kubernetes-validate --quiet --strict --kubernetes-version 1.30.0 "$work/ha.yaml"
grep -q '^kind: PodDisruptionBudget' "$work/ha.yaml" || { echo "two replicas rendered without a PodDisruptionBudget" >&2; exit 1; }
if helm template watchrelay charts/watchrelay "${id[@]}" --set replicaCount=2 --set config.leaderElection.enabled=false >/dev/null 2>&1; then
  echo "the chart rendered two replicas without leader election" >&2
  exit 1
fi
if helm template watchrelay charts/watchrelay "${id[@]}" --namespace watchrelay --set config.leaderElection.namespace=elsewhere >/dev/null 2>&1; then
  echo "the chart rendered a Lease outside the namespace its Role covers" >&2
  exit 1
fi

echo "== the Grafana dashboard ConfigMap"
helm lint --strict charts/watchrelay "${id[@]}" --set dashboard.enabled=true
helm template watchrelay charts/watchrelay "${id[@]}" --namespace watchrelay --set dashboard.enabled=true >"$work/dashboard.yaml"
kubernetes-validate --quiet --strict --kubernetes-version 1.30.0 "$work/dashboard.yaml"
python3 - "$work/dashboard.yaml" deploy/grafana-dashboard.json <<'PY'
import json, sys, yaml
cms = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ConfigMap" and "watchrelay.json" in d.get("data", {})]
assert len(cms) == 1, "no dashboard ConfigMap rendered"
assert cms[0]["metadata"]["labels"].get("grafana_dashboard") == "1", "the dashboard ConfigMap lacks the sidecar label"
assert json.loads(cms[0]["data"]["watchrelay.json"]) == json.load(open(sys.argv[2])), "rendered dashboard differs from deploy/"
PY
if helm template watchrelay charts/watchrelay "${id[@]}" | grep -q 'watchrelay.json'; then
  echo "the dashboard ConfigMap is rendered by default" >&2
  exit 1
fi

echo "== the chart's PrometheusRule"
helm template watchrelay charts/watchrelay "${id[@]}" --namespace watchrelay --set metrics.prometheusRule.enabled=true --set 'metrics.prometheusRule.labels.release=prometheus' >"$work/rule.yaml"
python3 - "$work/rule.yaml" deploy/prometheus-rules.yaml <<'PY'
import sys, yaml
rules = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "PrometheusRule"]
assert len(rules) == 1, "no PrometheusRule rendered"
assert rules[0]["metadata"]["labels"].get("release") == "prometheus", "the PrometheusRule lacks its labels"
assert rules[0]["spec"] == yaml.safe_load(open(sys.argv[2])), "the chart's rules differ from deploy/prometheus-rules.yaml"
PY
if helm template watchrelay charts/watchrelay "${id[@]}" | grep -q 'kind: PrometheusRule'; then
  echo "the PrometheusRule is rendered by default" >&2
  exit 1
fi

echo "== the chart's RBAC is exactly what each configuration needs"
"$bin" channels -o json | diff -u charts/watchrelay/catalogue.json - \
  || { echo "charts/watchrelay/catalogue.json is stale: watchrelay channels -o json > charts/watchrelay/catalogue.json" >&2; exit 1; }
cat >"$work/mixed.yaml" <<'YAML'
clusterName: mixed
kafka:
  bootstrapServers: k1:9092,k2:9093
  oversize: trim
checkpoint:
  namespace: watchrelay
leaderElection:
  enabled: true
channels:
  - operationId: watchNamespacedPods
    namespaces: [shop, payments]
  - operationId: watchNamespacedServices
    namespaceSelector: team=web
  - operationId: watchNodes
  - operationId: watchNamespacedDeployments
    allNamespaces: true
  - path: /apis/example.com/v1/namespaces/{namespace}/widgets
    name: widgets
    namespaces: [shop]
YAML
cat >"$work/sharded.yaml" <<'YAML'
clusterName: sharded
kafka:
  bootstrapServers: k1:9092
  oversize: trim
checkpoint:
  namespace: watchrelay
sharding:
  enabled: true
  shards: 4
channels:
  - operationId: watchNamespacedPods
    allNamespaces: true
  - operationId: watchNamespacedServices
    namespaceSelector: team=web
  - operationId: watchNodes
YAML
python3 scripts/check-rbac.py "$bin" deploy/config.example.yaml deploy/config.try.yaml "$work/mixed.yaml" "$work/sharded.yaml"

echo "== the RBAC objects \`watchrelay rbac -o manifests\` prints, for installs without the chart"
"$bin" rbac -o manifests --config "$work/sharded.yaml" --service-account watchrelay/relay |
  python3 -c 'import json, sys, yaml; print(yaml.safe_dump_all(json.load(sys.stdin)["items"]))' >"$work/rbac-manifests.yaml"
kubernetes-validate --quiet --strict --kubernetes-version 1.30.0 "$work/rbac-manifests.yaml"

helm template watchrelay charts/watchrelay "${id[@]}" --namespace watchrelay --set networkPolicy.enabled=true >"$work/netpol.yaml"
kubernetes-validate --quiet --strict --kubernetes-version 1.30.0 "$work/netpol.yaml"
grep -q '^kind: NetworkPolicy' "$work/netpol.yaml" || { echo "networkPolicy.enabled rendered no NetworkPolicy" >&2; exit 1; }
python3 - "$work/netpol.yaml" <<'PY'
import sys, yaml
cluster = {"ClusterRole", "ClusterRoleBinding", "Namespace"}
bare = [f"{d['kind']}/{d['metadata']['name']}" for d in yaml.safe_load_all(open(sys.argv[1]))
        if d and d["kind"] not in cluster and not d["metadata"].get("namespace")]
assert not bare, f"namespaced objects without metadata.namespace: {bare}"
PY
# Egress follows the configuration: a broker without a port is on Kafka's default, and a schema
# registry gets its own port.
helm template watchrelay charts/watchrelay "${id[@]}" --namespace watchrelay --set networkPolicy.enabled=true \
  --set 'config.kafka.bootstrapServers=kafka\,b2:9093' \
  --set config.schemaRegistry.url=http://apicurio.registry:8080/apis/ccompat/v7 >"$work/netpol-registry.yaml"
kubernetes-validate --quiet --strict --kubernetes-version 1.30.0 "$work/netpol-registry.yaml"
python3 - "$work/netpol-registry.yaml" <<'PY'
import sys, yaml
policy = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "NetworkPolicy")
ports = {p["port"] for rule in policy["spec"]["egress"] for p in rule.get("ports", [])}
assert {9092, 9093, 8080} <= ports and 0 not in ports, f"egress ports {sorted(ports)}"
PY
# Releases of one name in two namespaces (one per team): no object of one is an object of the
# other, cluster-scoped ones and Roles in a namespace both list included.
for team in team-a team-b; do
  helm template watchrelay charts/watchrelay "${id[@]}" --namespace "$team" --set networkPolicy.enabled=true \
    -f - >"$work/$team.yaml" <<'YAML'
config:
  channels:
    - operationId: watchNamespacedPods
      allNamespaces: true
    - operationId: watchNamespacedServices
      namespaces: [shared]
    - operationId: watchNodes
YAML
done
python3 - "$work/team-a.yaml" "$work/team-b.yaml" <<'PY'
import sys, yaml
def names(path):
    return {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])
            for d in yaml.safe_load_all(open(path)) if d}
shared = names(sys.argv[1]) & names(sys.argv[2])
assert not shared, f"two releases of one name in two namespaces share {sorted(shared)}"
PY
if helm template watchrelay charts/watchrelay "${id[@]}" --namespace watchrelay --set config.checkpoint.namespace=elsewhere >/dev/null 2>&1; then
  echo "the chart rendered a checkpoint ConfigMap outside the namespace its Role covers" >&2
  exit 1
fi

echo "== checkov on the rendered chart (every option on)"
if ! command -v checkov >/dev/null 2>&1; then
  echo "   installing checkov"
  python3 -m pip install -q checkov >/dev/null 2>&1
fi
mkdir -p "$work/checkov"
helm template watchrelay charts/watchrelay "${id[@]}" --namespace watchrelay --set networkPolicy.enabled=true --set replicaCount=2 \
  --set dashboard.enabled=true --set image.digest=sha256:0000000000000000000000000000000000000000000000000000000000000000 \
  >"$work/checkov/chart.yaml"
# Explained exceptions:
#   CKV_K8S_11 CPU limits: none on purpose; CPU throttling turns into publish latency. Memory is limited.
#   CKV_K8S_38 service account token: the relay talks to the API server; it needs its token.
#   CKV_K8S_15 imagePullPolicy Always: images are pinned (image.digest); IfNotPresent is right for them.
checkov -d "$work/checkov" --framework kubernetes --quiet --compact --skip-download \
  --skip-check CKV_K8S_11,CKV_K8S_38,CKV_K8S_15 2>/dev/null

echo "== deploy/watchrelay.yaml is the chart's current rendering"
if ! diff -u deploy/watchrelay.yaml "$work/default.yaml"; then
  echo "deploy/watchrelay.yaml is stale: helm template watchrelay charts/watchrelay --set config.clusterName=my-cluster --set config.kafka.bootstrapServers=kafka:9092 --namespace watchrelay --no-hooks > deploy/watchrelay.yaml" >&2
  exit 1
fi

echo "== the chart packages as the release workflow packages it"
# What a CI with Docker and a registry would do on a tag (.github/workflows/release.yml): its
# version gate, run as written for this version, and the chart package, which must render as
# the chart's directory does.
version=$(sed -n 's/^version: //p' charts/watchrelay/Chart.yaml)
python3 - "$version" <<'PY'
import os, subprocess, sys, tempfile, yaml
workflow = yaml.safe_load(open(".github/workflows/release.yml"))
gate = next(s["run"] for s in workflow["jobs"]["versions"]["steps"] if s.get("id") == "v")
with tempfile.NamedTemporaryFile() as out:
    env = dict(os.environ, GITHUB_REF_NAME="v" + sys.argv[1], GITHUB_OUTPUT=out.name)
    subprocess.run(["bash", "-euo", "pipefail", "-c", gate], check=True, env=env)
    assert open(out.name).read().strip() == "version=" + sys.argv[1]
PY
helm package charts/watchrelay -d "$work/package" >/dev/null
if ! diff <(helm template watchrelay "$work/package/watchrelay-$version.tgz" "${id[@]}" --namespace watchrelay) \
  <(helm template watchrelay charts/watchrelay "${id[@]}" --namespace watchrelay) >/dev/null; then
  echo "the packaged chart renders otherwise than charts/watchrelay" >&2
  exit 1
fi

echo "== configurations pass check-config"
KAFKA_SASL_PASSWORD=example "$bin" check-config deploy/config.example.yaml >/dev/null
"$bin" check-config deploy/config.try.yaml >/dev/null
if "$bin" check-config deploy/config.example.yaml >/dev/null 2>&1 </dev/null && [[ -z ${KAFKA_SASL_PASSWORD:-} ]]; then
  echo "check-config accepted a configuration whose secret variable is unset" >&2
  exit 1
fi
python3 - "$work/default.yaml" "$work/config.yaml" <<'PY'
import sys, yaml
for doc in yaml.safe_load_all(open(sys.argv[1])):
    if doc and doc.get("kind") == "ConfigMap" and "config.yaml" in doc.get("data", {}):
        open(sys.argv[2], "w").write(doc["data"]["config.yaml"])
PY
"$bin" check-config "$work/config.yaml" >/dev/null

echo "== alert rules"
promtool check rules deploy/prometheus-rules.yaml

echo "== Dockerfile"
grep -qE '^USER [0-9]+:[0-9]+' Dockerfile || { echo "Dockerfile must run as a numeric non-root user" >&2; exit 1; }
grep -q -- '--locked' Dockerfile || { echo "Dockerfile must build with --locked" >&2; exit 1; }
if grep -E '^FROM' Dockerfile | grep -vqE '@sha256:[0-9a-f]{64}'; then echo "Dockerfile base images must be pinned by digest" >&2; exit 1; fi
grep -q 'distroless' Dockerfile || { echo "Dockerfile must run on a distroless base" >&2; exit 1; }
cargo tree --locked -e features -i openssl-src --features static -p watchrelay >/dev/null 2>&1 \
  || { echo "the static feature must build OpenSSL in (rdkafka/ssl-vendored)" >&2; exit 1; }
for f in $(grep -oE '^COPY [^-][^ ]* ' Dockerfile | awk '{print $2}'); do [[ -e $f ]] || { echo "Dockerfile copies missing $f" >&2; exit 1; }; done
grep -q '^ARG WATCHRELAY_COMMIT' Dockerfile || { echo "Dockerfile must take the commit as the build argument WATCHRELAY_COMMIT" >&2; exit 1; }
# The image's build stage, replayed without a container on what its COPY lines copy: it must
# build, and its binary must name its version and commit and pass the chart's configuration.
python3 scripts/check-image.py

scripts/check-observability.sh "$bin" "$sim_bin"

echo "deploy checks: all passed"
