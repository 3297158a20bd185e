#!/usr/bin/env python3
"""Builds the image's binary the way the Dockerfile does, without a container runtime.

Reads the Dockerfile, finds the stage the runtime stage copies from (`COPY --from=NAME`), and
replays that stage's ARG, ENV, WORKDIR, COPY and RUN lines in order on a scratch directory that
holds only what its COPY lines copy from the build context, .dockerignore respected. The RUN lines
run with this machine's toolchain (`nice -n 19 /bin/sh -c`), not the base image's. Then the file
the runtime stage copies must exist, and, run, must print `watchrelay version` with the version
and the commit passed as the build argument WATCHRELAY_COMMIT, and pass `watchrelay check-config`
on the configuration the chart renders (helm must be on PATH).

So a target Cargo.toml declares whose file is not in the context (a removed bench, a directory
.dockerignore leaves out), a COPY of a missing path, or a RUN that does not build fails here as
it would fail `docker build`.

How RUN's `--mount=type=cache` flags are taken: a cache of the image's cargo home
(/usr/local/cargo/...) is this machine's own cargo home, which cargo uses anyway; any other cache
target becomes a symbolic link, for that RUN only, to a directory under the work directory kept
between runs (the target directory: its dependency build is shared between runs). Other mounts
are refused, and so are absolute paths in a RUN's command: the stage keeps to WORKDIR.

What differs from the image build, on purpose (WATCHRELAY_CHECK_IMAGE_PROFILE):
  - `shared`, the default: the stage's cargo build runs with the dev profile (`--release` read as
    `--profile dev`, `target/release/` as `target/debug/`) in the repository's own target
    directory, so everything the test suite compiled already is reused and only what the image's
    features change (OpenSSL and zlib built in, the relay without its test features) is
    compiled: the suite does not build the relay a second time from scratch. The code, the
    features, the lock file and the build context are the image's; only optimisation differs;
  - `fast`: the release profile, overridden through CARGO_PROFILE_RELEASE_* (no LTO, 16 codegen
    units, no debug info), in a target directory of the check's own;
  - `image`: the Dockerfile's own profile;
  - the toolchain is this machine's: a rustc other than the base image's tag is reported;
  - the scratch directory lies under the work directory (the repository's target/ by default),
    so cargo's search for configuration walks up through the repository.

Usage: scripts/check-image.py [--context DIR] [--work DIR]
  --context  the build context and Dockerfile (default: the repository)
  --work     the scratch and cache directory (default: <target dir>/image-check)
"""

import argparse
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath

REPO = Path(__file__).resolve().parent.parent
# The official rust image's CARGO_HOME: caches under it are cargo's own, kept on this machine in
# this machine's cargo home.
IMAGE_CARGO_HOME = "/usr/local/cargo"
FAST_PROFILE = {
    "CARGO_PROFILE_RELEASE_LTO": "false",
    "CARGO_PROFILE_RELEASE_CODEGEN_UNITS": "16",
    "CARGO_PROFILE_RELEASE_DEBUG": "0",
}


class Failure(Exception):
    pass


# --- the Dockerfile -------------------------------------------------------------------------


def instructions(text):
    """(line number, INSTRUCTION, rest) for each instruction: continuations joined, comments and
    parser directives dropped."""
    out, buf, start = [], [], None
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not buf):
            continue
        if start is None:
            start = n
        if line.rstrip().endswith("\\"):
            buf.append(line.rstrip()[:-1])
            continue
        buf.append(line)
        joined = " ".join(part.strip() for part in buf).strip()
        buf = []
        if joined:
            word, _, rest = joined.partition(" ")
            out.append((start, word.upper(), rest.strip()))
        start = None
    return out


def stages(text):
    """The stages in order: each a dict with name, base and its instructions."""
    result = []
    for n, word, rest in instructions(text):
        if word == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) >= 3 and parts[1].lower() == "as" else str(len(result))
            result.append({"name": name, "base": parts[0], "line": n, "body": []})
        elif word == "ARG" and not result:
            continue  # an ARG before the first FROM only feeds FROM lines
        elif not result:
            raise Failure(f"Dockerfile:{n}: {word} before FROM")
        else:
            result[-1]["body"].append((n, word, rest))
    return result


