#!/usr/bin/env bash
# The whole test suite, as CI runs it on a fresh machine: installs what the tests need
# (idempotent, cached), checks formatting and lints, then runs every test, including the
# integration tests against a real kube-apiserver + etcd.
set -euo pipefail
cd "$(dirname "$0")/../.."

# A clean clone compiles everything once: incremental state would only add gigabytes of disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

tests/scripts/install-tools.sh
BOOTPLATE_KUBE_APISERVER="$(tests/scripts/build-apiserver.sh)"
export BOOTPLATE_KUBE_APISERVER

cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
