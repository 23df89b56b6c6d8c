# The step table of a test run: sourced by tests/scripts/ci.sh and the scripts it runs, which
# append one row per step to the file named by BOOTPLATE_STEPS (tab-separated: step, seconds of
# wall time, seconds of CPU or "-", result). `steps_table` prints it, so every CI log ends with
# where its minutes went.

# step_row NAME SECONDS CPU RESULT: appends a row (nothing when BOOTPLATE_STEPS is unset, as when a
# script runs on its own). One short write per row: rows of steps run side by side do not mix.
step_row() {
  [[ -n ${BOOTPLATE_STEPS:-} ]] || return 0
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$BOOTPLATE_STEPS"
}

# step NAME COMMAND...: runs COMMAND, appends its row (wall seconds, CPU seconds of the command
# and every process it waited for, ok or "failed (rc N)") and returns its status.
step() {
  local name=$1 started=$SECONDS rc=0 cpu_file cpu
  shift
  cpu_file=$(mktemp)
  # `times` in the subshell: the CPU of the processes it waited for, the command's whole tree.
  ("$@"; status=$?; times >"$cpu_file"; exit "$status") || rc=$?
  cpu=$(awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%.0f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$cpu_file")
  rm -f "$cpu_file"
  if ((rc == 0)); then
    step_row "$name" $((SECONDS - started)) "${cpu:--}" ok
  else
    step_row "$name" $((SECONDS - started)) "${cpu:--}" "failed (rc $rc)"
  fi
  return "$rc"
}

# steps_table [TOTAL_SECONDS]: the table, in the order the steps ended, then the total.
steps_table() {
  [[ -s ${BOOTPLATE_STEPS:-} ]] || return 0
  echo
  echo "== steps (wall and CPU seconds; steps marked | ran beside others) =="
  awk -F '\t' '{ printf "%-46s %7s s %7s s  %s\n", $1, $2, $3, $4 }' "$BOOTPLATE_STEPS"
  if [[ -n ${1:-} ]]; then
    printf '%-46s %7s s\n' "whole run" "$1"
  fi
}
