#!/usr/bin/env bash
# Writes this folder's go.mod and go.sum for building kube-apiserver and kubectl at a release:
#
#   testbed/k8s/pin.sh 1.37.2
#
# k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/apiserver, ...) at v0.0.0
# and points them at its own tree with `replace`, which only the main module may do. So this
# module pins each of them to the matching release (v0.37.2 for 1.37.2), the list being read
# from the release's own go.mod rather than copied by hand: it changes between releases.
# Only the `go` command is used; run it again to move to another release, then commit.
set -euo pipefail
version=${1:?usage: pin.sh KUBERNETES_VERSION (e.g. 1.37.2)}
staging=v0.${version#1.}
cd "$(dirname "$0")"
rm -f go.mod go.sum
go mod init watchrelay.testbed/k8s >/dev/null 2>&1
upstream=$(go mod download -json "k8s.io/kubernetes@v$version" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["GoMod"])')
# The release's Go language version and GODEBUG defaults: a dependency's godebug lines are
# ignored, so the main module restates them.
go_line=$(sed -n 's/^go \(.*\)/\1/p' "$upstream")
go mod edit -go="$go_line"
sed -n 's/^godebug \(.*\)/\1/p' "$upstream" | while read -r setting; do
  go mod edit -godebug="$setting"
done
grep -E '^[[:space:]]*k8s\.io/[a-z0-9-]+ v0\.0\.0([[:space:]]|$)' "$upstream" | awk '{print $1}' | sort -u |
  while read -r module; do
    go mod edit -replace="$module=$module@$staging"
  done
go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@v$version" "k8s.io/kubernetes/cmd/kubectl@v$version"
go mod tidy