def flags(rest):
    """Leading --flag=value words of an instruction, and the rest."""
    out = []
    while rest.startswith("--"):
        word, _, rest = rest.partition(" ")
        out.append(word)
        rest = rest.lstrip()
    return out, rest


def words(rest):
    """The arguments of COPY-like instructions, in shell or JSON form."""
    if rest.startswith("["):
        return json.loads(rest)
    return shlex.split(rest)


def substitute(text, env):
    return re.sub(
        r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), text
    )


# --- .dockerignore ---------------------------------------------------------------------------


def pattern_regex(pattern):
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
            continue
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            end = pattern.find("]", i)
            if end < 0:
                out += re.escape(c)
            else:
                out += pattern[i : end + 1].replace("[!", "[^")
                i = end
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        else:
            out += re.escape(c)
        i += 1
    return re.compile(out + r"\Z")


class Ignore:
    """.dockerignore as BuildKit reads it: the last pattern that matches a path or one of its
    parent directories decides; `!` makes an exception."""

    def __init__(self, text):
        self.rules = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            pattern = line[1:].strip() if negated else line
            pattern = os.path.normpath(pattern).lstrip("/")
            if pattern == ".":
                pattern = "*"  # a pattern of the context itself
            literal = re.split(r"[*?\[\\]", pattern, maxsplit=1)[0]
            self.rules.append((negated, pattern_regex(pattern), literal))

    def excluded(self, rel):
        parts = rel.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        result = False
        for negated, regex, _ in self.rules:
            if any(regex.match(p) for p in prefixes):
                result = not negated
        return result

    def may_include_under(self, rel):
        """Whether an exception might bring back something under the excluded directory rel."""
        return any(
            negated
            and (not literal or literal.startswith(rel + "/") or (rel + "/").startswith(literal))
            for negated, _, literal in self.rules
        )


def context_files(context):
    """The build context: relative paths of the files .dockerignore keeps."""
    ignore_file = context / ".dockerignore"
    ignore = Ignore(ignore_file.read_text() if ignore_file.exists() else "")
    kept = []
    for root, dirs, files in os.walk(context):
        rel_root = os.path.relpath(root, context)
        rel_root = "" if rel_root == "." else rel_root
        keep_dirs = []
        for d in sorted(dirs):
            rel = f"{rel_root}/{d}" if rel_root else d
            if not ignore.excluded(rel) or ignore.may_include_under(rel):
                keep_dirs.append(d)
        dirs[:] = keep_dirs
        for f in sorted(files):
            rel = f"{rel_root}/{f}" if rel_root else f
            if not ignore.excluded(rel):
                kept.append(rel)
    return kept


# --- replaying the stage ---------------------------------------------------------------------


