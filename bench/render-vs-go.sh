#!/usr/bin/env bash
# Render peer benchmark: bootplate's handlebars engine against Go's text/template on the same
# kubeadm cloud-config (render/benches/kubeadm.yaml and its twin bench/go/render/kubeadm.tmpl),
# with the same data. Runs both programs alternately for ROUNDS rounds of ITERATIONS renders
# each, checks the outputs are byte-identical, and prints the median rates and the ratio
# ours / Go (> 1: bootplate is faster). Not part of the test command: run it by hand.
#
#   bench/render-vs-go.sh                 # worker, 5 rounds of 20000 renders
#   ROLES="worker init" ROUNDS=7 ITERATIONS=50000 bench/render-vs-go.sh
#
# Needs Go (the machine's `go`, 1.26). Standard library only.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${ROUNDS:-5}
ITERATIONS=${ITERATIONS:-20000}
ROLES=${ROLES:-worker}
GO=${GO:-go}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)," \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "versions: $(rustc --version), $("$GO" version)"

cargo build --quiet --release -p bootplate-bench --bin render-bench --manifest-path "$ROOT/Cargo.toml"
RUST_BIN="$ROOT/target/release/render-bench"
# A go.mod without requirements, no proxy: nothing outside the standard library can come in.
(cd "$ROOT/bench/go/render" && GOFLAGS= GOPROXY=off GO111MODULE=on "$GO" build -o "$WORK/go-render" .)
GO_BIN="$WORK/go-render"
TEMPLATE="$ROOT/bench/go/render/kubeadm.tmpl"

field() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p"; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

for role in $ROLES; do
  "$RUST_BIN" data --role "$role" > "$WORK/$role.json"
  : > "$WORK/rust.txt"
  : > "$WORK/go.txt"
  run_rust() { "$RUST_BIN" render --role "$role" --iterations "$ITERATIONS" --output "$WORK/rust.out" | tee -a "$WORK/rust.txt"; }
  run_go() { "$GO_BIN" -data "$WORK/$role.json" -template "$TEMPLATE" -iterations "$ITERATIONS" -output "$WORK/go.out" | tee -a "$WORK/go.txt"; }
  echo "--- role $role: $ROUNDS rounds of $ITERATIONS renders, alternating which goes first"
  for round in $(seq 1 "$ROUNDS"); do
    if (( round % 2 )); then run_rust; run_go; else run_go; run_rust; fi
  done
  if cmp -s "$WORK/rust.out" "$WORK/go.out"; then
    echo "outputs: byte-identical ($(wc -c < "$WORK/rust.out") bytes, sha256 $(sha256sum < "$WORK/rust.out" | cut -c1-16))"
  else
    echo "outputs DIFFER:"
    diff "$WORK/rust.out" "$WORK/go.out" | head -20
    exit 1
  fi
  rust_rate=$(field per_sec < "$WORK/rust.txt" | median)
  go_rate=$(field per_sec < "$WORK/go.txt" | median)
  rust_cpu=$(field per_cpu_sec < "$WORK/rust.txt" | median)
  go_cpu=$(field per_cpu_sec < "$WORK/go.txt" | median)
  awk -v r="$rust_rate" -v g="$go_rate" -v rc="$rust_cpu" -v gc="$go_cpu" -v role="$role" 'BEGIN {
    printf "role %s: renders per second (median, wall clock): bootplate %.0f, Go %.0f, ratio ours/Go %.2f\n", role, r, g, r / g
    printf "role %s: renders per CPU second (median, process CPU incl. Go GC threads): bootplate %.0f, Go %.0f, ratio ours/Go %.2f\n", role, rc, gc, rc / gc
  }'
done
