#!/usr/bin/env bash
# Prints the path of a Python that has cloudbase-init 1.1.9 and its dependencies
# (tests/windows/requirements.txt, every package pinned), for tests/windows/harness.py.
#
# The virtual environment is made once per digest of the pinned requirements and of the host's
# Python, under ${BOOTPLATE_CACHE:-~/.cache/bootplate}/cloudbase-init/DIGEST, and reused after
# (`.complete` marks a finished one; an unfinished one is made again). Concurrent callers wait
# on a lock. pip installs the pinned set with --no-deps: no resolution, the same packages on
# every machine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache="${BOOTPLATE_CACHE:-$HOME/.cache/bootplate}"
python=${PYTHON:-python3}
digest=$({
  cat "$here/requirements.txt"
  "$python" -c 'import sys; print(sys.version)'
} | sha256sum | cut -c1-16)
venv="$cache/cloudbase-init/$digest"
if [[ ! -f $venv/.complete ]]; then
  mkdir -p "$cache/cloudbase-init"
  exec 9>"$cache/cloudbase-init/.lock"
  flock 9
  if [[ ! -f $venv/.complete ]]; then
    echo "cloudbase-init.sh: making $venv" >&2
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
      -r "$here/requirements.txt" >&2
    "$venv/bin/python" -c 'import cloudbaseinit.plugins.common.userdata' >&2
    touch "$venv/.complete"
  fi
fi
echo "$venv/bin/python"
