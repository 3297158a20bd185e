#!/usr/bin/env bash
# Local Kafka-protocol broker (tansu) for tests, benchmarks and the demo.
#
#   scripts/broker.sh install              install tansu 0.6.0 unless present
#   scripts/broker.sh start DIR [TOPIC..]  start on a free loopback port, create topics, print the
#                                          address; pid, port and log live in DIR
#   scripts/broker.sh stop DIR
#
# STORAGE (default memory://tansu/) selects the storage engine, e.g. sqlite://DIR/broker.db.
set -euo pipefail

TANSU_VERSION=0.6.0

install() {
  if command -v tansu >/dev/null 2>&1 && tansu --version 2>/dev/null | grep -q "$TANSU_VERSION"; then
    return 0
  fi
  echo "installing tansu $TANSU_VERSION (takes a while on a fresh machine)" >&2
  cargo install tansu --version "$TANSU_VERSION" --locked --features dynostore,libsql >&2
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

start() {
  local dir=$1; shift
  mkdir -p "$dir"
  install
  local port
  port=$(free_port)
  local url="tcp://127.0.0.1:$port"
  # setsid: the broker outlives the shell that started it, until `stop`.
  setsid tansu broker --listener-url "$url" --advertised-listener-url "$url" \
    --storage-engine "${STORAGE:-memory://tansu/}" >"$dir/broker.log" 2>&1 < /dev/null &
  echo $! >"$dir/broker.pid"
  echo "$port" >"$dir/broker.port"
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      break
    fi
    sleep 0.1
  done
  for topic in "$@"; do
    tansu topic create --broker "$url" --partitions "${PARTITIONS:-3}" "$topic" >>"$dir/broker.log" 2>&1 || true
  done
  echo "127.0.0.1:$port"
}

stop() {
  local dir=$1
  if [[ -f $dir/broker.pid ]]; then
    kill "$(cat "$dir/broker.pid")" 2>/dev/null || true
    rm -f "$dir/broker.pid"
  fi
}

cmd=${1:-}; shift || true
case $cmd in
  install) install ;;
  start) start "$@" ;;
  stop) stop "$@" ;;
  *) echo "usage: $0 install | start DIR [TOPIC..] | stop DIR" >&2; exit 2 ;;
esac
