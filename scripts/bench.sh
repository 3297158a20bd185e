#!/usr/bin/env bash
# The benchmarks.
#   scripts/bench.sh           relay vs a bare producer on the same broker, same bytes: events/s,
#                              CPU per event, peak RSS, publish latency (BENCH_EVENTS, BENCH_RATE);
#                              and vs the OpenTelemetry Collector on the same replay (built by
#                              scripts/otelcol.sh on first use)
#   scripts/bench.sh restore   restoring the membership of BENCH_MEMBERS objects: time, peak RSS
#   scripts/bench.sh relist    the whole relay over BENCH_MEMBERS pods: a full sync, then a restart
#                              whose position expired (restore, 410, relist, delta): time, peak RSS
#   scripts/bench.sh retire    retiring a stream of BENCH_MEMBERS members whose channel was
#                              removed: time, peak RSS
#   scripts/bench.sh api_bytes checkpoint bytes written to the API per minute under churn
#                              (BENCH_OBJECTS, BENCH_RATE, BENCH_SECONDS; BENCH_RELAY_BIN for
#                              another build)
#   scripts/bench.sh sharding  one vs three sharded replicas on the same replay: events/s, CPU per
#                              event; the takeover after one of three is killed
#   scripts/bench.sh handover  scale 3 -> 5 -> 2 and kill -9 of one of two under churn (BENCH_RATE),
#                              fanned out and per namespace (BENCH_SHAPES=fanned,listed): changes
#                              lost against the API server's journal, late records of a deposed
#                              owner, unowned time per shard (p50, p99), revoke to answer;
#                              BENCH_GROUP_PROTOCOL=consumer for the shard group on KIP-848 (the
#                              broker it starts then holds the release's 10 s session, and
#                              heartbeats every second)
#   scripts/bench.sh million   BENCH_PODS pods (default 1,000,000) read cluster-wide by three
#                              sharded replicas on the simulator: first sync vs the pass-through,
#                              shares, peak RSS, requests; a relist after a 410 (BENCH_CHANGED);
#                              once a delivery mode (BENCH_DELIVERY=atLeastOnce,exactlyOnce),
#                              BENCH_SHARDS shards (default 64); BENCH_GROUP_PROTOCOL as above
#   scripts/bench.sh server_shards  three sharded replicas on the real kube-apiserver with its
#                              sharded lists and watches on and off (BENCH_PODS, default 20,000):
#                              what the server sent each replica of its shards and of others'
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z ${KAFKA_BOOTSTRAP_SERVERS:-} ]]; then
  if [[ ${BENCH_GROUP_PROTOCOL:-classic} == consumer ]]; then
    # Under KIP-848 the session and the heartbeat are the broker's to set.
    BROKER_EXTRA=$'group.consumer.session.timeout.ms=10000\ngroup.consumer.min.session.timeout.ms=6000\ngroup.consumer.heartbeat.interval.ms=1000\ngroup.consumer.min.heartbeat.interval.ms=500'
    export BROKER_EXTRA
  fi
  dir=$(mktemp -d)
  trap 'scripts/broker.sh stop "$dir"' EXIT
  KAFKA_BOOTSTRAP_SERVERS=$(scripts/broker.sh start "$dir")
  export KAFKA_BOOTSTRAP_SERVERS
fi
if [[ ${1:-throughput} == throughput ]]; then
  scripts/otelcol.sh install
  OTELCOL_BIN=$(scripts/otelcol.sh bin)
  export OTELCOL_BIN
fi
if [[ ${1:-} == server_shards ]]; then
  scripts/cluster.sh install
fi
cargo bench --locked --bench "${1:-throughput}"
