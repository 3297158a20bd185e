# syntax=docker/dockerfile:1
# watchrelay: OpenSSL and zlib linked in, on a distroless runtime (glibc, CA certificates, no
# shell, no package manager), run as an unprivileged user. Base images are pinned by digest;
# update the digest with the tag.
#
# Build it with BuildKit (the default builder), naming the commit:
#   docker build --build-arg WATCHRELAY_COMMIT="$(git rev-parse HEAD)" -t watchrelay .
#
# Dependency caching: BuildKit cache mounts over cargo's registry and the target directory, with
# the whole source copied. Cargo's own fingerprints decide what to rebuild, so a source change
# rebuilds the watchrelay crate alone, and the Dockerfile names no crate target: adding or
# removing a bench, test or example needs no change here. (The older scheme, stub sources under
# a copied manifest, broke whenever Cargo.toml declared a target the stubs lacked; cargo-chef
# would fix that too, at the cost of a planner stage and a tool to install and pin.) The cache
# lives on the builder, not in the image's layers; a CI without a persistent builder exports
# it (e.g. --cache-to type=local) or builds cold.
#
# Keep this stage's RUN lines to paths relative to WORKDIR and write what the runtime stage
# copies under WORKDIR: scripts/check-image.py replays the stage on a scratch copy of the build
# context, without a container.

FROM rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS build
# The commit `watchrelay version` reports (build.rs); `unknown` when not given, since the build
# context has no .git.
ARG WATCHRELAY_COMMIT=
WORKDIR /src
COPY . .
# The binary is copied out of the cache-mounted target directory, which the next stage cannot see,
# without the debug info the release profile keeps for profiling (109 MB here, 21 MB without).
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p watchrelay --features static --bin watchrelay \
 && mkdir -p out && objcopy --strip-debug target/release/watchrelay out/watchrelay

FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f
ARG WATCHRELAY_COMMIT=
LABEL org.opencontainers.image.title="watchrelay" \
      org.opencontainers.image.description="Relays Kubernetes watch streams into Kafka topics" \
      org.opencontainers.image.source="https://github.com/watchrelay/watchrelay" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.revision="${WATCHRELAY_COMMIT}"
COPY --from=build /src/out/watchrelay /usr/local/bin/watchrelay
USER 65532:65532
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/watchrelay"]
CMD ["run", "--config", "/etc/watchrelay/config.yaml"]
