#!/usr/bin/env bash
# The whole test suite, as CI runs it on a fresh machine: installs what the tests need
# (idempotent, cached), checks formatting and lints, then runs every test, including the
# integration tests against a real kube-apiserver + etcd and the real Cluster API manager.
#
# Where the minutes go: the Rust side (fmt, then the test build, which runs clippy's lints too)
# compiles while the Go tools build (each has serial stretches, links and the largest packages,
# that the other fills), then
# the test binaries run several at a time (tests/scripts/run-tiers.sh), and the run ends with a
# table of its steps, wall and CPU seconds each (tests/scripts/steps.sh). docs/testing.md has the
# figures. Every step runs to its end whatever another did; the exit status says whether all
# passed.
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tests/scripts/steps.sh
source tests/scripts/steps.sh

# A clean clone compiles everything once: incremental state would only add gigabytes of disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# One cargo target directory for every clone on this machine, kept with the other caches: the
# dependencies (debug, the static release and the agent profile) compile once per
# Cargo.lock and toolchain, and cargo's own fingerprints decide what is stale. The workspace's
# crates build from this clone's sources; tests/scripts/source-mtimes.py gives the files whose
# content the last run had that run's times, so cargo rebuilds only the crates whose sources
# changed (a fresh clone otherwise rebuilt every workspace crate in all three profiles, about
# 550 s of CPU in a warm run). That is sound while only these runs build into this directory:
# build elsewhere (CARGO_TARGET_DIR) by hand. Past 40 GiB (clones at many paths, old
# toolchains) it starts over.
if [[ -z ${CARGO_TARGET_DIR:-} ]]; then
  export CARGO_TARGET_DIR="$HOME/.cache/bootplate/cargo-target"
  mkdir -p "$CARGO_TARGET_DIR"
  if (($(du -s --block-size=1G "$CARGO_TARGET_DIR" | cut -f1) > 40)); then
    rm -rf "$CARGO_TARGET_DIR" && mkdir -p "$CARGO_TARGET_DIR"
  fi
  tests/scripts/source-mtimes.py "$CARGO_TARGET_DIR/bootplate-source-mtimes.tsv"
fi

# Clippy's lints run inside the test build: clippy-driver compiles the workspace's crates, as
# `cargo clippy` runs it (RUSTC_WORKSPACE_WRAPPER), so the dependencies are compiled once for
# both instead of once more for clippy's check (a cold clippy took 467 s of CPU beside a test
# build of 340). Every cargo of the run (the test build, the doc tests, the docs tier's
# `cargo run`) sees the same wrapper, so none rebuilds the workspace's crates;
# scripts/build-static.sh drops it (a release build as it ships). Lints warn, the tiers run,
# and the run fails at its end when any warning was printed (clippy's `-D warnings`).
RUSTC_WORKSPACE_WRAPPER=$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver) || {
  echo "ci.sh: clippy-driver not found (rustup component add clippy)" >&2
  exit 1
}
export RUSTC_WORKSPACE_WRAPPER

logs=$(mktemp -d /tmp/bootplate-ci.XXXXXX)
export BOOTPLATE_STEPS="$logs/steps.tsv" BOOTPLATE_TEST_LOGS="$logs/tiers"
: >"$BOOTPLATE_STEPS"
run_started=$SECONDS
BOOTPLATE_RUN_STARTED=$(date +%s)
export BOOTPLATE_RUN_STARTED
trap 'steps_table $((SECONDS - run_started)); echo "ci.sh: logs in $logs"' EXIT
log() { echo "ci.sh: $*" >&2; }

# The Rust side, in the background: fmt reports and the run goes on; the test build (every target:
# the benchmark runs once as a test) writes its artifact list and diagnostics as JSON lines,
# which name the test binaries and its warnings. Returns non-zero when fmt or the test build
# failed.
rust_side() {
  local rc=0
  step "| cargo fmt --check" cargo fmt --all --check || rc=1
  step "| cargo test --no-run (with clippy)" cargo test --workspace --all-targets --locked \
    --no-run --message-format=json >"$logs/artifacts.json" || rc=1
  return "$rc"
}
rust_side >"$logs/rust-side.log" 2>&1 &
rust_pid=$!
# The static release binary (the controller's image, the release tier) and the node agent's
# build, in the background. With no release build cached (a cold run) it starts with the run: a
# release build of every dependency is minutes of CPU, and the first half hour (crates, Go
# modules and Debian packages downloading; Go's links) leaves a core idle for a third of it;
# started after the test build it ran from minute 28 to minute 57 and held up the images and
# release tiers. Started with the run it is niced (10): it takes the cores the downloads leave
# idle and yields to the Go builds and the test build, which every tier waits for (at full
# priority it held the tiers' start back to minute 31 of a 62-minute cold run, 1 129 s of CPU
# of its own), then takes what the tiers leave idle while they wait on apiservers and boots.
# With one cached it only recompiles the workspace's crates, and starts once the test build is
# done, at full priority. Its profiles' build directories are not the test build's, so cargo's
# build lock does not serialize the two; the tiers that need these binaries wait on that lock.
static_build() {
  step "| static release and agent builds" nice -n "$1" bash -c \
    'scripts/build-static.sh bootplate bootplate release && agent/build.sh' >"$logs/static.log" 2>&1
}
triple=$(rustc -vV | sed -n 's/^host: //p')
static_cached=0
[[ -x $CARGO_TARGET_DIR/$triple/release/bootplate ]] && static_cached=1
((static_cached)) || static_build 10 &

