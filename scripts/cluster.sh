#!/usr/bin/env bash
# Local Kubernetes control plane for the real-cluster tests: etcd and kube-apiserver on loopback,
# built from Go modules (testbed/etcd, testbed/k8s), with token authentication and RBAC. As with
# controller-runtime's envtest, no controller-manager or scheduler runs: namespaces are deleted
# only by hand, no default ServiceAccount appears, nothing is garbage-collected.
#
#   scripts/cluster.sh install     build etcd, etcdctl, kube-apiserver and kubectl into .cache/
#                                  unless already built from the same go.mod
#   scripts/cluster.sh start DIR   start both, print the path of a kubeconfig holding a
#                                  cluster-admin token; pids, ports, logs and data live in DIR
#   scripts/cluster.sh stop DIR
#   scripts/cluster.sh bin         print the folder holding the binaries
#
# Environment for `start`:
#   FEATURE_GATES      kube-apiserver --feature-gates (default WatchList=true)
#   WATCH_CACHE_SIZES  kube-apiserver --watch-cache-sizes (default: none for ConfigMaps and
#                      NetworkPolicies, which are then served from etcd, so compacting etcd
#                      gives a real 410 on them; the watch cache would keep serving old versions)
#
# DIR also holds `etcd.url` (for etcdctl) and `apiserver.url`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib.sh
source "$root/scripts/lib.sh"
testbed=$root/testbed
k8s_version=$(sed -n 's:^\tk8s.io/kubernetes v\(.*\) // indirect$:\1:p;s:^\tk8s.io/kubernetes v\([^ ]*\)$:\1:p' "$testbed/k8s/go.mod" | head -1)
bin=$root/.cache/k8s-$k8s_version/bin

install() {
  local stamp
  stamp=$(stamp_of "$testbed/k8s/go.mod" "$testbed/k8s/go.sum" "$testbed/etcd/go.mod" "$testbed/etcd/go.sum")
  if stamped "$bin" "$stamp"; then
    return 0
  fi
  command -v go >/dev/null || { echo "cluster.sh: go is required" >&2; exit 1; }
  mkdir -p "$bin"
  rm -f "$bin/stamp"
  echo "building etcd and kube-apiserver $k8s_version from Go modules (several minutes on a fresh machine)" >&2
  local minor=${k8s_version#1.}; minor=${minor%%.*}
  # The version the binaries report, as Kubernetes' own build sets it.
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$k8s_version"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  (cd "$testbed/etcd" &&
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3 &&
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/etcdctl" go.etcd.io/etcd/etcdctl/v3) >&2
  (cd "$testbed/k8s" &&
    CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver &&
    CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin/kubectl" k8s.io/kubernetes/cmd/kubectl) >&2
  echo "$stamp" >"$bin/stamp"
}

# Waits until `check` succeeds, or the process `pid` dies, or 60 s pass.
wait_for() {
  local what=$1 pid=$2 log=$3; shift 3
  for _ in $(seq 1 600); do
    if "$@" >/dev/null 2>&1; then
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      break
    fi
    sleep 0.1
  done
  echo "cluster.sh: $what did not start; its log:" >&2
  grep -E "^[EF][0-9]{4}" "$log" | tail -20 >&2 || true
  tail -5 "$log" >&2
  exit 1
}

start() {
  local dir=$1
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  install
  local ep pp ap
  ep=$(free_port); pp=$(free_port); ap=$(free_port)
  setsid "$bin/etcd" --name=watchrelay --data-dir="$dir/etcd" \
    --listen-client-urls="http://127.0.0.1:$ep" --advertise-client-urls="http://127.0.0.1:$ep" \
    --listen-peer-urls="http://127.0.0.1:$pp" --initial-advertise-peer-urls="http://127.0.0.1:$pp" \
    --initial-cluster="watchrelay=http://127.0.0.1:$pp" --unsafe-no-fsync --log-level=warn \
    --listen-metrics-urls="http://127.0.0.1:$(free_port)" \
    >"$dir/etcd.log" 2>&1 </dev/null &
  echo $! >"$dir/etcd.pid"
  echo "http://127.0.0.1:$ep" >"$dir/etcd.url"
  wait_for etcd "$(cat "$dir/etcd.pid")" "$dir/etcd.log" \
    "$bin/etcdctl" --endpoints="http://127.0.0.1:$ep" endpoint health

  # The service account signing key, and a static token for a cluster admin.
  [[ -f $dir/sa.key ]] || openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
  local token
  token=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
  echo "$token,watchrelay-admin,watchrelay-admin,\"system:masters\"" >"$dir/tokens.csv"
  setsid "$bin/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$ep" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$ap" \
    --cert-dir="$dir/pki" \
    --service-account-issuer="https://127.0.0.1:$ap" \
    --service-account-key-file="$dir/sa.key" --service-account-signing-key-file="$dir/sa.key" \
    --service-cluster-ip-range=10.0.0.0/24 --allow-privileged=true \
    --authorization-mode=RBAC --token-auth-file="$dir/tokens.csv" \
    --disable-admission-plugins=ServiceAccount \
    --etcd-compaction-interval=0 --endpoint-reconciler-type=none \
    --watch-cache-sizes="${WATCH_CACHE_SIZES:-configmaps#0,networkpolicies.networking.k8s.io#0}" \
    --feature-gates="${FEATURE_GATES:-WatchList=true}" \
    >"$dir/apiserver.log" 2>&1 </dev/null &
  echo $! >"$dir/apiserver.pid"
  echo "https://127.0.0.1:$ap" >"$dir/apiserver.url"
  cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:$ap
    certificate-authority: $dir/pki/apiserver.crt
users:
- name: admin
  user:
    token: $token
contexts:
- name: local
  context: {cluster: local, user: admin, namespace: default}
current-context: local
EOF
  wait_for kube-apiserver "$(cat "$dir/apiserver.pid")" "$dir/apiserver.log" \
    "$bin/kubectl" --kubeconfig "$dir/kubeconfig" get --raw /readyz
  echo "$dir/kubeconfig"
}

stop() {
  local dir=$1
  stop_pid "$dir/apiserver.pid"
  stop_pid "$dir/etcd.pid"
}

cmd=${1:-}; shift || true
case $cmd in
  install) install ;;
  start) start "$@" ;;
  stop) stop "$@" ;;
  bin) echo "$bin" ;;
  *) echo "usage: $0 install | start DIR | stop DIR | bin" >&2; exit 2 ;;
esac
