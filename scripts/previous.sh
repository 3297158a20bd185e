#!/usr/bin/env bash
# Builds the relay as released in 0.1.0, from this repository's own history, for the test of a
# rolling upgrade with replicas of both versions side by side; prints the binary's path.
# Built once into .cache/previous/ (its own target directory: the old crate must not overwrite
# this one's binary).
set -euo pipefail
cd "$(dirname "$0")/.."

# The commit 0.1.0 was released from (CHANGELOG.md: 0.1.0, 2026-11-26).
REV=0bdebecb84f62ea5940c27e104b7224b99025df5
root=.cache/previous
out=$root/0.1.0
if [[ -x $out/watchrelay && $(cat "$out/rev" 2>/dev/null) == "$REV" ]]; then
  echo "$PWD/$out/watchrelay"
  exit 0
fi
if ! git cat-file -e "$REV^{commit}" 2>/dev/null; then
  # A shallow clone: fetch the commit, or the history, from where it was cloned.
  git fetch --quiet origin "$REV" 2>/dev/null || git fetch --quiet --unshallow 2>/dev/null || true
fi
if ! git cat-file -e "$REV^{commit}" 2>/dev/null; then
  echo "previous.sh: commit $REV is not in this clone and could not be fetched: clone the history" >&2
  exit 1
fi
src=$root/src-0.1.0
rm -rf "$src" "$out"
mkdir -p "$src" "$out"
git archive "$REV" | tar -x -C "$src"
cargo build --locked --quiet --bin watchrelay --manifest-path "$src/Cargo.toml" \
  --target-dir "$root/target" >&2
cp "$root/target/debug/watchrelay" "$out/watchrelay"
echo "$REV" >"$out/rev"
rm -rf "$src"
echo "$PWD/$out/watchrelay"
