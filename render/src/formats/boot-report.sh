# bootplate boot reporter (docs/boot-channel.md). Sourced by the bootstrap commands: it
# records when each part starts and ends and the first failing step, and sends that, with the
# redacted end of the step's output, to the workload cluster's apiserver with this machine's
# bootstrap token, into the one ConfigMap that token may write. A report that cannot be sent is
# dropped: reporting never fails the boot.
BOOTPLATE_REPORT_STATE=/run/bootplate-boot
BOOTPLATE_REPORT_PART=
BOOTPLATE_REPORT_PART_START=
BOOTPLATE_REPORT_STEP=
BOOTPLATE_REPORT_FROM=0
BOOTPLATE_REPORT_SENT=0

# bootplate_report_start: state directory, output copied into a log, the exit trap. When any
# of that cannot be set up (no curl, no writable /run), the boot goes on without reports.
bootplate_report_start() {
  BOOTPLATE_REPORT_STARTED=$(date +%s)
  if ! bootplate_report_setup; then
    echo "bootplate: boot reports are off on this machine (no curl, or no state directory)" >&2
    # shellcheck disable=SC2317 # called by the commands that follow
    bootplate_step() { :; }
    # shellcheck disable=SC2317
    bootplate_report_done() { :; }
    return 0
  fi
  exec 8>&1 9>&2
  tee -a "$BOOTPLATE_REPORT_STATE/log" < "$BOOTPLATE_REPORT_STATE/out" >&8 &
  BOOTPLATE_REPORT_TEE=$!
  exec > "$BOOTPLATE_REPORT_STATE/out" 2>&1
  trap 'bootplate_report_exit $?' EXIT
}

# Called in a condition: a failing command returns instead of ending the boot.
bootplate_report_setup() {
  command -v curl > /dev/null 2>&1 || return 1
  (umask 077 && mkdir -p "$BOOTPLATE_REPORT_STATE") || return 1
  : > "$BOOTPLATE_REPORT_STATE/parts" || return 1
  : > "$BOOTPLATE_REPORT_STATE/log" || return 1
  bootplate_report_secrets > "$BOOTPLATE_REPORT_STATE/redact" || return 1
  printf 'Authorization: Bearer %s\n' "$BOOTPLATE_REPORT_TOKEN" > "$BOOTPLATE_REPORT_STATE/auth" \
    || return 1
  rm -f "$BOOTPLATE_REPORT_STATE/out"
  mkfifo "$BOOTPLATE_REPORT_STATE/out"
}

# bootplate_step PART KIND INDEX: the next step; a new part ends the one before.
bootplate_step() {
  if [ "$1" != "$BOOTPLATE_REPORT_PART" ]; then
    bootplate_report_end_part
    BOOTPLATE_REPORT_PART=$1
    BOOTPLATE_REPORT_PART_START=$(date +%s)
    bootplate_report_send running || true
  fi
  BOOTPLATE_REPORT_STEP="$2 $3"
  BOOTPLATE_REPORT_FROM=$(wc -l < "$BOOTPLATE_REPORT_STATE/log")
}

bootplate_report_end_part() {
  if [ -n "$BOOTPLATE_REPORT_PART" ]; then
    printf 'part %s %s %s\n' "$BOOTPLATE_REPORT_PART_START" "$(date +%s)" \
      "$BOOTPLATE_REPORT_PART" >> "$BOOTPLATE_REPORT_STATE/parts"
  fi
  BOOTPLATE_REPORT_PART=
}

# bootplate_report_done: every step succeeded.
bootplate_report_done() {
  bootplate_report_end_part
  bootplate_report_stop_log
  trap - EXIT
  bootplate_report_send 'done' || true
  rm -f "$BOOTPLATE_REPORT_STATE/auth" "$BOOTPLATE_REPORT_STATE/redact"
}

bootplate_report_exit() {
  bootplate_report_stop_log
  if [ "$1" -ne 0 ]; then
    BOOTPLATE_REPORT_STATUS=$1
    bootplate_report_send failed || true
  fi
  rm -f "$BOOTPLATE_REPORT_STATE/auth" "$BOOTPLATE_REPORT_STATE/redact"
}

