#!/usr/bin/env bash
# The boot proof of one rendered user-data: executes it with real cloud-init (cloud-config,
# script, MIME) or real Ignition (Debian's 2.14 for a config of spec 3.x, v0.35.0 from
# BOOTPLATE_IGNITION_SPEC2 for spec 2.x) in a fresh copy of the cached Debian root, in namespaces of its
# own, and checks what it did (tests/boot/lib/check.py).
#
#   tests/boot/run.sh --user-data FILE --out DIR [--label TEXT] [--role ROLE]
#                     [--kubernetes-version VERSION] [--os NAME] [--real-kube DIR]
#                     [--netns NAME] [--cgroup NAME] [--image ARCHIVE]... [--hold]
#                     [--cni-subnet CIDR]
#
# DIR is emptied; DIR/report.json is the report (files, units, steps, stub calls, kubeadm
# configurations, users, hostname, sentinel, failures), DIR/stages.log and DIR/cloud-init*.log
# the programs' output, DIR/run a copy of the run's /run. With --role and --kubernetes-version,
# a user-data that runs kubeadm must run `kubeadm init` (role init) or `kubeadm join` with a
# configuration file, in the configuration API of that version. --os names the OS the template
# targets (its spec.os.name): the root gets stand-ins for what that family's images have and a
# Debian root lacks (for rocky, rhel, almalinux, centos, fedora, amazonlinux: /etc/yum.repos.d,
# /etc/dnf, /etc/sysconfig, /etc/pki/rpm-gpg and an SELinux config; for flatcar, the units of
# containerd, docker and ntpd and the groups docker and wheel; for kubeadm-image, an image made
# for the kubeadm bootstrap provider: the units of the kubelet and containerd).
#
# --real-kube DIR: a real join. DIR holds the real `kubeadm` and `kubelet`; they run instead of
# the stubs, with the host's containerd and runc, in the host's network namespace (the kubelet
# reaches the cluster on loopback), and services start as processes (lib/inside.sh says what
# else the root gets). One real run at a time per machine without --netns: the kubelet's ports
# and cgroups are the host's. The kernel settings the kubelet changes are put back when the last
# real run ends, and the cgroups it made (without --netns) removed.
#
# A node of a whole control plane (with --real-kube): --netns NAME runs the machine in that
# network namespace (/run/netns/NAME, made by the caller: its own address, and a default route,
# which `kubeadm init` picks its advertise address from) instead of the host's; each --image
# ARCHIVE (an OCI archive, tests/scripts/build-images.sh) is in the machine's containerd before
# the user-data runs, as on a pre-baked image; --hold keeps the machine running after its check
# (DIR/holding says it is done) until DIR/release exists or the run's time is up. Such nodes
# run side by side. --cgroup NAME gives the machine a cgroup tree of its own, as a VM or a
# container node has: the run joins cgroup NAME in every hierarchy (made by the caller, who
# removes it afterwards) and gets a cgroup namespace rooted there, so its kubelet's kubepods is
# NAME/kubepods on the host and two nodes never share one. --cni-subnet CIDR gives it a pod
# network as a CNI add-on would: the host's bridge and host-local plugins in /opt/cni/bin and a
# conflist for a bridge with pod addresses from CIDR (its own per node), so its kubelet is Ready.
#
# Exit status: 0 proven; 1 the boot proof failed (each failure on stderr, prefixed with LABEL);
# 2 the run could not be made (not root, the root cannot be built, a tool is missing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage() { echo "usage: $0 --user-data FILE --out DIR [--label TEXT] [--role ROLE] [--kubernetes-version V] [--os NAME] [--real-kube DIR [--netns NAME] [--image ARCHIVE]... [--hold] [--cni-subnet CIDR]]" >&2; exit 2; }
user_data="" out="" label="" role="" version="" os="" real="" netns="" cgroup="" hold="" cni="" images=()
while (($#)); do
  case "$1" in
    --user-data) user_data=${2-}; shift 2 ;;
    --out) out=${2-}; shift 2 ;;
    --label) label=${2-}; shift 2 ;;
    --role) role=${2-}; shift 2 ;;
    --kubernetes-version) version=${2-}; shift 2 ;;
    --os) os=${2-}; shift 2 ;;
    --real-kube) real=${2-}; shift 2 ;;
    --netns) netns=${2-}; shift 2 ;;
    --image) images+=("${2-}"); shift 2 ;;
    --cgroup) cgroup=${2-}; shift 2 ;;
    --hold) hold=1; shift ;;
    --cni-subnet) cni=${2-}; shift 2 ;;
    *) usage ;;
  esac
done
[[ -n $user_data && -n $out ]] || usage
label=${label:-$user_data}
die() { echo "boot-proof: $label: ERROR: $*" >&2; exit 2; }
[[ -f $user_data ]] || die "no user-data file $user_data"
[[ -n $real || -z $netns$cgroup$hold$cni${images[*]} ]] || die "--netns, --cgroup, --image, --hold and --cni-subnet need --real-kube"
[[ -z $netns || -e /run/netns/$netns ]] || die "--netns $netns: no /run/netns/$netns"
for archive in "${images[@]}"; do [[ -f $archive ]] || die "--image $archive: no such file"; done
[[ $(id -u) -eq 0 ]] || die "the boot proof must run as root (chroot, mounts and namespaces need it)"
for tool in unshare chroot setpriv timeout python3; do
  command -v "$tool" >/dev/null || die "$tool is missing: run tests/scripts/install-tools.sh"
