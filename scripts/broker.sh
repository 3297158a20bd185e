#!/usr/bin/env bash
# Local Apache Kafka broker (KRaft, one node acting as broker and controller) for the tests, the
# benchmarks and the demo. The jars come from Maven Central through testbed/kafka/pom.xml.
#
#   scripts/broker.sh install              resolve the broker's jars into .cache/ unless present
#   scripts/broker.sh start DIR [TOPIC..]  start on free loopback ports, create the topics, print
#                                          the address; pid, ports, data and log live in DIR
#   scripts/broker.sh join DIR PRIMARY     start a second broker (broker role only, node 2) in the
#                                          cluster of the broker started in PRIMARY, on a free
#                                          loopback port; print its address
#   scripts/broker.sh resume DIR           start again, as it was, the broker DIR holds
#   scripts/broker.sh stop DIR             stop it (SIGTERM, then SIGKILL after 15 s)
#   scripts/broker.sh kafka-class DIR CLASS ARGS..
#                                          run one of Kafka's own tools (e.g. AclCommand) on
#                                          the broker's classpath
#
# Environment for `start`:
#   PARTITIONS       partitions of each TOPIC (default 3)
#   ADVERTISED_PORT  port to advertise to clients instead of the listener's (a test's proxy)
#   BROKER_PORT      listener port (default: a free one)
#   BROKER_SASL      "1": SASL/PLAIN on the client listener with the StandardAuthorizer; users
#                    admin/admin (super user) and relay/relay (only what ACLs grant)
#   BROKER_EXTRA     more server.properties lines, appended last
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib.sh
source "$root/scripts/lib.sh"
testbed=$root/testbed/kafka
version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$testbed/pom.xml")
home=$root/.cache/kafka-$version

install() {
  local stamp
  stamp=$(stamp_of "$testbed/pom.xml")
  stamped "$home" "$stamp" && return 0
  command -v java >/dev/null || { echo "broker.sh: java (17 or later) is required" >&2; exit 1; }
  command -v mvn >/dev/null || { echo "broker.sh: mvn is required" >&2; exit 1; }
  echo "resolving Apache Kafka $version from Maven Central" >&2
  rm -rf "$home"
  maven_copy "$testbed/pom.xml" "$home/libs" -DincludeScope=runtime
  echo "$stamp" >"$home/stamp"
}

java_opts() {
  echo "-Xms128m -Xmx512m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true" \
    "-Dlog4j2.configurationFile=$testbed/log4j2.properties"
}

# Runs one of Kafka's classes in the foreground.
kafka_class() {
  local class=$1; shift
  # shellcheck disable=SC2046
  java $(java_opts) -cp "$home/libs/*" "$class" "$@"
}

# Client settings for the tools when the listener wants SASL.
admin_config() {
  local dir=$1
  if [[ -f $dir/admin.properties ]]; then
    echo "--command-config" "$dir/admin.properties"
  fi
}

start() {
  local dir=$1; shift
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  install
  local port cport advertised
  port=${BROKER_PORT:-$(free_port)}
  cport=$(free_port)
  advertised=${ADVERTISED_PORT:-$port}
  sed -e "s|@PORT@|$port|g" -e "s|@CPORT@|$cport|g" -e "s|@DIR@|$dir|g" \
    -e "/^advertised.listeners=/s|:$port\$|:$advertised|" \
    "$testbed/server.properties" >"$dir/server.properties"
  if [[ ${BROKER_SASL:-} == 1 ]]; then
    sed -e "s|@PORT@|$port|g" -e "s|@CPORT@|$cport|g" -e "s|@ADVERTISED@|$advertised|g" \
      "$testbed/sasl.properties" >>"$dir/server.properties"
    printf '%s\n' 'security.protocol=SASL_PLAINTEXT' 'sasl.mechanism=PLAIN' \
      'sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin";' \
      >"$dir/admin.properties"
  fi
  [[ -n ${BROKER_EXTRA:-} ]] && printf '%s\n' "$BROKER_EXTRA" >>"$dir/server.properties"
  run_node "$dir" "$port" "$(python3 -c 'import base64, uuid; print(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))')"
  local topic
  for topic in "$@"; do
    # shellcheck disable=SC2046
    kafka_class org.apache.kafka.tools.TopicCommand --bootstrap-server "127.0.0.1:$port" \
      $(admin_config "$dir") --create --if-not-exists --topic "$topic" \
      --partitions "${PARTITIONS:-3}" --replication-factor 1 >>"$dir/broker.log" 2>&1
  done
  echo "127.0.0.1:$advertised"
}

