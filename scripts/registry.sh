#!/usr/bin/env bash
# Local Apicurio Registry 3 (schema registry) for the tests: the registry's own Quarkus build, from
# Maven Central through testbed/registry/pom.xml, with its default storage (SQL on in-memory H2:
# every start begins empty, nothing is kept across a stop).
#
#   scripts/registry.sh install      unpack the registry into .cache/ unless present
#   scripts/registry.sh start DIR    start on free loopback ports, wait until it is ready, print
#                                    its base URL (http://127.0.0.1:PORT; the APIs are under
#                                    /apis: /apis/registry/v3, /apis/ccompat/v7); pid, ports and
#                                    log live in DIR
#   scripts/registry.sh stop DIR     stop it (SIGTERM, then SIGKILL after 15 s)
#
# The registry's own classes are built for Java 21: `start` runs it with the first of REGISTRY_JAVA,
# $JAVA_HOME/bin/java, `java` and the JDKs under /usr/lib/jvm that is 21 or later.
#
# Environment for `start`:
#   REGISTRY_JAVA    the java to run it with
#   REGISTRY_PORT    HTTP port (default: a free one)
#   REGISTRY_OPTS    more JVM options, last, e.g. -Dapicurio.ccompat.legacy-id-mode.enabled=true
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib.sh
source "$root/scripts/lib.sh"
testbed=$root/testbed/registry
version=$(sed -n 's:.*<apicurio.version>\(.*\)</apicurio.version>.*:\1:p' "$testbed/pom.xml")
home=$root/.cache/apicurio-registry-$version

install() {
  local stamp
  stamp=$(stamp_of "$testbed/pom.xml")
  stamped "$home" "$stamp" && return 0
  command -v java >/dev/null || { echo "registry.sh: java (17 or later) is required" >&2; exit 1; }
  command -v mvn >/dev/null || { echo "registry.sh: mvn is required" >&2; exit 1; }
  echo "resolving Apicurio Registry $version from Maven Central" >&2
  rm -rf "$home"
  # -DskipExternalRepos: the registry's parent POM adds two repositories outside Maven Central
  # unless it is set.
  maven_copy "$testbed/pom.xml" "$home/dist" -DskipExternalRepos
  mkdir -p "$home/quarkus-app"
  tar xzf "$home/dist/apicurio-registry-app-$version-all.tar.gz" -C "$home/quarkus-app"
  rm -rf "$home/dist"
  echo "$stamp" >"$home/stamp"
}

# Prints a java of release 21 or later, or fails.
registry_java() {
  local candidate release
  for candidate in "${REGISTRY_JAVA:-}" "${JAVA_HOME:+$JAVA_HOME/bin/java}" "$(command -v java || true)" \
    /usr/lib/jvm/*/bin/java; do
    [[ -n $candidate && -x $candidate ]] || continue
    release=$("$candidate" -XshowSettings:properties -version 2>&1 |
      sed -n 's/^ *java.specification.version = \([0-9]*\).*/\1/p')
    if [[ -n $release && $release -ge 21 ]]; then
      echo "$candidate"
      return 0
    fi
  done
  echo "registry.sh: Apicurio Registry $version needs Java 21 or later (set REGISTRY_JAVA)" >&2
  return 1
}

java_opts() {
  echo "-Xms64m -Xmx384m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true"
}

start() {
  local dir=$1
  mkdir -p "$dir/tmp"
  dir=$(cd "$dir" && pwd)
  install
  local java port mport
  java=$(registry_java)
  port=${REGISTRY_PORT:-$(free_port)}
  mport=$(free_port)
  # The management interface (health, metrics) has a port of its own, 9000 unless told.
  # setsid: the registry outlives the shell that started it, until `stop`.
  # shellcheck disable=SC2046,SC2086
  setsid "$java" $(java_opts) -Djava.io.tmpdir="$dir/tmp" \
    -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$port" \
    -Dquarkus.management.host=127.0.0.1 -Dquarkus.management.port="$mport" \
    ${REGISTRY_OPTS:-} -jar "$home/quarkus-app/quarkus-run.jar" \
    >>"$dir/registry.log" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$dir/registry.pid"
  echo "$port" >"$dir/registry.port"
  echo "$mport" >"$dir/registry.management-port"
  # Ready once the readiness check passes (storage initialised) and the API answers.
  local ready=
  for _ in $(seq 1 1200); do
    if curl -fsS -o /dev/null "http://127.0.0.1:$mport/health/ready" 2>/dev/null &&
      curl -fsS -o /dev/null "http://127.0.0.1:$port/apis/registry/v3/system/info" 2>/dev/null; then
      ready=1
      break
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if [[ -z $ready ]]; then
    echo "registry.sh: the registry did not start; its log:" >&2
    tail -50 "$dir/registry.log" >&2
    exit 1
  fi
  echo "http://127.0.0.1:$port"
}

stop() {
  stop_pid "$1/registry.pid" 15
}

cmd=${1:-}; shift || true
case $cmd in
  install) install ;;
  start) start "$@" ;;
  stop) stop "$@" ;;
  *) echo "usage: $0 install | start DIR | stop DIR" >&2; exit 2 ;;
esac
