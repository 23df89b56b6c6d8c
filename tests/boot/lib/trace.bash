# Read by bash before a script the boot proof runs (BASH_ENV): records every command whose
# failure bash notices (the ERR trap: the commands `set -e` stops at, also inside functions and
# subshells) to /run/bootplate/errors as `STATUS<TAB>DEPTH<TAB>FILE<TAB>LINE<TAB>COMMAND`, where
# DEPTH is 0 for a statement of the script itself. Nothing else changes: bash restores $? after
# the trap, and the programs the script starts do not read this file (BASH_ENV is unset here).
unset BASH_ENV
set -E
__bootplate_err() {
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$((BASH_SUBSHELL + ${#FUNCNAME[@]} - 2))" \
    "${BASH_SOURCE[1]:-$0}" "$2" "${BASH_COMMAND//[$'\t\n']/ }" >>/run/bootplate/errors
}
trap '__bootplate_err "$?" "$LINENO"' ERR
