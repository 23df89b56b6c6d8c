#!/usr/bin/env bash
# The whole test suite, as CI runs it on a fresh machine: installs what the tests need
# (idempotent, cached), checks formatting and lints, then runs every test, including the
# integration tests against a real kube-apiserver + etcd and the real Cluster API manager.
set -euo pipefail
cd "$(dirname "$0")/../.."

# A clean clone compiles everything once: incremental state would only add gigabytes of disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# One cargo target directory for every clone on this machine, kept with the other caches: the
# dependencies (debug, clippy, the static release and the agent profile) compile once per
# Cargo.lock and toolchain, and cargo's own fingerprints decide what is stale. The workspace's
# crates still build from this clone's sources. Past 40 GiB (clones at many paths, old
# toolchains) it starts over.
if [[ -z ${CARGO_TARGET_DIR:-} ]]; then
  export CARGO_TARGET_DIR="$HOME/.cache/bootplate/cargo-target"
  mkdir -p "$CARGO_TARGET_DIR"
  if (($(du -s --block-size=1G "$CARGO_TARGET_DIR" | cut -f1) > 40)); then
    rm -rf "$CARGO_TARGET_DIR" && mkdir -p "$CARGO_TARGET_DIR"
  fi
fi

tests/scripts/install-tools.sh
# kube-apiserver, etcd, kubeadm, the kubelet, kube-scheduler, kube-proxy, kubectl, Cluster API
# and clusterctl, built from their Go modules (cached).
tools=$(tests/scripts/build-tools.sh)
echo "$tools"
# Each tool's path as BOOTPLATE_<NAME> (capitals, '-' as '_'), as tests/src/tools.rs reads it.
for name in kube-apiserver etcd etcdctl kube-controller-manager kube-scheduler kube-proxy \
  kubeadm kubelet kubectl capi-manager capi-manager-oldest clusterctl cabpk-manager registry \
  crictl ignition-spec2 cert-manager-manifest; do
  path=$(sed -n "s/^$name=//p" <<<"$tools")
  if [[ -z $path ]]; then
    echo "ci.sh: tests/scripts/build-tools.sh printed no $name=PATH line" >&2
    exit 1
  fi
  export "BOOTPLATE_$(tr 'a-z-' 'A-Z_' <<<"$name")=$path"
done

cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# --no-fail-fast: a failing tier does not hide how the others fare.
cargo test --workspace --locked --no-fail-fast