# Back to the original output, and a moment for the copy to take the last lines (not longer:
# a program a step left running in the background may hold the pipe open).
bootplate_report_stop_log() {
  exec 1>&8 2>&9
  waited=0
  while kill -0 "$BOOTPLATE_REPORT_TEE" 2> /dev/null && [ "$waited" -lt 20 ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
}

# bootplate_report_send STATE: running (at most one per interval), failed or done.
bootplate_report_send() {
  now=$(date +%s)
  if [ "$1" = running ] && [ $((now - BOOTPLATE_REPORT_SENT)) -lt "$BOOTPLATE_REPORT_INTERVAL" ]; then
    return 0
  fi
  BOOTPLATE_REPORT_SENT=$now
  report=$(bootplate_report_text "$1" "$now" | head -c 12288 | base64 | tr -d '\n')
  # The whole object, applied: the first report creates it when bootplate did not.
  printf '{"apiVersion":"v1","kind":"ConfigMap","metadata":%s,"data":{"report":"%s"}}' \
    "$BOOTPLATE_REPORT_META" "$report" > "$BOOTPLATE_REPORT_STATE/body"
  curl -sS --fail -o /dev/null --max-time 10 --retry 2 --cacert "$BOOTPLATE_REPORT_CA" \
    -X PATCH -H "@$BOOTPLATE_REPORT_STATE/auth" \
    -H 'Content-Type: application/apply-patch+yaml' \
    --data-binary "@$BOOTPLATE_REPORT_STATE/body" \
    "$BOOTPLATE_REPORT_SERVER/api/v1/namespaces/$BOOTPLATE_REPORT_NAMESPACE/configmaps/$BOOTPLATE_REPORT_NAME?fieldManager=bootplate-boot-report&force=true" \
    || echo "bootplate: the boot report could not be sent" >&2
}

# bootplate_report_text STATE NOW: the report (docs/boot-channel.md, "The report").
bootplate_report_text() {
  printf 'bootplate-boot-report 1\nstate %s\nstarted %s\ntime %s\n' "$1" "$BOOTPLATE_REPORT_STARTED" "$2"
  cat "$BOOTPLATE_REPORT_STATE/parts"
  if [ -n "$BOOTPLATE_REPORT_PART" ]; then
    printf 'part %s - %s\n' "$BOOTPLATE_REPORT_PART_START" "$BOOTPLATE_REPORT_PART"
  fi
  if [ "$1" = failed ]; then
    printf 'failed %s %s %s\ntail\n' "$BOOTPLATE_REPORT_STEP" "$BOOTPLATE_REPORT_STATUS" \
      "$BOOTPLATE_REPORT_PART"
    tail -n "+$((BOOTPLATE_REPORT_FROM + 1))" "$BOOTPLATE_REPORT_STATE/log" | tail -n 40 \
      | awk -v secrets="$BOOTPLATE_REPORT_STATE/redact" "$BOOTPLATE_REPORT_REDACT"
  fi
}

# The redaction of the tail, after terminal escape sequences are removed: every listed secret,
# PEM blocks, words that look random (16 or more characters with a letter and a digit) and the
# word after one that names a secret; each line cut to 240 characters.
# shellcheck disable=SC2016 # an awk program, not shell
BOOTPLATE_REPORT_REDACT='
BEGIN { while ((getline s < secrets) > 0) if (length(s) >= 4) list[++n] = s }
{
  line = $0
  # Terminal escapes first: a colour code glued to a word would make it look random.
  gsub(/\033\[[0-9;?]*[A-Za-z]/, "", line); gsub(/\033[()][A-Za-z0-9]/, "", line); gsub(/\033/, "", line)
  for (i = 1; i <= n; i++) {
    while ((at = index(line, list[i])) > 0)
      line = substr(line, 1, at - 1) "[redacted]" substr(line, at + length(list[i]))
  }
  if (pem) { if (line ~ /-----END/) pem = 0; print "[redacted]"; next }
  if (line ~ /-----BEGIN/) { pem = 1; sub(/-----BEGIN.*/, "[redacted]", line) }
  out = ""; named = 0
  while (match(line, /[^] \t=:,;"`()<>{}[]+/)) {
    word = substr(line, RSTART, RLENGTH)
    out = out substr(line, 1, RSTART - 1)
    if (word != "redacted" && (named || (length(word) >= 16 && word ~ /[A-Za-z]/ && word ~ /[0-9]/))) word = "[redacted]"
    lower = tolower(word)
    named = (lower ~ /(^|[-_.])(token|password|passwd|secret|key|credentials?|bearer|authorization|apikey|auth)$/)
    out = out word
    line = substr(line, RSTART + RLENGTH)
  }
  print substr(out line, 1, 240)
}'
