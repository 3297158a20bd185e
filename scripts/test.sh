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
ensure_cargo_deny

# Each step says how long it took.
step() {
  echo "== $1"
  started=$SECONDS
}
took() {
  echo "== took $((SECONDS - started)) s"
}

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy"
cargo clippy --workspace --all-targets --features e2e --locked -- -D warnings
took
step "cargo doc (no broken or stale links)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --features testing --locked --quiet
took
step "cargo deny (licenses, sources, duplicate crates)"
cargo deny --log-level error check licenses bans sources
took

step "fast tier (no broker, no cluster)"
cargo test --workspace --locked
took

broker_dir=
registry_dir=
cluster_dir=$(mktemp -d)
cleanup() {
  scripts/cluster.sh stop "$cluster_dir"
  if [[ -n $registry_dir ]]; then scripts/registry.sh stop "$registry_dir"; fi
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

# The end-to-end tiers (feature `e2e`), selected by name (Cargo.toml's `[[test]]` sections):
# `kafka_*` need the broker; `tables_*` the broker, a Python with chDB, the Java programs under
# tests/tables and a schema registry; `cluster_*` also the control plane, and run as a tier of
# their own.
# The relay as released in 0.1.0, for the rolling upgrade with both versions side by side: built
# once from this repository's history into .cache/previous/.
step "the 0.1.0 relay, for the upgrade test"
scripts/previous.sh >/dev/null
took
step "end-to-end tier (broker at $KAFKA_BOOTSTRAP_SERVERS)"
cargo test --locked --features e2e --test 'kafka_*'
took

step "tables tier (the recipes on real engines, a schema registry)"
WATCHRELAY_TABLES_PYTHON=$(ensure_tables_python)
WATCHRELAY_FLINK_CLASSPATH=$(ensure_java_program flink-runner tests/tables/flink)
WATCHRELAY_DECODER_CLASSPATH=$(ensure_java_program registry-decoder tests/tables/decoder)
registry_dir=$(mktemp -d)
WATCHRELAY_REGISTRY_URL=$(scripts/registry.sh start "$registry_dir")
export WATCHRELAY_TABLES_PYTHON WATCHRELAY_FLINK_CLASSPATH WATCHRELAY_DECODER_CLASSPATH WATCHRELAY_REGISTRY_URL
cargo test --locked --features e2e --test 'tables_*'
scripts/registry.sh stop "$registry_dir"
registry_dir=
took

step "real-cluster tier (kube-apiserver and etcd, the broker)"
cargo test --locked --features e2e --test 'cluster_*'
took

step "deploy checks (chart, manifests, alert rules, Dockerfile)"
target=$(target_dir)
WATCHRELAY_BIN=$target/debug/watchrelay scripts/check-deploy.sh
took
