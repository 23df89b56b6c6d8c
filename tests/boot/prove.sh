#!/usr/bin/env bash
# The boot proof of templates: renders each template for every role it supports at two
# Kubernetes versions with `bootplate render`, runs each user-data through real cloud-init or
# real Ignition in a throw-away Debian root (tests/boot/run.sh), and checks what it did.
#
#   tests/boot/prove.sh [OPTIONS] [TEMPLATE.yaml...]      (default: templates/*.yaml)
#
#   --bin FILE        the bootplate binary (default: $BOOTPLATE_BIN, else `cargo build` it)
#   --config FILE     a BootplateConfig (variables, files, commands) for every render (default:
#                     tests/boot/fixtures/configs/<template>.yaml when it exists, else none)
#   --versions "V.."  Kubernetes versions (default: "v1.30.4 v1.31.2": kubeadm's configuration
#                     API is v1beta3 below 1.31 and v1beta4 from 1.31 on)
#   --out DIR         where each case's user-data, report and logs go (default: target/boot-proof)
#   --jobs N          cases run at once (default: twice the number of CPUs)
#
# A template that runs `kubeadm init` or `kubeadm join` is rendered for the roles init, control-plane-join and worker at
# each version; any other template is a plain machine: role worker, a Machine without a version.
# Runs as root (chroot, mounts, namespaces). The first run builds the Debian root (about a
# minute, network needed); later runs reuse it from ~/.cache/bootplate/boot.
#
# Prints one line per case and, for a failed case, each failure as
# `boot-proof: TEMPLATE role ROLE VERSION: FAILED: STEP: MESSAGE`; DIR/summary.json lists the
# cases. Exit status: 0 every case proven, 1 a case failed, 2 the proof could not run.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
fixtures=$here/fixtures
bin=${BOOTPLATE_BIN:-}
config=""
versions="v1.30.4 v1.31.2"
out=$repo/target/boot-proof
jobs=$((2 * $(nproc 2>/dev/null || echo 1)))
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
while (($#)); do
  case "$1" in
    --bin) bin=${2-}; shift 2 ;;
    --config) config=${2-}; shift 2 ;;
    --versions) versions=${2-}; shift 2 ;;
    --out) out=${2-}; shift 2 ;;
    --jobs) jobs=${2-}; shift 2 ;;
    -h | --help) usage ;;
    --) shift; break ;;
    -*) usage ;;
    *) break ;;
  esac
done
die() { echo "boot-proof: ERROR: $*" >&2; exit 2; }

