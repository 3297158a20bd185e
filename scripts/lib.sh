# shellcheck shell=bash
# Shared by the scripts; source it from the repository root.

# Prints the directory cargo builds into, as cargo itself resolves it: CARGO_TARGET_DIR,
# build.target-dir in .cargo/config.toml, or the workspace's target/.
target_dir() {
  local metadata
  metadata=$(cargo metadata --format-version 1 --no-deps) || return
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])' <<<"$metadata"
}
