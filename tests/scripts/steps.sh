# The step table of a test run: sourced by tests/scripts/ci.sh and the scripts it runs, which
# append one row per step to the file named by BOOTPLATE_STEPS (tab-separated: step, seconds of
# wall time, seconds of CPU or "-", result, and the second of the run it started at, counted from
# BOOTPLATE_RUN_STARTED, epoch seconds, or "-"). `steps_table` prints it, so every CI log ends with
# where its minutes went and which steps ran beside which.

# step_row NAME SECONDS CPU RESULT [STARTED]: appends a row (nothing when BOOTPLATE_STEPS is unset,
# as when a script runs on its own). One short write per row: rows of steps run side by side do
# not mix.
step_row() {
  [[ -n ${BOOTPLATE_STEPS:-} ]] || return 0
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${5:--}" >>"$BOOTPLATE_STEPS"
}

# The second of the run now (since BOOTPLATE_RUN_STARTED), or "-" outside a run.
run_second() {
  if [[ -n ${BOOTPLATE_RUN_STARTED:-} ]]; then
    echo $(($(date +%s) - BOOTPLATE_RUN_STARTED))
  else
    echo -
  fi
}

# step NAME COMMAND...: runs COMMAND, appends its row (wall seconds, CPU seconds of the command
# and every process it waited for, ok or "failed (rc N)") and returns its status.
step() {
  local name=$1 started=$SECONDS at rc=0 cpu_file cpu
  shift
  at=$(run_second)
  cpu_file=$(mktemp)
  # `times` in the subshell: the CPU of the processes it waited for, the command's whole tree.
  ("$@"; status=$?; times >"$cpu_file"; exit "$status") || rc=$?
  cpu=$(awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%.0f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$cpu_file")
  rm -f "$cpu_file"
  if ((rc == 0)); then
    step_row "$name" $((SECONDS - started)) "${cpu:--}" ok "$at"
  else
    step_row "$name" $((SECONDS - started)) "${cpu:--}" "failed (rc $rc)" "$at"
  fi
  return "$rc"
}

# steps_table [TOTAL_SECONDS]: the table, in the order the steps ended (wall, CPU, from which
# second of the run to which), then the total and the CPU of every step summed, against the
# cores the run had.
steps_table() {
  [[ -s ${BOOTPLATE_STEPS:-} ]] || return 0
  echo
  echo "== steps (wall and CPU seconds, from and to the run's second; | ran beside others) =="
  printf '%-46s %9s %9s %11s  %s\n' step wall cpu from-to result
  awk -F '\t' '{
    span = ($5 == "" || $5 == "-") ? "-" : $5 "-" $5 + $2
    printf "%-46s %7s s %7s s %11s  %s\n", $1, $2, $3, span, $4
  }' "$BOOTPLATE_STEPS"
  if [[ -n ${1:-} ]]; then
    printf '%-46s %7s s\n' "whole run" "$1"
    # Nested steps (indented: a Go tool inside build-tools.sh) are inside their parent's CPU.
    awk -F '\t' -v total="$1" -v cores="$(nproc)" '$1 !~ /^ / && $3 ~ /^[0-9]+$/ { cpu += $3 }
      END { printf "%-46s %7s s %7d s  (%d cores: %d%% busy)\n", "CPU of the steps", "", cpu, cores,
        total ? 100 * cpu / (cores * total) : 0 }' "$BOOTPLATE_STEPS"
  fi
}
