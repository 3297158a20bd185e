#!/usr/bin/env bash
# The whole test suite: formatting, lints, the fast tier (unit tests, the simulator's fidelity
# tests, the relay in-process against the simulator with a producer in memory), then the
# end-to-end tiers (feature `e2e`): against a real Kafka broker, and the relay's binary against
# a real kube-apiserver and etcd.
#
# Plain `cargo test` runs the fast tier alone and needs no broker.
#
# With KAFKA_BOOTSTRAP_SERVERS set, the suite runs against that broker; otherwise a local Apache
# Kafka broker (scripts/broker.sh) is installed (when missing) and started for the run. The
# control plane (scripts/cluster.sh) is built when missing and started for the run; its kubectl
# is the one the simulator's fidelity tests run.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

scripts/cluster.sh install
PATH=$(scripts/cluster.sh bin):$PWD/.tools/bin:$PATH
export PATH
ensure_helm
ensure_asyncapi_parser

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --features e2e --locked -- -D warnings

echo "== fast tier (no broker)"
cargo test --workspace --locked

broker_dir=
cluster_dir=$(mktemp -d)
cleanup() {
  scripts/cluster.sh stop "$cluster_dir"
  if [[ -n $broker_dir ]]; then scripts/broker.sh stop "$broker_dir"; fi
}
trap cleanup EXIT
if [[ -z ${KAFKA_BOOTSTRAP_SERVERS:-} ]]; then
  broker_dir=$(mktemp -d)
  KAFKA_BOOTSTRAP_SERVERS=$(scripts/broker.sh start "$broker_dir")
  export KAFKA_BOOTSTRAP_SERVERS
  echo "== broker at $KAFKA_BOOTSTRAP_SERVERS"
fi

scripts/cluster.sh start "$cluster_dir" >/dev/null
export WATCHRELAY_TEST_CLUSTER=$cluster_dir
echo "== control plane at $(cat "$cluster_dir/apiserver.url")"

echo "== end-to-end tests (broker at $KAFKA_BOOTSTRAP_SERVERS)"
# Only the tests that need the broker (those requiring the e2e feature in Cargo.toml): the fast
# tier already ran.
mapfile -t e2e < <(python3 - <<'PY'
import tomllib
with open("Cargo.toml", "rb") as f:
    tests = tomllib.load(f).get("test", [])
for t in tests:
    if "e2e" in t.get("required-features", []):
        print(f"--test={t['name']}")
PY
)
cargo test --locked --features e2e "${e2e[@]}"

echo "== deploy checks (chart, manifests, alert rules, Dockerfile)"
target=$(target_dir)
WATCHRELAY_BIN=$target/debug/watchrelay scripts/check-deploy.sh
