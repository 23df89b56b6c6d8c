#!/usr/bin/env bash
# The boot proof of one user-data, inside the namespaces tests/boot/run.sh made for it
# (`unshare --mount --uts --ipc --net --pid --fork`): this shell is PID 1 of the run, its mounts
# and hostname are its own, and it has no network.
#
#   inside.sh ROOT OUT [OS [REAL]]  ROOT: the cached root (read-only lower layer); OUT: the
#                            run's directory holding user-data and case.json (the report goes
#                            to OUT/report.json); OS: the template's spec.os.name; REAL: for real
#                            joins, the directory of the real kubeadm and kubelet (see below)
#
# 1. A fresh root: an overlay of ROOT (upper layer in OUT), or a copy where overlays fail.
# 2. /proc (with /proc/sys read-only), an empty tmpfs /run and /dev/shm; the stubs first on PATH
#    (and over the root's own binary for the programs marked `!` in stubs/programs).
# 3. cloud-init: the NoCloud seed, then `cloud-init init --local`, `init`, `modules
#    --mode=config` (then runcmd's step markers), `modules --mode=final`; or Ignition (2.14 for
#    spec 3.x: `fetch-offline` and `files`; v0.35.0 for spec 2.x: `fetch` and `files`) into the
#    root, the presets it wrote applied as at first boot, and its enabled oneshot units started.
#    Every stage runs whatever the one before did, as a boot does.
# 4. lib/check.py compares the root with the user-data and writes the report.
#
# Programs in the root run chrooted, with the capabilities to load kernel modules, reboot, set
# the clock and do raw I/O dropped from their bounding set.
#
# Real joins (REAL given; run.sh then keeps the host's network namespace, so the kubelet reaches
# the workload apiserver on loopback): the root gets what the install part's packages would have
# put there, since the package managers stay stubs: the real kubeadm and kubelet (behind the
# recording stubs, at /usr/bin as the packages install them), the kubelet unit with kubeadm's
# drop-in, and the host's containerd and runc with containerd's unit. /sys (with the cgroup
# hierarchies), /dev/kmsg and a writable /proc/sys are the machine's (the kubelet sets its kernel
# settings; run.sh puts them back), and /var/lib/containerd is a tmpfs (its overlay snapshots
# cannot live on the root's overlay). After the boot, the check waits (60 s at most) for the
# kubelet to register its Node.
#
# OUT/images.list (one OCI archive a line, from run.sh --image) is imported into the root's
# containerd store (namespace k8s.io, unpacked for its overlayfs snapshotter) before cloud-init
# runs, by the host's containerd on that store with nothing else configured. BOOT_CGROUPNS set
# (run.sh --cgroup: this run has a cgroup namespace of its own): the root's /sys/fs/cgroup
# hierarchies are mounted anew from inside it, so the machine sees its own cgroup as the root,
# as a container node does. BOOT_HOLD set: after
# the check, OUT/holding is written and the machine keeps running until OUT/release exists.
set -euo pipefail
shopt -s extglob
here=$(cd "$(dirname "$0")" && pwd)
boot=$(dirname "$here")
lower=$1
out=$2
os=${3-}
real=${4-}
root=$out/root
stubs=/usr/local/bootplate/stubs
path=$stubs:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ignition=${BOOTPLATE_IGNITION:-/usr/lib/dracut/modules.d/30ignition/ignition}
log() { echo "boot-proof: $*" >&2; }

# preload_images: OUT/images.list into the root's containerd store (see the top of this file).
preload_images() {
  local dir=$out/preload archive pid socket
  mkdir -p "$dir"
  # Its state and socket under /tmp: a unix socket's path is at most 104 bytes, and OUT can be
  # deep (CI's cargo target directory).
  socket=$(mktemp -d /tmp/boot-proof-preload.XXXXXX)
  printf 'version = 2\nroot = "%s"\nstate = "%s"\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n[grpc]\n  address = "%s"\n' \
    "$root/var/lib/containerd" "$socket/state" "$socket/containerd.sock" >"$dir/config.toml"
  containerd --config "$dir/config.toml" >"$dir/containerd.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    ctr --address "$socket/containerd.sock" version >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! ctr --address "$socket/containerd.sock" version >/dev/null 2>&1; then
    log "ERROR: the containerd that preloads the images did not start (tail of its log):"
    tail -n 5 "$dir/containerd.log" >&2
    kill "$pid" 2>/dev/null
    exit 2
  fi
  while read -r archive; do
    [[ -z $archive ]] || ctr --address "$socket/containerd.sock" -n k8s.io images import "$archive" >&2
  done <"$out/images.list"
  kill "$pid"
  wait "$pid" || true
  rm -rf "$socket"
}