class Replay:
    def __init__(self, context, work, build_args, profile, shared_target=None):
        self.context = context
        self.files = context_files(context)
        self.root = work / "root"
        self.caches = work / "cache"
        self.workdir = PurePosixPath("/")
        self.env = {}
        self.build_args = build_args
        self.profile = profile
        self.shared_target = shared_target
        self.times = []
        if self.root.exists():
            shutil.rmtree(self.root)
        self.root.mkdir(parents=True)
        self.caches.mkdir(parents=True, exist_ok=True)

    def host(self, path):
        """This machine's path of the stage's path (absolute, or relative to WORKDIR)."""
        p = self.workdir / PurePosixPath(path)
        return self.root / str(p).lstrip("/")

    def run(self, stage):
        for n, word, rest in stage["body"]:
            where = f"Dockerfile:{n}"
            if word == "ARG":
                name, eq, default = rest.partition("=")
                value = self.build_args.get(name, default if eq else "")
                self.env[name] = value
            elif word == "ENV":
                if "=" in rest.split()[0]:
                    for item in shlex.split(rest):
                        k, _, v = item.partition("=")
                        self.env[k] = substitute(v, self.env)
                else:
                    k, _, v = rest.partition(" ")
                    self.env[k] = substitute(v.strip(), self.env)
            elif word == "WORKDIR":
                self.workdir = self.workdir / substitute(rest, self.env)
                self.host(".").mkdir(parents=True, exist_ok=True)
            elif word == "COPY":
                self.copy(where, rest)
            elif word == "RUN":
                self.run_line(where, rest)
            elif word in ("LABEL", "EXPOSE", "USER", "ENTRYPOINT", "CMD", "STOPSIGNAL"):
                continue
            else:
                raise Failure(f"{where}: the check cannot replay {word} in the build stage")

    def copy(self, where, rest):
        """COPY as Docker does it: a directory's contents go into the destination, a file goes
        to it (or into it, when it is a directory: a trailing slash or several sources)."""
        opts, rest = flags(rest)
        if any(o.startswith("--from") for o in opts):
            raise Failure(f"{where}: COPY --from in the build stage is not replayed")
        *sources, dest = [substitute(a, self.env) for a in words(rest)]
        to_dir = dest.endswith("/") or len(sources) > 1 or self.host(dest).is_dir()
        target = self.host(dest)
        files = set(self.files)
        dirs = {"/".join(f.split("/")[:i]) for f in self.files for i in range(len(f.split("/")))}
        for src in sources:
            src = os.path.normpath(src).lstrip("/")
            src = "" if src == "." else src
            regex = pattern_regex(src)
            entries = sorted(p for p in files | dirs if regex.match(p)) if src else [""]
            if not entries:
                raise Failure(
                    f"{where}: COPY {src}: not in the build context (missing, or left out by .dockerignore)"
                )
            for entry in entries:
                if entry in files:
                    pairs = [(entry, target / Path(entry).name if to_dir else target)]
                else:
                    under = [f for f in self.files if not entry or f.startswith(entry + "/")]
                    pairs = [(f, target / f[len(entry) :].lstrip("/")) for f in under]
                for f, dst in pairs:
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(self.context / f, dst, follow_symlinks=False)

    def run_line(self, where, rest):
        opts, command = flags(rest)
        links = []
        for opt in opts:
            key, _, value = opt.partition("=")
            if key == "--mount":
                spec = dict(kv.partition("=")[::2] for kv in value.split(","))
                if spec.get("type") != "cache":
                    raise Failure(f"{where}: only --mount=type=cache is replayed, not {value}")
                target = spec.get("target") or spec.get("dst") or spec.get("destination")
                absolute = str(self.workdir / target)
                if absolute == IMAGE_CARGO_HOME or absolute.startswith(IMAGE_CARGO_HOME + "/"):
                    continue  # cargo's own cache: this machine's cargo home
                if self.shared_target and PurePosixPath(absolute) == self.workdir / "target":
                    shared = self.shared_target  # the suite's own build directory
                else:
                    shared = self.caches / re.sub(r"[^\w.-]+", "_", absolute.strip("/"))
                shared.mkdir(parents=True, exist_ok=True)
                at = self.host(target)
                if at.is_symlink() or at.is_file():
                    at.unlink()
                elif at.exists():
                    shutil.rmtree(at)
                at.parent.mkdir(parents=True, exist_ok=True)
                at.symlink_to(shared, target_is_directory=True)
                links.append(at)
            elif key in ("--network", "--security"):
                continue
            else:
                raise Failure(f"{where}: RUN {key} is not replayed")
        if self.shared_target and "cargo build" in command:
            command = re.sub(r"(?<=\s)--release(?=\s)", "--profile dev", command)
            command = command.replace("target/release/", "target/debug/")
        if command.startswith("["):
            argv = json.loads(command)
        else:
            outside = [
                p
                for p in re.findall(r"(?:^|[\s=:'\"(<>])(/[^\s'\";|&)<>]*)", command)
                if p != "/dev/null"
            ]
            if outside:
                raise Failure(
                    f"{where}: RUN names {', '.join(outside)}: the build stage must keep to paths relative to WORKDIR"
                )
            argv = ["/bin/sh", "-c", command]
        env = dict(os.environ)
        for var in ("CARGO_TARGET_DIR", "CARGO_BUILD_TARGET_DIR"):
            env.pop(var, None)
        env.update(self.env)
        if self.profile == "fast":
            env.update(FAST_PROFILE)
        started = time.monotonic()
        print(f"== {where}: RUN {command[:100]}{'...' if len(command) > 100 else ''}", flush=True)
        done = subprocess.run(["nice", "-n", "19", *argv], cwd=self.host("."), env=env)
        for at in links:
            at.unlink()
        self.times.append((where, time.monotonic() - started))
        if done.returncode != 0:
            raise Failure(f"{where}: RUN failed (exit {done.returncode})")


# --- the binary ------------------------------------------------------------------------------


