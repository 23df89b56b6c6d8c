# syntax=docker/dockerfile:1
# bootplate's controller image: one statically linked binary on distroless/static, run as the
# non-root user 65532 (the UID deploy/manager/manager.yaml sets). Build from the repository root:
#   docker build -t ghcr.io/bootplate/bootplate:v0.1.0 .
# The binary is built for the platform the build stage runs on (amd64 or arm64; add
# --platform to build the other one under emulation).

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
# musl-tools: musl-gcc for the C parts of dependencies (ring), so the binary links statically.
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    set -eux; \
    target="$(uname -m)-unknown-linux-musl"; \
    rustup target add "$target"; \
    export "CC_$(uname -m)_unknown_linux_musl=musl-gcc"; \
    cargo build --release --locked -p bootplate --bin bootplate --target "$target"; \
    cp "target/$target/release/bootplate" /bootplate

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /bootplate /usr/local/bin/bootplate
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/bootplate"]
CMD ["run"]
