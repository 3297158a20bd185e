# syntax=docker/dockerfile:1
# watchrelay: a static-ish Rust binary on a slim Debian runtime, run as an unprivileged user.

FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends libssl-dev pkg-config zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Dependencies first, so source changes do not rebuild them.
COPY Cargo.toml Cargo.lock ./
COPY sim/Cargo.toml sim/Cargo.toml
RUN mkdir -p src sim/src/bin benches examples \
 && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
 && touch sim/src/lib.rs && echo 'fn main() {}' > sim/src/bin/watchrelay-sim.rs \
 && echo 'fn main() {}' > benches/throughput.rs && echo 'fn main() {}' > examples/tail.rs \
 && cargo build --release --locked -p watchrelay \
 && rm -rf src sim/src
COPY src src
COPY sim/src sim/src
RUN touch src/main.rs src/lib.rs && cargo build --release --locked -p watchrelay --bin watchrelay

FROM debian:12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/watchrelay /usr/local/bin/watchrelay
USER 65532:65532
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/watchrelay"]
CMD ["run", "--config", "/etc/watchrelay/config.yaml"]
