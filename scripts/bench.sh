#!/usr/bin/env bash
# The benchmark: relay vs a bare producer on the same broker, same bytes. Prints events/s, CPU per
# event, peak RSS and publish latency percentiles. BENCH_EVENTS and BENCH_RATE tune it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z ${KAFKA_BOOTSTRAP_SERVERS:-} ]]; then
  dir=$(mktemp -d)
  trap 'scripts/broker.sh stop "$dir"' EXIT
  KAFKA_BOOTSTRAP_SERVERS=$(scripts/broker.sh start "$dir")
  export KAFKA_BOOTSTRAP_SERVERS
fi
cargo bench --locked --bench throughput
