#!/usr/bin/env bash
# Builds one of the workspace's binaries as it ships: one statically linked file for the host's
# Linux architecture. Prints the binary's path on its last line (cargo's output goes to stderr).
#
#   scripts/build-static.sh PACKAGE BINARY PROFILE
#   scripts/build-static.sh bootplate bootplate release          # the controller (image, release)
#   scripts/build-static.sh bootplate-agent bootplate-agent agent # the node agent (agent/build.sh)
#
# The C library is glibc, linked in (`-C target-feature=+crt-static`): no other target or
# toolchain to install, and the binary runs on any Linux of that architecture, on an empty
# image base too. The explicit --target keeps RUSTFLAGS off build scripts and proc macros, and
# the output apart from the host build: target/<triple>/<profile>/<binary>.
set -euo pipefail
cd "$(dirname "$0")/.."
if (($# != 3)); then
  echo "usage: scripts/build-static.sh PACKAGE BINARY PROFILE" >&2
  exit 2
fi
package=$1 binary=$2 profile=$3
cargo=${CARGO:-cargo}
triple=$(rustc -vV | sed -n 's/^host: //p')
case "$triple" in
  *-unknown-linux-gnu) ;;
  *) echo "scripts/build-static.sh: builds on a *-unknown-linux-gnu host only, not $triple" >&2; exit 2 ;;
esac
# Built as it ships, by rustc itself: not through a wrapper such as the test run's clippy-driver.
unset RUSTC_WORKSPACE_WRAPPER
# Nor with the variables cargo sets for a test that runs this (the images and release tiers do):
# build scripts that track one of them (ring's tracks CARGO_MANIFEST_DIR) would see it change
# between a build from a tier and one from ci.sh, and cargo would rebuild them and every crate
# above them (ring, rustls, kube, the workspace) in both profiles on every run.
for name in $(compgen -e); do
  case $name in
    CARGO_MANIFEST_* | CARGO_PKG_* | CARGO_BIN_* | CARGO_CRATE_NAME | CARGO_PRIMARY_PACKAGE | \
      CARGO_TARGET_TMPDIR | CARGO_RUSTC_CURRENT_DIR) unset "$name" ;;
  esac
done
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
  "$cargo" build --locked --profile "$profile" -p "$package" --bin "$binary" --target "$triple" >&2
target=$("$cargo" metadata --format-version 1 --no-deps --locked |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
echo "$target/$triple/$profile/$binary"
