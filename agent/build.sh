#!/usr/bin/env bash
# Builds bootplate-agent as it ships: one statically linked file for the host's Linux
# architecture, with the `agent` profile of the workspace (size over speed, LTO, no unwinding,
# stripped). Prints the binary's path on its last line.
#
#   agent/build.sh
#
# The C library is glibc, linked in (`-C target-feature=+crt-static`): no other target or
# toolchain to install, and the binary runs on any Linux of that architecture (docs/in-place.md
# says what that means for host name lookups). The explicit --target keeps RUSTFLAGS off build
# scripts and proc macros, and the output apart from the host build:
# target/<triple>/agent/bootplate-agent.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo=${CARGO:-cargo}
triple=$(rustc -vV | sed -n 's/^host: //p')
case "$triple" in
  *-unknown-linux-gnu) ;;
  *) echo "agent/build.sh: builds on a *-unknown-linux-gnu host only, not $triple" >&2; exit 2 ;;
esac
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
  "$cargo" build --locked --profile agent -p bootplate-agent --target "$triple" >&2
target=$("$cargo" metadata --format-version 1 --no-deps --locked |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
echo "$target/$triple/agent/bootplate-agent"