done
lower=$("$here/build-root.sh") || die "the Debian root could not be prepared (tests/boot/build-root.sh, messages above)"

rm -rf "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)
cp "$user_data" "$out/user-data"
: >"$out/images.list"
((${#images[@]} == 0)) || printf '%s\n' "${images[@]}" >"$out/images.list"
python3 -c 'import json, sys; json.dump(dict(zip(["label", "role", "kubernetesVersion", "os"], sys.argv[2:])), open(sys.argv[1], "w"))' \
  "$out/case.json" "$label" "$role" "$version" "$os"

# A command that waits forever (for a network, a daemon) must not hang the proof: the run gets
# BOOTPLATE_BOOT_TIMEOUT seconds (default 600); --kill-child ends everything in its namespaces.
timeout=${BOOTPLATE_BOOT_TIMEOUT:-600}
status=0
namespaces=(--mount --uts --ipc --net --pid)
if [[ -n $real ]]; then
  for program in kubeadm kubelet; do
    [[ -x $real/$program ]] || die "--real-kube $real: no $program there (tests/scripts/build-tools.sh builds it)"
  done
  for program in /usr/bin/containerd /usr/bin/containerd-shim-runc-v2 /usr/sbin/runc; do
    [[ -x $program ]] || die "$program is missing: run tests/scripts/install-tools.sh"
  done
  namespaces=(--mount --uts --ipc --pid)
  # Real runs share the host's kernel settings, which the kubelet sets: every holder of
  # /run/lock/bootplate-tunables.lock (shared; the pod clusters of tests/src/pod_cluster hold it
  # too) saves them when none are saved, and the last holder to end (its shared lock becomes
  # exclusive) puts them back, under a second lock. Without --netns a run also shares the
  # kubelet's ports and cgroups (kubepods): it holds the host lock alone. Runs with --netns share
  # that one: each has its network namespace, and its own cgroup tree (--cgroup).
  lock=/run/lock/bootplate-real-join.lock
  tunables_lock=/run/lock/bootplate-tunables.lock
  saved_file=/run/lock/bootplate-tunables.saved
  exec 8>"$lock" 6>"$tunables_lock"
  if [[ -n $netns ]]; then flock -s 8; else flock 8; fi
  flock -s 6
  tunables=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops
    kernel/keys/root_maxkeys kernel/keys/root_maxbytes)
  (
    flock 9
    if [[ ! -s $saved_file ]]; then
      for t in "${tunables[@]}"; do cat "/proc/sys/$t"; done >"$saved_file.new"
      mv "$saved_file.new" "$saved_file"
    fi
  ) 9>"$tunables_lock.state"
  cleanup_real() {
    (
      flock 9
      if flock -n 6 && [[ -s $saved_file ]]; then
        local i saved
        mapfile -t saved <"$saved_file"
        for i in "${!tunables[@]}"; do echo "${saved[i]}" >"/proc/sys/${tunables[i]}" || true; done
        rm -f "$saved_file"
      fi
    ) 9>"$tunables_lock.state"
    [[ -z $netns ]] || return 0
    # The kubelet's cgroups (cgroupfs driver: kubepods under each hierarchy), deepest first.
    local pods
    for pods in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
      [[ -d $pods ]] && find "$pods" -depth -type d -exec rmdir {} + 2>/dev/null
    done
    return 0
  }
  trap cleanup_real EXIT
fi
if [[ -n $cgroup ]]; then
  # The cgroup hierarchies (v1 controllers and the v2 tree) from the mount table.
  while read -r _ point type _; do
    [[ ($type == cgroup || $type == cgroup2) && $point == /sys/fs/cgroup* ]] || continue
    [[ -d $point/$cgroup ]] || die "--cgroup $cgroup: no $point/$cgroup (the caller makes it)"
    echo $$ >"$point/$cgroup/cgroup.procs" || die "--cgroup $cgroup: cannot join $point/$cgroup"
  done </proc/self/mounts
  namespaces+=(--cgroup)
fi
enter=()
[[ -z $netns ]] || enter=(nsenter "--net=/run/netns/$netns" --)
timeout --kill-after=10 "$timeout" "${enter[@]}" unshare "${namespaces[@]}" --fork --kill-child \
  --propagation private env BOOT_HOLD="$hold" BOOT_CNI_SUBNET="$cni" BOOT_CGROUPNS="${cgroup:+1}" "$here/lib/inside.sh" "$lower" "$out" "$os" "$real" \
  2>"$out/inside.log" || status=$?
if ((status == 124 || status == 137)); then
  last=$(grep '^== ' "$out/stages.log" 2>/dev/null | grep -v ': exit [0-9]*$' | tail -n 1 || true)
  echo "boot-proof: $label: FAILED: timeout: the run did not finish in $timeout s${last:+ (in ${last#== })}" >&2
  exit 1
fi
if [[ ! -s $out/report.json ]]; then
  cat "$out/inside.log" >&2
  die "the run stopped before its check (exit $status); see $out"
fi
python3 - "$out/report.json" "$label" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
for f in report["failures"]:
    print(f"boot-proof: {sys.argv[2]}: FAILED: {f['step']}: {f['message']}", file=sys.stderr)
sys.exit(0 if report["ok"] else 1)
PY