# Formats DIR's storage for CLUSTER_ID unless done, starts the node of DIR/server.properties and
# waits until it says it started; its pid and PORT are left in DIR.
run_node() {
  local dir=$1 port=$2 cluster_id=$3
  if [[ ! -f $dir/data/meta.properties ]]; then
    # `=`: an id may begin with a dash.
    kafka_class kafka.tools.StorageTool format --cluster-id="$cluster_id" -c "$dir/server.properties" \
      >"$dir/format.log" 2>&1 || { cat "$dir/format.log" >&2; exit 1; }
  fi
  # A restart appends to the same log: wait for a start line after those already there.
  local before now
  before=$(grep -c "Kafka Server started" "$dir/broker.log" 2>/dev/null || true)
  # setsid: the broker outlives the shell that started it, until `stop`.
  # shellcheck disable=SC2046
  setsid java $(java_opts) -cp "$home/libs/*" kafka.Kafka "$dir/server.properties" \
    >>"$dir/broker.log" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$dir/broker.pid"
  echo "$port" >"$dir/broker.port"
  # Ready once the server says so: the listener opens before the controller quorum is up.
  local started=
  for _ in $(seq 1 600); do
    now=$(grep -c "Kafka Server started" "$dir/broker.log" 2>/dev/null || true)
    if ((${now:-0} > ${before:-0})); then
      started=1
      break
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if [[ -z $started ]]; then
    echo "broker.sh: the broker did not start; its log:" >&2
    tail -50 "$dir/broker.log" >&2
    exit 1
  fi
}

# A second broker, node 2 with the broker role only, in the cluster PRIMARY's node controls.
join() {
  local dir=$1 primary=$2
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  primary=$(cd "$primary" && pwd)
  install
  local port voters cluster_id
  port=${BROKER_PORT:-$(free_port)}
  voters=$(sed -n 's/^controller.quorum.voters=//p' "$primary/server.properties")
  cluster_id=$(sed -n 's/^cluster.id=//p' "$primary/data/meta.properties")
  sed -e "s|@PORT@|$port|g" -e "s|@DIR@|$dir|g" \
    -e "s|^process.roles=.*|process.roles=broker|" -e "s|^node.id=.*|node.id=2|" \
    -e "s|^controller.quorum.voters=.*|controller.quorum.voters=$voters|" \
    -e "s|^listeners=.*|listeners=PLAINTEXT://127.0.0.1:$port|" \
    "$testbed/server.properties" >"$dir/server.properties"
  [[ -n ${BROKER_EXTRA:-} ]] && printf '%s\n' "$BROKER_EXTRA" >>"$dir/server.properties"
  run_node "$dir" "$port" "$cluster_id"
  echo "127.0.0.1:$port"
}

stop() {
  stop_pid "$1/broker.pid" 15
}

cmd=${1:-}; shift || true
case $cmd in
  install) install ;;
  start) start "$@" ;;
  join) join "$@" ;;
  resume) install; run_node "$1" "$(cat "$1/broker.port")" "" ;;
  stop) stop "$@" ;;
  kafka-class) dir=$1; shift; install; kafka_class "$@" $(admin_config "$dir") ;;
  *) echo "usage: $0 install | start DIR [TOPIC..] | join DIR PRIMARY | resume DIR | stop DIR | kafka-class DIR CLASS ARGS.." >&2; exit 2 ;;
esac
