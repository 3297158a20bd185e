#!/usr/bin/env bash
# A real Prometheus scrapes a running relay (a dry run against the simulator with churn), loads
# the alert rules, and evaluates every expression of the Grafana dashboard and of the alert
# rules through its HTTP API: each must evaluate without error, and the relay's core series must
# be there. Then the relay's AsyncAPI documents must pass the AsyncAPI parser.
#
#   scripts/check-observability.sh WATCHRELAY_BIN SIM_BIN
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
bin=$1 sim=$2
tools=$PWD/.tools
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

echo "== the relay (dry run) against the simulator"
"$sim" --kubeconfig-out "$work/kubeconfig" --churn-rate 20 --namespaces shop --resources pods >"$work/sim.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do [[ -s $work/kubeconfig ]] && break; sleep 0.1; done
relay_port=$(free_port)
cat >"$work/relay.yaml" <<YAML
clusterName: check
kubernetes:
  kubeconfig: $work/kubeconfig
kafka:
  bootstrapServers: 127.0.0.1:1
  oversize: trim
checkpoint:
  namespace: default
http:
  listen: 127.0.0.1:$relay_port
channels:
  - operationId: watchNamespacedPods
    namespaces: [shop]
YAML
"$bin" run --dry-run --config "$work/relay.yaml" >/dev/null 2>"$work/relay.log" &
pids+=($!)

echo "== Prometheus scrapes it"
prom_port=$(free_port)
cat >"$work/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $PWD/deploy/prometheus-rules.yaml
scrape_configs:
  - job_name: watchrelay
    static_configs:
      - targets: ["127.0.0.1:$relay_port"]
YAML
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1 &
pids+=($!)

python3 - "http://127.0.0.1:$prom_port" deploy/grafana-dashboard.json deploy/prometheus-rules.yaml <<'PY'
import json, sys, time, urllib.parse, urllib.request
import yaml

base, dashboard, rules = sys.argv[1:4]

def query(expr):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        return json.load(e)

def ready():
    try:
        res = query('watchrelay_events_published_total{job="watchrelay"}')
        return res["status"] == "success" and res["data"]["result"]
    except OSError:
        return False

for _ in range(600):
    if ready():
        break
    time.sleep(0.1)
else:
    sys.exit("Prometheus never scraped the relay's published events")
time.sleep(5)  # a few more scrapes, so rates have two samples

exprs = []
d = json.load(open(dashboard))
def panels(ps):
    for p in ps:
        yield p
        yield from panels(p.get("panels", []))
for p in panels(d["panels"]):
    for t in p.get("targets", []):
        exprs.append((f"dashboard panel {p['title']!r}", t["expr"]))
for v in d["templating"]["list"]:
    q = v.get("query")
    if isinstance(q, dict) and q.get("query", "").startswith("label_values("):
        metric = q["query"][len("label_values("):].rsplit(",", 1)[0]
        exprs.append((f"dashboard variable {v['name']!r}", metric))
for g in yaml.safe_load(open(rules))["groups"]:
    for r in g["rules"]:
        exprs.append((f"alert {r.get('alert') or r.get('record')}", r["expr"]))

grafana = {"$stream": ".*", "$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
failed = []
for where, expr in exprs:
    for k, v in grafana.items():
        expr = expr.replace(k, v)
    res = query(expr)
    if res.get("status") != "success":
        failed.append(f"{where}: {expr}: {res.get('error')}")
for core in ["watchrelay_stream_up", "watchrelay_in_flight_limit", "watchrelay_stream_last_event_timestamp_seconds",
             'sum by (stream) (rate(watchrelay_events_published_total[1m]))']:
    if not query(core)["data"]["result"]:
        failed.append(f"{core}: no data")
if failed:
    sys.exit("expressions that do not evaluate:\n  " + "\n  ".join(failed))
rules_state = json.load(urllib.request.urlopen(f"{base}/api/v1/rules"))
bad = [r["name"] for g in rules_state["data"]["groups"] for r in g["rules"] if r.get("health") == "err"]
if bad:
    sys.exit(f"alert rules failing in Prometheus: {bad}")
print(f"{len(exprs)} expressions evaluate; {sum(len(g['rules']) for g in rules_state['data']['groups'])} rules loaded")
PY

echo "== the relay serves its AsyncAPI document"
python3 - "http://127.0.0.1:$relay_port/asyncapi.json" "$work/served.json" <<'PY'
import json, sys, urllib.request
doc = json.load(urllib.request.urlopen(sys.argv[1], timeout=10))
assert doc["asyncapi"].startswith("3."), doc["asyncapi"]
json.dump(doc, open(sys.argv[2], "w"))
PY

echo "== AsyncAPI documents pass the AsyncAPI parser"
ensure_asyncapi_parser
KAFKA_SASL_PASSWORD=example "$bin" asyncapi --config deploy/config.example.yaml >"$work/example.json"
"$bin" asyncapi --config deploy/config.try.yaml >"$work/try.json"
"$bin" asyncapi --config "$work/relay.yaml" --cluster >"$work/cluster.json"
NODE_PATH=$tools/asyncapi/node_modules node scripts/check-asyncapi.mjs \
  "$work/example.json" "$work/try.json" "$work/cluster.json" "$work/served.json"
echo "observability checks: all passed"
