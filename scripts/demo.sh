#!/usr/bin/env bash
# The demo: a simulated cluster with churn, a local broker, the relay between them, and what
# arrives in Kafka. `kubectl get pods -A -w` runs against the simulated cluster alongside.
#
# DEMO_SECONDS=N stops after N seconds (default: run until Ctrl-C). DEMO_RATE sets the churn in
# changes per second (default 10).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

work=$(mktemp -d)
pids=()
cleanup() {
  # Newest first: the relay drains and writes its last checkpoint before the cluster goes away.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null || true
    sleep 0.3
  done
  wait 2>/dev/null || true
  scripts/broker.sh stop "$work"
  echo "demo files (logs, kubeconfig, config) are in $work"
}
trap cleanup EXIT

# kubectl: the one on PATH, else the test bed's (built by scripts/cluster.sh).
if ! command -v kubectl >/dev/null 2>&1; then
  scripts/cluster.sh install
  PATH=$(scripts/cluster.sh bin):$PATH
fi

echo "== building"
cargo build --release --locked -q -p watchrelay -p watchrelay-sim --bins --examples
release=$(target_dir)/release

topics=(demo.pods demo.deployments.apps demo.events.events.k8s.io demo.nodes demo.dead-letter)
echo "== starting the broker"
bootstrap=$(scripts/broker.sh start "$work" "${topics[@]}")
echo "   Kafka at $bootstrap"

echo "== starting the simulated cluster"
"$release/watchrelay-sim" --kubeconfig-out "$work/kubeconfig" --churn-rate "${DEMO_RATE:-10}" \
  --namespaces shop,payments --resources pods,deployments.apps,events.events.k8s.io,nodes >"$work/sim.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do [[ -s $work/kubeconfig ]] && break; sleep 0.1; done
k() { kubectl --kubeconfig "$work/kubeconfig" "$@"; }
# apply sends JSON (the simulator does not decode protobuf bodies, which `kubectl create` sends).
printf 'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: watchrelay\n' | k apply --validate=false -f - >/dev/null
echo "   $(head -1 "$work/sim.log")"
k get namespaces

cat >"$work/config.yaml" <<YAML
clusterName: demo
kubernetes:
  kubeconfig: $work/kubeconfig
kafka:
  bootstrapServers: $bootstrap
  deadLetterTopic: demo.dead-letter
checkpoint:
  namespace: watchrelay
http:
  listen: 127.0.0.1:0
channels:
  - operationId: watchNamespacedPods
    namespaces: [shop, payments]
    topic: "{cluster}.{resource}"
  - operationId: watchNamespacedDeployments
    allNamespaces: true
    topic: "{cluster}.{resource}"
  - operationId: watchNamespacedEvents
    namespaceSelector: kubernetes.io/metadata.name in (shop,payments)
    topic: "{cluster}.{resource}"
  - operationId: watchNodes
    topic: "{cluster}.{resource}"
YAML
"$release/watchrelay" check-config "$work/config.yaml"

echo "== kubectl get pods -A -w (prefixed 'kubectl |') and Kafka (prefixed 'kafka   |')"
k get pods -A -w --output-watch-events 2>&1 | sed -u 's/^/kubectl | /' &
pids+=($!)
WATCHRELAY_LOG=warn "$release/watchrelay" run --config "$work/config.yaml" 2>"$work/relay.log" &
pids+=($!)
"$release/examples/tail" "$bootstrap" "${topics[@]}" 2>/dev/null | sed -u 's/^/kafka   | /' &
pids+=($!)

if [[ -n ${DEMO_SECONDS:-} ]]; then
  sleep "$DEMO_SECONDS"
else
  wait
fi
echo "== checkpoints the relay keeps in the simulated cluster"
k get configmap watchrelay-checkpoints -n watchrelay -o jsonpath='{.data}' | head -c 600; echo