def rendered_config(work):
    out = subprocess.run(
        ["helm", "template", "watchrelay", str(REPO / "charts/watchrelay"), "--namespace", "watchrelay",
         "--set", "config.clusterName=my-cluster", "--set", "config.kafka.bootstrapServers=kafka:9092"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    import yaml

    for doc in yaml.safe_load_all(out):
        if doc and doc.get("kind") == "ConfigMap" and "config.yaml" in doc.get("data", {}):
            path = work / "chart-config.yaml"
            path.write_text(doc["data"]["config.yaml"])
            return path
    raise Failure("the chart rendered no ConfigMap with config.yaml")


def cargo_version(context):
    text = (context / "Cargo.toml").read_text()
    package = text.split("[package]", 1)[1]
    return re.search(r'^version\s*=\s*"([^"]+)"', package, re.M).group(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=Path, default=REPO)
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    context = args.context.resolve()
    if args.work:
        work = args.work.resolve()
    else:
        target = os.environ.get("CARGO_TARGET_DIR") or str(REPO / "target")
        work = Path(target).resolve() / "image-check"
    work.mkdir(parents=True, exist_ok=True)

    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip() or "0000000000000000000000000000000000000000"
    profile = os.environ.get("WATCHRELAY_CHECK_IMAGE_PROFILE", "shared")
    if profile not in ("shared", "fast", "image"):
        raise Failure(f"WATCHRELAY_CHECK_IMAGE_PROFILE={profile}: shared, fast or image")
    target = os.environ.get("CARGO_TARGET_DIR") or str(REPO / "target")
    shared_target = Path(target).resolve() if profile == "shared" else None

    all_stages = stages((context / "Dockerfile").read_text())
    runtime = all_stages[-1]
    copies = []
    for n, word, rest in runtime["body"]:
        if word == "COPY":
            opts, rest = flags(rest)
            source = [o.partition("=")[2] for o in opts if o.startswith("--from=")]
            if source:
                copies.append((n, source[0], words(rest)))
    if not copies:
        raise Failure("the runtime stage copies nothing from a build stage")
    build_name = copies[0][1]
    build = next((s for s in all_stages if s["name"] == build_name), None)
    if build is None:
        raise Failure(f"no stage named {build_name}")

    rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.split()
    tag = re.search(r"rust:(\d+\.\d+)", build["base"])
    if tag and rustc and not rustc[1].startswith(tag.group(1) + "."):
        print(f"note: the image builds with rust {tag.group(1)}, this machine has {rustc[1]}")
    started = time.monotonic()
    replay = Replay(context, work, {"WATCHRELAY_COMMIT": commit}, profile, shared_target)
    how = {
        "shared": f"; the dev profile, in {shared_target}",
        "fast": "; release profile: " + " ".join(f"{k}={v}" for k, v in FAST_PROFILE.items()),
        "image": "",
    }[profile]
    print(
        f"== replaying stage {build_name} ({build['base'].split('@')[0]}) on {len(replay.files)} context files{how}",
        flush=True,
    )
    replay.run(build)
    built = time.monotonic() - started

    binary = None
    for n, _, argv in copies:
        *sources, _dest = argv
        for src in sources:
            path = replay.root / src.lstrip("/")
            if not path.exists():
                raise Failure(f"Dockerfile:{n}: the build stage left no {src}")
            if path.name == "watchrelay":
                binary = path
    if binary is None:
        raise Failure("the runtime stage copies no watchrelay binary")
    if not os.stat(binary).st_mode & stat.S_IXUSR:
        raise Failure(f"{binary.name} is not executable")

    out = subprocess.run([str(binary), "version"], capture_output=True, text=True, check=True).stdout
    want = f"watchrelay {cargo_version(replay.host('.'))}\ncommit: {commit}\n"
    if out != want:
        raise Failure(f"`watchrelay version` printed {out!r}, not {want!r}")
    config = rendered_config(work)
    subprocess.run([str(binary), "check-config", str(config)], check=True, stdout=subprocess.DEVNULL)
    for where, seconds in replay.times:
        print(f"   {where}: {seconds:.0f} s")
    size = binary.stat().st_size
    print(
        f"== image build stage: {built:.0f} s, binary {size / 1048576:.1f} MiB; version and the chart's configuration check out"
    )


if __name__ == "__main__":
    try:
        main()
    except (Failure, subprocess.CalledProcessError) as e:
        print(f"image check failed: {e}", file=sys.stderr)
        sys.exit(1)