templates=("$@")
if ((${#templates[@]} == 0)); then
  for t in "$repo"/templates/*.yaml; do
    grep -qE '^kind: *(Cluster)?BootstrapTemplate *$' "$t" && templates+=("$t")
  done
fi
((${#templates[@]})) || die "no templates to prove"
for t in "${templates[@]}"; do [[ -f $t ]] || die "no template file $t"; done
[[ -z $config || -f $config ]] || die "no config file $config"
if [[ -z $bin ]]; then
  cargo build -q -p bootplate --manifest-path "$repo/Cargo.toml" >&2 || die "cargo build -p bootplate failed"
  bin=$(cargo metadata -q --format-version 1 --no-deps --manifest-path "$repo/Cargo.toml" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/debug/bootplate
fi
[[ -x $bin ]] || die "no bootplate binary at $bin"
# Build (or find) the root once, before the cases start in parallel.
"$here/build-root.sh" >/dev/null || die "the Debian root could not be prepared (messages above)"

mkdir -p "$out"
out=$(cd "$out" && pwd)

# The cases: TEMPLATE, ROLE, VERSION, MACHINE and DIR, separated by $sep (not a tab: read
# would merge the tabs around an empty version).
sep=$'\x1f'
cases=()
for t in "${templates[@]}"; do
  name=$(basename "$t" .yaml)
  if grep -qE 'kubeadm (init|join)' "$t"; then
    for version in $versions; do
      for role in init control-plane-join worker; do
        kind=worker
        [[ $role != worker ]] && kind=control-plane
        machine=$fixtures/machine-$kind-$version.yaml
        if [[ ! -f $machine ]]; then
          # A version without a fixture: the fixture of the first version, version replaced.
          machine=$out/.machines/machine-$kind-$version.yaml
          mkdir -p "$out/.machines"
          sed "s/^  version: .*/  version: $version/" "$fixtures/machine-$kind-v1.31.2.yaml" >"$machine"
        fi
        cases+=("$t$sep$role$sep$version$sep$machine$sep$out/$name/$role-$version")
      done
    done
  else
    cases+=("$t${sep}worker$sep$sep$fixtures/machine-plain.yaml$sep$out/$name/worker")
  fi
done

prove_case() {
  local template=$1 role=$2 version=$3 machine=$4 dir=$5 label start status=0 os
  label="$(basename "$template" .yaml) role $role${version:+ $version}"
  start=$(date +%s.%N)
  rm -rf "$dir"
  mkdir -p "$dir"
  local render=("$bin" render --template "$template" --machine "$machine" --cluster "$fixtures/cluster.yaml"
    --role "$role" --token abcdef.0123456789abcdef --output "$dir/user-data")
  local case_config=$config
  [[ -z $case_config && -f $fixtures/configs/$(basename "$template") ]] &&
    case_config=$fixtures/configs/$(basename "$template")
  [[ -n $case_config ]] && render+=(--config "$case_config")
  if ! "${render[@]}" 2>"$dir/render.log"; then
    status=1
    while IFS= read -r line; do
      printf 'boot-proof: %s: FAILED: render: %s\n' "$label" "$line"
    done <"$dir/render.log" >"$dir/failures.log"
  else
    # spec.os.name, for the root's stand-ins of that OS family.
    os=$(awk '/^  os:/ { in_os = 1; next } in_os && /^    name:/ { gsub(/["'"'"']/, "", $2); print $2; exit }
      /^  [^ ]/ { in_os = 0 }' "$template")
    "$here/run.sh" --user-data "$dir/user-data" --out "$dir/run" --label "$label" --role "$role" \
      --kubernetes-version "$version" --os "$os" 2>"$dir/failures.log" || status=$?
  fi
  local seconds
  seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  printf '%s\t%s\t%s\n' "$status" "$seconds" "$case_config" >"$dir/status"
  if ((status == 0)); then
    printf 'ok      %s (%s s)\n' "$label" "$seconds"
  else
    printf 'FAILED  %s (%s s)\n' "$label" "$seconds"
    cat "$dir/failures.log" >&2
  fi
}

start=$(date +%s.%N)
running=0
for c in "${cases[@]}"; do
  IFS=$sep read -r template role version machine dir <<<"$c"
  prove_case "$template" "$role" "$version" "$machine" "$dir" &
  running=$((running + 1))
  if ((running >= jobs)); then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

python3 - "$out/summary.json" "$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')" "${cases[@]}" <<'PY'
import json, sys
path, seconds, cases = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
summary = {"seconds": seconds, "cases": []}
for c in cases:
    template, role, version, machine, d = c.split("\x1f")
    try:
        status, took, config = open(f"{d}/status").read().rstrip("\n").split("\t")
    except (FileNotFoundError, ValueError):
        status, took, config = "2", "0", ""
    summary["cases"].append({"template": template, "role": role, "version": version, "machine": machine,
                             "config": config, "dir": d, "status": int(status), "seconds": float(took)})
json.dump(summary, open(path, "w"), indent=1)
failed = [c for c in summary["cases"] if c["status"] != 0]
print(f"boot-proof: {len(summary['cases']) - len(failed)} of {len(summary['cases'])} cases proven in {seconds:.0f} s"
      + (f"; {len(failed)} failed" if failed else ""))
sys.exit(2 if any(c["status"] >= 2 for c in failed) else 1 if failed else 0)
PY
