#!/usr/bin/env bash
# Builds bootplate-agent as it ships: one statically linked file for the host's Linux
# architecture, with the `agent` profile of the workspace (size over speed, LTO, no unwinding,
# stripped). Prints the binary's path on its last line.
#
#   agent/build.sh
#
# scripts/build-static.sh does the build (glibc linked in, the host triple as --target: the
# binary lands in target/<triple>/agent/bootplate-agent); docs/in-place.md says what a static
# glibc means for host name lookups.
set -euo pipefail
exec "$(dirname "$0")/../scripts/build-static.sh" bootplate-agent bootplate-agent agent
