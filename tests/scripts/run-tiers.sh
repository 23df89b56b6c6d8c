#!/usr/bin/env bash
# Runs the workspace's test binaries several at a time, as `cargo test --no-fail-fast` would run
# them one after another: each in its package's directory, with cargo's CARGO and
# CARGO_MANIFEST_DIR, to its end whatever the others do. Most tiers spend their time waiting on
# Cluster API's controllers, on apiservers and on boots, so on a machine of two cores several
# can run side by side; their shared host resources are taken under locks (pod-cluster slots,
# the boot proof's and the image builds' locks, cargo's own build lock).
#
#   tests/scripts/run-tiers.sh LIST
#
# LIST has one line per test binary: NAME, the executable and its package's directory,
# tab-separated (tests/scripts/ci.sh writes it from `cargo test --no-run --message-format=json`).
# The longest tiers start first: their seconds from earlier runs on this machine
# (${BOOTPLATE_CACHE:-~/.cache/bootplate}/tier-seconds.tsv), else an estimate below. The doc
# tests run as one more job (`cargo test --doc`).
#
# Tiers that run the Go tools (needs_tools below) wait for them when BOOTPLATE_TOOLS_ENV names a
# file that does not exist yet: ci.sh writes it (the tools' BOOTPLATE_* variables, NAME=PATH
# lines, or "failed") when tests/scripts/build-tools.sh ends, and the other tiers run meanwhile.
#
# Environment: BOOTPLATE_TEST_JOBS (how many tiers at once, default 3), BOOTPLATE_TEST_LOGS (where
# each tier's output goes, default a new directory under /tmp), BOOTPLATE_STEPS (the step
# table's file, tests/scripts/steps.sh). A tier's output is printed whole when it ends, one tier
# at a time. Exits 1 when any tier failed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/scripts/steps.sh
source "$here/steps.sh"
if (($# != 1)) || [[ ! -f $1 ]]; then
  echo "usage: tests/scripts/run-tiers.sh LIST" >&2
  exit 2
fi
list=$1
jobs=${BOOTPLATE_TEST_JOBS:-3}
logs=${BOOTPLATE_TEST_LOGS:-$(mktemp -d /tmp/bootplate-tiers.XXXXXX)}
mkdir -p "$logs"
cache="${BOOTPLATE_CACHE:-$HOME/.cache/bootplate}"
history="$cache/tier-seconds.tsv"
mkdir -p "$cache"
cargo_path=$(command -v "${CARGO:-cargo}")

# Seconds of a tier with no history here yet (the cold run of 0c875f8, wall; `templates` from a
# warm run, its CPU being more than its wall): the long ones start first, and no long tier is
# left for the end of a cold run.
declare -A estimate=(
  [bootplate-tests::vm]=1268 [bootplate-tests::images]=797 [bootplate-tests::capi]=664
  [bootplate-tests::kubeadm_compat]=628 [bootplate::boot]=486 [bootplate-tests::pod_cluster]=384
  [bootplate-tests::control_plane]=297 [bootplate-tests::controller]=270 [bootplate::templates]=217
  [bootplate-tests::security]=113 [bootplate-tests::inplace_capi]=104 [bootplate-tests::fuzz]=95
  [bootplate-tests::release]=67 [bootplate-tests::docs]=63 [bootplate-tests::operations]=57
  [bootplate-tests::joins]=49 [bootplate::cli]=40 [bootplate::windows]=8
)
declare -A seconds=()
if [[ -f $history ]]; then
  while IFS=$'\t' read -r name secs; do seconds[$name]=$secs; done <"$history"
fi
expected() { echo "${seconds[$1]:-${estimate[$1]:-30}}"; }

# Whether a tier runs the Go tools (kube-apiserver, Cluster API, ...): the integration tests of
# bootplate-tests but the fuzz targets. The others start while the tools still build.
needs_tools() { [[ $1 == bootplate-tests::* && $1 != bootplate-tests::fuzz ]]; }
# With BOOTPLATE_TOOLS_ENV, the tools are still building when this starts: that file appears once
# they are, with their BOOTPLATE_* variables (NAME=PATH lines), or holding "failed".
tools_env=${BOOTPLATE_TOOLS_ENV:-}
tools_ready() { [[ -z $tools_env || -s $tools_env ]]; }

# run_tier NAME EXECUTABLE DIR: one tier, its output to its log; prints what it did.
run_tier() {
  local name=$1 exe=$2 dir=$3 log="$logs/${1//[^A-Za-z0-9_.-]/_}.log" rc=0
  if needs_tools "$name" && [[ -n $tools_env ]]; then
    if [[ $(cat "$tools_env") == failed ]]; then
      echo "not run: the Go tools did not build (tests/scripts/build-tools.sh)" >"$log"
      rc=1
    else
      set -a
      # shellcheck disable=SC1090 # written by ci.sh
      source "$tools_env"
      set +a
    fi
  fi
  if ((rc != 0)); then
    step_row "| test $name" 0 - "not run"
  elif [[ $exe == doc ]]; then
    step "| $name" "$cargo_path" test --workspace --locked --doc >"$log" 2>&1 || rc=$?
  else
    (cd "$dir" && CARGO="$cargo_path" CARGO_MANIFEST_DIR="$dir" step "| test $name" "$exe") \
      >"$log" 2>&1 || rc=$?
  fi
  # One tier's output at a time on the shared output, as cargo test prints it.
  (
    flock 7
    echo "run-tiers: ---- $name ($log)"
    cat "$log"
    if ((rc == 0)); then
      echo "run-tiers: $name passed"
    else
      echo "run-tiers: $name FAILED (rc $rc)"
    fi
  ) 7>"$logs/.print.lock"
  echo "$rc" >"$logs/${1//[^A-Za-z0-9_.-]/_}.rc"
}

# The tiers, longest expected first, then the doc tests.
mapfile -t ordered < <(
  while IFS=$'\t' read -r name exe dir; do
    printf '%s\t%s\t%s\t%s\n' "$(expected "$name")" "$name" "$exe" "$dir"
  done <"$list" | sort -t $'\t' -k1,1nr -k2,2
)
ordered+=($'0\tdoc tests\tdoc\t.')

# Tiers that never run beside each other. The real joins without a network namespace of their
# own (capi's scenario i and fetch, joins) hold the host's kubelet ports alone, and would wait
# for the whole control plane's nodes to end (tests/boot/run.sh's host lock). The VM tier's
# machines are emulated (qemu's TCG: each boot takes a core for minutes, against a time limit),
# so it does not share the machine with the tiers that run many processes of their own.
declare -A apart=(
  [bootplate-tests::control_plane]="bootplate-tests::capi bootplate-tests::joins bootplate-tests::vm"
  [bootplate-tests::vm]="bootplate-tests::pod_cluster"
)
# conflicts A B: whether A and B are kept apart (either way round).
conflicts() { [[ " ${apart[$1]:-} " == *" $2 "* || " ${apart[$2]:-} " == *" $1 "* ]]; }

echo "run-tiers: ${#ordered[@]} tiers, $jobs at a time; logs in $logs"
declare -A running=() # pid -> tier name, or "@tools" for the wait for the tools
waiting=0              # 1 while that wait runs (it holds no job slot)
queue=("${ordered[@]}")
while ((${#queue[@]} || ${#running[@]})); do
  # Start the longest queued tiers that conflict with none running (and have their tools), while
  # there is room.
  for i in "${!queue[@]}"; do
    ((${#running[@]} - waiting < jobs)) || break
    IFS=$'\t' read -r _ name exe dir <<<"${queue[i]}"
    needs_tools "$name" && ! tools_ready && continue
    clash=""
    for other in "${running[@]}"; do conflicts "$name" "$other" && clash=$other; done
    [[ -z $clash ]] || continue
    run_tier "$name" "$exe" "$dir" &
    running[$!]=$name
    unset 'queue[i]'
  done
  queue=("${queue[@]}")
  # A job that ends when the tools are built wakes the loop up for the tiers that need them.
  if ((!waiting)) && ! tools_ready; then
    (while ! tools_ready; do sleep 2; done) &
    running[$!]="@tools"
    waiting=1
  fi
  ((${#running[@]})) || continue
  wait -n -p ended || true
  if [[ -n ${ended:-} ]]; then
    [[ ${running[$ended]} != "@tools" ]] || waiting=0
    unset "running[$ended]"
  fi
done

# What this run took, for the next run's order (a tier that did not run keeps its figure).
failed=()
for line in "${ordered[@]}"; do
  IFS=$'\t' read -r _ name _ _ <<<"$line"
  [[ $(cat "$logs/${name//[^A-Za-z0-9_.-]/_}.rc" 2>/dev/null) == 0 ]] || failed+=("$name")
done
if [[ -n ${BOOTPLATE_STEPS:-} && -f $BOOTPLATE_STEPS ]]; then
  awk -F '\t' '$1 ~ /^\| test / { sub(/^\| test /, "", $1); print $1 "\t" $2 }' "$BOOTPLATE_STEPS" |
    while IFS=$'\t' read -r name secs; do seconds[$name]=$secs; echo "$name"$'\t'"$secs"; done >"$history.new"
  # Keep the figures of tiers this run did not time.
  for name in "${!seconds[@]}"; do
    grep -q "^$name"$'\t' "$history.new" || printf '%s\t%s\n' "$name" "${seconds[$name]}" >>"$history.new"
  done
  mv "$history.new" "$history"
fi
if ((${#failed[@]})); then
  echo "run-tiers: ${#failed[@]} tier(s) failed: ${failed[*]}"
  exit 1
fi
echo "run-tiers: every tier passed"