# mount_own_cgroups: the host's cgroup hierarchies, mounted again under the root's
# /sys/fs/cgroup from inside this run's cgroup namespace (each shows the run's cgroup as its root).
mount_own_cgroups() {
  local point type options entry cgroups=$root/sys/fs/cgroup
  if [[ $(stat -fc %T /sys/fs/cgroup) == cgroup2fs ]]; then
    mount -t cgroup2 cgroup2 "$cgroups"
    return
  fi
  mount -t tmpfs -o mode=0755 cgroups "$cgroups"
  while read -r _ point type options _; do
    [[ ($type == cgroup || $type == cgroup2) && $point == /sys/fs/cgroup/* ]] || continue
    mkdir -p "$root$point"
    mount -t "$type" -o "$options" "$type" "$root$point"
  done </proc/self/mounts
  # Links such as cpu -> cpu,cpuacct.
  for entry in /sys/fs/cgroup/*; do
    [[ ! -L $entry ]] || ln -s "$(readlink "$entry")" "$cgroups/${entry##*/}"
  done
}

# 1. The root.
mkdir -p "$root" "$out/upper" "$out/work"
if ! mount -t overlay overlay -o "lowerdir=$lower,upperdir=$out/upper,workdir=$out/work" "$root" 2>/dev/null; then
  # An upper layer on an overlay (a container's disk) is refused by some kernels: use a tmpfs.
  mount -t tmpfs tmpfs "$out/upper"
  mkdir -p "$out/upper/u" "$out/upper/w"
  if ! mount -t overlay overlay -o "lowerdir=$lower,upperdir=$out/upper/u,workdir=$out/upper/w" "$root" 2>/dev/null; then
    log "overlayfs is not available: copying the root"
    cp -a "$lower/." "$root/"
  fi
fi
mount -t proc proc "$root/proc"
if [[ -z $real ]]; then
  mount --bind "$root/proc/sys" "$root/proc/sys"
  mount -o remount,bind,ro "$root/proc/sys"
fi
mount -t tmpfs -o mode=0755 tmpfs "$root/run"
mkdir -p "$root/dev/shm" && mount -t tmpfs tmpfs "$root/dev/shm"
mkdir -p "$root/run/bootplate" "$root/run/lock"
hostname boot-proof

# Stand-ins for what the images of the template's OS family have and a Debian root lacks: the
# directories their tools expect and the units their images ship (so that `systemctl enable` of
# such a unit works as it does on the image, and of any other fails as it does there).
image_units=(systemd-timesyncd.service)
image_groups=()
case "$os" in
  rocky | rhel | almalinux | centos | fedora | amazonlinux)
    mkdir -p "$root/etc/yum.repos.d" "$root/etc/dnf" "$root/etc/sysconfig" "$root/etc/pki/rpm-gpg" \
      "$root/etc/selinux"
    [[ -e $root/etc/selinux/config ]] || printf 'SELINUX=enforcing\nSELINUXTYPE=targeted\n' >"$root/etc/selinux/config"
    image_units=(chronyd.service)
    ;;
  flatcar)
    # Flatcar's image ships ntpd beside timesyncd, and groups docker and wheel, which the
    # Ignition configs made for it (the kubeadm bootstrap provider's) name.
    image_units=(containerd.service docker.service systemd-timesyncd.service ntpd.service)
    image_groups=(docker wheel)
    ;;
  kubeadm-image)
    # An image made for the kubeadm bootstrap provider (image-builder's): the kubelet and a
    # container runtime come with it.
    image_units=(containerd.service kubelet.service systemd-timesyncd.service)
    ;;
esac
for unit in "${image_units[@]}"; do
  [[ -e $root/usr/lib/systemd/system/$unit ]] ||
    printf '# boot-proof stand-in: a unit the %s image ships\n[Service]\nExecStart=/bin/true\n\n[Install]\nWantedBy=multi-user.target\n' \
      "${os:-OS}" >"$root/usr/lib/systemd/system/$unit"