failed=0
step "install-tools.sh" tests/scripts/install-tools.sh || { log "installing the tools failed"; exit 1; }
# The boot proof's Debian root and the VM image (mostly package downloads) build while the Go
# tools compile, instead of inside the first tier that needs them; each is cached and locked, so
# a tier that starts first waits for it.
step "| boot root and VM image" bash -c 'tests/boot/build-root.sh && tests/vm/build-image.sh' \
  >"$logs/images.log" 2>&1 &
# cloudbase-init 1.1.9 in a Python virtual environment, for the Windows tier (its templates are
# read by cloudbase-init's own code): made once per digest of its pinned requirements (seconds
# from pip's cache, under a minute cold), nothing when cached; the tier waits on its lock.
step "| cloudbase-init venv" tests/windows/cloudbase-init.sh >"$logs/cloudbase-init.log" 2>&1 &
# kube-apiserver, etcd, kubeadm, the kubelet, kube-scheduler, kube-proxy, kubectl, Cluster API
# and clusterctl, built from their Go modules (cached), in the background: the tiers that do not
# run them start as soon as the test build is done. Each tool's path becomes BOOTPLATE_<NAME>
# (capitals, '-' as '_'), as tests/src/tools.rs reads it, in the file the tiers that run them
# wait for (tests/scripts/run-tiers.sh), or "failed".
export BOOTPLATE_TOOLS_ENV="$logs/tools.env"
build_tools() {
  local tools name path
  if ! step "build-tools.sh" tests/scripts/build-tools.sh >"$logs/tools.txt"; then
    log "building the tools failed"
    echo failed >"$BOOTPLATE_TOOLS_ENV"
    return 1
  fi
  tools=$(cat "$logs/tools.txt")
  echo "$tools"
  for name in kube-apiserver etcd etcdctl kube-controller-manager kube-scheduler kube-proxy \
    kubeadm kubelet kubectl capi-manager capi-manager-oldest clusterctl cabpk-manager registry \
    crictl ignition-spec2 cert-manager-manifest; do
    path=$(sed -n "s/^$name=//p" <<<"$tools")
    if [[ -z $path ]]; then
      log "tests/scripts/build-tools.sh printed no $name=PATH line"
      echo failed >"$BOOTPLATE_TOOLS_ENV"
      return 1
    fi
    echo "BOOTPLATE_$(tr 'a-z-' 'A-Z_' <<<"$name")=$path"
  done >"$BOOTPLATE_TOOLS_ENV.new"
  mv "$BOOTPLATE_TOOLS_ENV.new" "$BOOTPLATE_TOOLS_ENV"
}
build_tools &
tools_pid=$!

wait "$rust_pid" || failed=1
cat "$logs/rust-side.log"
((!static_cached)) || static_build 0 &
# The test binaries cargo built: name (package::target, or "package (lib)" for unit tests),
# executable, package directory. The compiler's diagnostics (clippy's among them) go to
# lints.txt, printed at the end.
python3 - "$logs/artifacts.json" "$logs/lints.txt" >"$logs/tiers.tsv" <<'EOF'
import json, os, sys
lints, seen = open(sys.argv[2], "w"), set()
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    # A crate built twice (as a dependency and as a test) warns twice: each message once.
    if m.get("reason") == "compiler-message" and m["message"].get("level") in ("warning", "error"):
        if m["message"]["rendered"] not in seen:
            seen.add(m["message"]["rendered"])
            lints.write(m["message"]["rendered"])
    if m.get("reason") != "compiler-artifact" or not m["profile"]["test"] or not m.get("executable"):
        continue
    # package_id: "path+file:///dir#name@version", or "...dir#version" when the name is dir's.
    source, _, fragment = m["package_id"].partition("#")
    package = fragment.split("@")[0] if "@" in fragment else source.rstrip("/").split("/")[-1]
    kind = m["target"]["kind"][0]
    name = m["target"]["name"]
    label = f"{name} ({kind})" if kind in ("lib", "bin") else f"{name}"
    print(f"{package}::{label}\t{m['executable']}\t{os.path.dirname(m['manifest_path'])}")
EOF
if [[ ! -s $logs/tiers.tsv ]]; then
  cat "$logs/lints.txt"
  log "the test build named no test binary (the compiler's messages above, cargo's in rust-side.log)"
  wait "$tools_pid"
  exit 1
fi
# --no-fail-fast, side by side: a failing tier does not hide how the others fare.
tests/scripts/run-tiers.sh "$logs/tiers.tsv" || failed=1
wait "$tools_pid" || failed=1
if [[ -s $logs/lints.txt ]]; then
  cat "$logs/lints.txt"
  log "the compiler and clippy warned (above): fix each, as \`cargo clippy --workspace --all-targets -- -D warnings\` would"
  failed=1
fi
exit "$failed"
