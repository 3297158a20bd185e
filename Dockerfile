# syntax=docker/dockerfile:1
# watchrelay: OpenSSL and zlib linked in, on a distroless runtime (glibc, CA certificates, no
# shell, no package manager), run as an unprivileged user. Base images are pinned by digest;
# update the digest with the tag.

FROM rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS build
WORKDIR /src
# Dependencies first, so source changes do not rebuild them.
COPY Cargo.toml Cargo.lock ./
COPY sim/Cargo.toml sim/Cargo.toml
RUN mkdir -p src sim/src/bin benches examples \
 && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
 && touch sim/src/lib.rs && echo 'fn main() {}' > sim/src/bin/watchrelay-sim.rs \
 && echo 'fn main() {}' > benches/throughput.rs && echo 'fn main() {}' > examples/tail.rs \
 && cargo build --release --locked -p watchrelay --features static \
 && rm -rf src sim/src
COPY src src
COPY sim/src sim/src
RUN touch src/main.rs src/lib.rs \
 && cargo build --release --locked -p watchrelay --features static --bin watchrelay

FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f
COPY --from=build /src/target/release/watchrelay /usr/local/bin/watchrelay
USER 65532:65532
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/watchrelay"]
CMD ["run", "--config", "/etc/watchrelay/config.yaml"]