done
for group in "${image_groups[@]}"; do
  grep -q "^$group:" "$root/etc/group" || groupadd --root "$root" --system "$group"
done

# 2. The stubs and the boot proof's own files.
bp=$root/usr/local/bootplate
mkdir -p "$bp" "$root$stubs"
cp "$out/user-data" "$out/case.json" "$here/check.py" "$here/trace.bash" "$bp/"
cp "$boot/stubs/stub" "$boot/stubs/packages" "$bp/"
while read -r name; do
  [[ -z $name || $name == \#* ]] && continue
  ln -s ../stub "$root$stubs/${name#!}"
  if [[ $name == !* ]]; then
    for dir in usr/sbin usr/bin; do
      if [[ -e $root/$dir/${name#!} || -L $root/$dir/${name#!} ]]; then
        rm -f "$root/$dir/${name#!}"
        ln -s "$stubs/${name#!}" "$root/$dir/${name#!}"
      fi
    done
  fi
done <"$boot/stubs/programs"

if [[ -n $real ]]; then
  # What the install part's packages would have installed (see the top of this file).
  mount --rbind /sys "$root/sys"
  [[ -z ${BOOT_CGROUPNS-} ]] || mount_own_cgroups
  touch "$root/dev/kmsg"
  mount --bind /dev/kmsg "$root/dev/kmsg"
  mkdir -p "$root/var/lib/containerd" && mount -t tmpfs tmpfs "$root/var/lib/containerd"
  mkdir -p "$bp/real"
  for program in kubeadm kubelet; do
    touch "$bp/real/$program"
    mount --bind -o ro "$real/$program" "$bp/real/$program"
    ln -sf "$stubs/$program" "$root/usr/bin/$program"
  done
  for program in /usr/bin/containerd-shim-runc-v2 /usr/sbin/runc; do
    touch "$root$program"
    mount --bind -o ro "$program" "$root$program"
  done
  if [[ -n ${BOOT_CNI_SUBNET-} ]]; then
    # The pod network a CNI add-on would give (run.sh --cni-subnet): the host's plugins and a
    # bridge whose pods take addresses from this node's subnet. The plugins are copied, not
    # mounted: /opt/cni/bin stays writable, as on an image, for templates that install their own.
    mkdir -p "$root/opt/cni/bin" "$root/etc/cni/net.d"
    for plugin in bridge host-local loopback portmap; do
      cp /usr/lib/cni/$plugin "$root/opt/cni/bin/$plugin"
    done
    cat >"$root/etc/cni/net.d/10-bootplate-bridge.conflist" <<CNI
{"cniVersion": "1.0.0", "name": "bootplate-bridge", "plugins": [{"type": "bridge",
  "bridge": "cni0", "isGateway": true, "ipam": {"type": "host-local",
  "ranges": [[{"subnet": "$BOOT_CNI_SUBNET"}]], "routes": [{"dst": "0.0.0.0/0"}]}}]}
CNI
  fi
  # containerd, through a wrapper: the test machine is itself a container without
  # CAP_SYS_RESOURCE, so runc cannot lower a Pod's OOM score as containerd's CRI asks unless
  # restrict_oom_score_adj is set; the wrapper adds it to the configuration the user-data wrote.
  touch "$bp/real/containerd"
  mount --bind -o ro /usr/bin/containerd "$bp/real/containerd"
  cat >"$root/usr/bin/containerd" <<'WRAP'
#!/bin/sh
# boot-proof: the real containerd, with restrict_oom_score_adj (tests/boot/lib/inside.sh), in
# the configuration the unit names (--config FILE, -c FILE) or containerd's default one.
config=/etc/containerd/config.toml
value=
for arg in "$@"; do
  # Each original argument is shifted off the front; the kept ones go back at the end.
  shift
  if [ -n "$value" ]; then config=$arg; value=; continue; fi
  case "$arg" in
    --config=*) config=${arg#--config=} ;;
    --config | -c) value=1 ;;
    *) set -- "$@" "$arg" ;;
  esac
done
if [ -f "$config" ]; then
  sed 's/^\(\[plugins\."io\.containerd\.grpc\.v1\.cri"\]\)$/\1\n  restrict_oom_score_adj = true/' \
    "$config" >/run/bootplate/containerd.toml
  exec /usr/local/bootplate/real/containerd --config /run/bootplate/containerd.toml "$@"
fi
exec /usr/local/bootplate/real/containerd "$@"
WRAP
  chmod 0755 "$root/usr/bin/containerd"
  units=$root/usr/lib/systemd/system
  mkdir -p "$units/kubelet.service.d"
  cp /lib/systemd/system/containerd.service "$units/containerd.service"
  # The kubelet's unit and kubeadm's drop-in as the Kubernetes packages install them.
  cp "$here/units/kubelet.service" "$units/kubelet.service"
  cp "$here/units/10-kubeadm.conf" "$units/kubelet.service.d/10-kubeadm.conf"
  [[ ! -s $out/images.list ]] || preload_images
  # What every machine has and a debootstrap root lacks; containerd copies both into the Pods
  # that share the machine's network (the control plane's static Pods).
  [[ -e $root/etc/hosts ]] || printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
  [[ -e $root/etc/resolv.conf ]] || printf '# no name server: the machine has no network beyond its cluster\n' >"$root/etc/resolv.conf"
fi

in_root() {
  setpriv --bounding-set -sys_module,-sys_boot,-sys_time,-sys_rawio \
    chroot "$root" /usr/bin/env -i PATH="$path" HOME=/root LANG=C.UTF-8 TERM=dumb "$@"
}

# stage NAME COMMAND...: runs a stage, its output to OUT/stages.log (copied to the root's
# /run/bootplate for check.py), its status and time to the root's /run/bootplate/stages.tsv;
# returns its status.
stages_log=$out/stages.log
stage() {
  local name=$1 start end status=0
  shift
  echo "== $name" >>"$stages_log"
  start=$(date +%s.%N)
  "$@" >>"$stages_log" 2>&1 || status=$?
  end=$(date +%s.%N)
  printf '%s\t%s\t%s\n' "$name" "$status" "$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f", b - a }')" \
    >>"$root/run/bootplate/stages.tsv"
  echo "== $name: exit $status" >>"$stages_log"
  return "$status"
}

consumer=$(in_root python3 /usr/local/bootplate/check.py kind)
if [[ $consumer == cloud-init ]]; then
  # 3a. cloud-init.
  seed=$root/var/lib/cloud/seed/nocloud
  mkdir -p "$seed"
  cp "$out/user-data" "$seed/user-data"
  printf 'instance-id: iid-bootplate-boot-proof\n' >"$seed/meta-data"
  cp "$here/cloud.cfg" "$root/etc/cloud/cloud.cfg.d/99-bootplate-boot-proof.cfg"
  # A boot runs every stage, whatever the one before did.
  stage "cloud-init init --local" in_root cloud-init init --local || true
  stage "cloud-init init" in_root cloud-init init || true
  stage "cloud-init modules --mode=config" in_root cloud-init modules --mode=config || true
  in_root python3 /usr/local/bootplate/check.py instrument-runcmd
  stage "cloud-init modules --mode=final" \
    in_root BASH_ENV=/usr/local/bootplate/trace.bash cloud-init modules --mode=final || true
  cp "$root"/var/log/cloud-init*.log "$out/" 2>/dev/null || true
else
  # 3b. Ignition, from the host into the root, the one of the config's spec version: 3.x Ignition
  # 2.14 (Debian's; it relabels at the end, so it needs an SELinux config saying disabled and a
  # setfiles that does nothing), 2.x Ignition v0.35.0 (BOOTPLATE_IGNITION_SPEC2, built by
  # tests/scripts/build-tools.sh; Ignition 2.x refuses spec 2 configs).
  spec=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["ignition"]["version"])' "$out/user-data" 2>/dev/null || true)
  if [[ $spec == 2.* ]]; then
    ignition_spec2=${BOOTPLATE_IGNITION_SPEC2-}
    [[ -x $ignition_spec2 ]] || { log "ERROR: an Ignition config of spec $spec needs Ignition v0.35.0: set BOOTPLATE_IGNITION_SPEC2 to the ignition-spec2 tests/scripts/build-tools.sh builds (now '${ignition_spec2}')"; exit 2; }
  else
    [[ -x $ignition ]] || { log "ERROR: $ignition is missing: install Debian's ignition package (tests/scripts/install-tools.sh)"; exit 2; }
  fi
  mount -t tmpfs tmpfs /run
  mkdir -p "$out/bin" "$root/etc/selinux"
  printf '#!/bin/sh\nexit 0\n' >"$out/bin/setfiles"
  chmod +x "$out/bin/setfiles"
  printf 'SELINUX=disabled\nSELINUXTYPE=targeted\n' >"$root/etc/selinux/config"
  # Ignition writes a user's SSH keys as that user, who must be able to reach the root: a root
  # under a private directory (CI's cargo target directory is under /root) is bound at a path
  # anyone can traverse, in this run's /run.
  mkdir -p /run/ignition-root
  mount --rbind "$root" /run/ignition-root
  # A failed Ignition stage stops the boot (the initramfs goes to its emergency shell).
  if [[ $spec == 2.* ]]; then
    # Spec 2.x: Ignition v0.35.0's two stages of a boot without disks (`fetch`, then `files`).
    stage "ignition fetch (spec $spec)" env IGNITION_CONFIG_FILE="$out/user-data" \
      "$ignition_spec2" -oem file -log-to-stdout -stage fetch -config-cache "$out/ignition.json" &&
      stage "ignition files (spec $spec)" "$ignition_spec2" -oem file -log-to-stdout -stage files \
        -root /run/ignition-root -config-cache "$out/ignition.json" ||
      ignition_failed=true
  else
    stage "ignition fetch-offline" env PATH="$out/bin:$PATH" IGNITION_CONFIG_FILE="$out/user-data" \
      "$ignition" -platform file -stage fetch-offline -config-cache "$out/ignition.json" &&
      stage "ignition files" env PATH="$out/bin:$PATH" \
        "$ignition" -platform file -stage files -root /run/ignition-root -config-cache "$out/ignition.json" ||
      ignition_failed=true
  fi
  # First boot: systemd applies the presets Ignition wrote, to the units that are installed (a
  # unit with only drop-ins and no unit file in the image stays disabled, as on a real boot).
  preset=$root/etc/systemd/system-preset/20-ignition.preset
  if [[ -z ${ignition_failed-} && -f $preset ]]; then
    mapfile -t units < <(awk '$1 == "enable" || $1 == "disable" { print $2 }' "$preset")
    for unit in "${units[@]}"; do
      template=${unit%%@*}@.${unit##*.}
      # systemd presets only the units that exist; check.py reports an enabled one that does not.
      # (A glob's group cannot hold a slash: one pattern per directory.)
      if compgen -G "$root/etc/systemd/system/@($unit|$template)" >/dev/null ||
        compgen -G "$root/usr/lib/systemd/system/@($unit|$template)" >/dev/null; then
        stage "systemctl preset $unit (first boot)" in_root /usr/bin/systemctl preset "$unit"
      fi
    done
  fi
  if [[ -z ${ignition_failed-} ]]; then
    in_root BASH_ENV=/usr/local/bootplate/trace.bash python3 /usr/local/bootplate/check.py run-units \
      >>"$stages_log" 2>&1 || true
  fi
fi

# Real joins: the kubelet registers its Node after kubeadm is done; wait for that (or give up).
if [[ -n $real ]]; then
  kubelet_log=$root/run/bootplate/daemons/kubelet.service.log
  for _ in $(seq 300); do
    [[ -f $kubelet_log ]] || break
    grep -q 'Successfully registered node' "$kubelet_log" && break
    sleep 0.2
  done
fi

# 4. The check.
cp "$stages_log" "$root/run/bootplate/stages.log"
in_root python3 /usr/local/bootplate/check.py check >"$out/report.json"
mkdir -p "$out/run"
if [[ -n ${BOOT_HOLD-} ]]; then
  # A held machine's containerd keeps running Pods, whose task directories under /run come and
  # go (a copy raced one once, and the run ended before its hold): everything but its state.
  find "$root/run" -mindepth 1 -maxdepth 1 ! -name containerd -exec cp -a {} "$out/run/" \;
else
  cp -a "$root/run/." "$out/run/"
fi
if [[ -n ${BOOT_HOLD-} ]]; then
  # What kubeadm wrote (admin.conf, the certificates), for the test that holds the machine.
  [[ ! -d $root/etc/kubernetes ]] || cp -a "$root/etc/kubernetes" "$out/etc-kubernetes"
  touch "$out/holding"
  while [[ ! -e $out/release ]]; do sleep 0.5; done
fi
