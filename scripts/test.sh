#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests, the simulator's fidelity tests and the
# relay's integration tests against a real Kafka-protocol broker.
#
# With KAFKA_BOOTSTRAP_SERVERS set, the suite runs against that broker; otherwise a local tansu
# broker is installed (when missing) and started for the run.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

if [[ -z ${KAFKA_BOOTSTRAP_SERVERS:-} ]]; then
  broker_dir=$(mktemp -d)
  trap 'scripts/broker.sh stop "$broker_dir"' EXIT
  KAFKA_BOOTSTRAP_SERVERS=$(scripts/broker.sh start "$broker_dir")
  export KAFKA_BOOTSTRAP_SERVERS
  echo "== broker at $KAFKA_BOOTSTRAP_SERVERS"
fi

echo "== cargo test"
cargo test --workspace --locked

echo "== deploy checks (chart, manifests, alert rules, Dockerfile)"
target=$(target_dir)
WATCHRELAY_BIN=$target/debug/watchrelay scripts/check-deploy.sh
