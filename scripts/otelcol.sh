#!/usr/bin/env bash
# The OpenTelemetry Collector the benchmark measures beside the relay (k8sobjects receiver in
# watch mode, kafka exporter), built with the collector's builder from Go modules.
#
#   scripts/otelcol.sh install   build it into .cache/ unless built from the same files
#   scripts/otelcol.sh bin       print the binary's path
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib.sh
source "$root/scripts/lib.sh"
testbed=$root/testbed/otelcol
out=$root/.cache/otelcol

install() {
  local stamp
  stamp=$(stamp_of "$testbed/builder-config.yaml" "$testbed/go.mod" "$testbed/go.sum")
  if stamped "$out" "$stamp"; then
    return 0
  fi
  command -v go >/dev/null || { echo "otelcol.sh: go is required" >&2; exit 1; }
  echo "building the OpenTelemetry Collector with its builder (several minutes on a fresh machine)" >&2
  rm -rf "$out"
  mkdir -p "$out"
  sed "s|output_path: ./dist|output_path: $out/dist|" "$testbed/builder-config.yaml" >"$out/builder-config.yaml"
  (cd "$testbed" && go tool builder --config="$out/builder-config.yaml") >&2
  echo "$stamp" >"$out/stamp"
}

cmd=${1:-}
case $cmd in
  install) install ;;
  bin) echo "$out/dist/otelcol-peer" ;;
  *) echo "usage: $0 install | bin" >&2; exit 2 ;;
esac
