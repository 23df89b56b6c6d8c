#!/usr/bin/env bash
# Builds, once, the disk image the VM boots run, and prints the directory holding it:
# disk.raw (an ext4 root file system labelled "root", no partition table), vmlinuz and
# initrd.img (the image's own kernel and initrd, for qemu's -kernel and -initrd).
#
#   tests/vm/build-image.sh             # prints e.g. /root/.cache/bootplate/vm/debian-1a2b3c4d5e6f
#   tests/vm/build-image.sh --prebaked KUBE_DIR
#
# The image is the boot proof's Debian root (tests/boot/build-root.sh) plus Debian's
# linux-image-amd64, systemd-sysv, dbus (hostnamectl needs it, as on any cloud image) and
# ifupdown with a DHCP client (cloud-init's fallback network is DHCP on the first NIC);
# cloud-init is limited to the NoCloud data source and the C.UTF-8 locale, and one unit powers
# the machine off once cloud-init's final stage is over, so a boot ends by itself and its disk
# is consistent when read afterwards. --prebaked adds what a kubeadm template with
# `skipParts: [install]` expects on the machine: Debian's containerd, runc, conntrack, iptables,
# socat and ethtool, the kubeadm and kubelet of KUBE_DIR (tests/scripts/build-tools.sh builds
# them) and the kubelet's unit with kubeadm's drop-in (tests/boot/lib/units, as the Kubernetes
# packages install them).
#
# Cached under ${BOOTPLATE_VM_CACHE:-~/.cache/bootplate/vm}, keyed by the hashes of this script,
# build-root.sh and (--prebaked) the two binaries and the units: an image is built once (a few minutes: package downloads, the initrd),
# older ones are removed. Concurrent callers wait on a lock. Needs root and, on the first run,
# the network.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
log() { echo "vm: build-image: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
kube=""
case "$#:${1-}" in
  0:) ;;
  2:--prebaked)
    kube=$2
    [[ -x $kube/kubeadm && -x $kube/kubelet ]] || die "--prebaked $kube: no kubeadm and kubelet there"
    ;;
  *) echo "usage: $0 [--prebaked KUBE_DIR]" >&2; exit 2 ;;
esac

[[ $(id -u) -eq 0 ]] || die "must run as root (chroot and apt-get in the root need it)"
for tool in chroot mkfs.ext4 flock sha256sum; do
  command -v "$tool" >/dev/null || die "$tool is missing: run tests/scripts/install-tools.sh"
done

cache=${BOOTPLATE_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bootplate/vm}
flavour=debian
units=$here/../boot/lib/units
key_input=("$here/build-image.sh" "$here/../boot/build-root.sh")
if [[ -n $kube ]]; then
  flavour=prebaked
  key_input+=("$kube/kubeadm" "$kube/kubelet" "$units/kubelet.service" "$units/10-kubeadm.conf")
fi
key=$(cat "${key_input[@]}" | sha256sum | cut -c1-12)
image=$cache/$flavour-$key
mkdir -p "$cache"
exec 9>"$cache/.lock-$flavour"
flock 9

if [[ -f $image/.bootplate-complete ]]; then
  echo "$image"
  exit 0
fi

root=$("$here/../boot/build-root.sh") || die "the Debian root could not be prepared (tests/boot/build-root.sh)"
build=$(mktemp -d "$cache/build.XXXXXX")
cleanup() {
  umount "$build/root/proc" 2>/dev/null || true
  rm -rf "$build"
}
trap cleanup EXIT
log "building the image from $root: a few minutes, once"
cp -a "$root" "$build/root"
rm -f "$build/root/.bootplate-complete"
mount -t proc proc "$build/root/proc"
cp /etc/resolv.conf "$build/root/etc/resolv.conf"
packages=(linux-image-amd64 systemd-sysv dbus ifupdown isc-dhcp-client iproute2)
[[ -n $kube ]] && packages+=(containerd runc conntrack iptables socat ethtool)
in_root() { chroot "$build/root" env DEBIAN_FRONTEND=noninteractive "$@"; }
{
  in_root apt-get update -qq &&
    in_root apt-get install -y -qq --no-install-recommends "${packages[@]}"
} >"$build/apt.log" 2>&1 || { tail -n 30 "$build/apt.log" >&2; die "apt-get install ${packages[*]} failed (its log above)"; }
in_root apt-get clean
umount "$build/root/proc"

r=$build/root
echo 'LABEL=root / ext4 defaults 0 1' >"$r/etc/fstab"
# NoCloud only (no minutes probing for clouds); C.UTF-8 because the root generates no other
# locale (cloud-init's default en_US.UTF-8 would fail its locale module).
printf '%s\n' 'datasource_list: [NoCloud, None]' 'locale: C.UTF-8' \
  >"$r/etc/cloud/cloud.cfg.d/90-bootplate-vm.cfg"
# The boot ends when cloud-init's last stage does, whatever the user-data did; what the
# user-data left in /run (a tmpfs: Cluster API's sentinel) is kept on the disk first, under
# /var/lib/bootplate-vm/run, and the services running then are listed in
# /var/lib/bootplate-vm/running-services (a unit the user-data started is seen to run, not only
# to be enabled).
cat >"$r/etc/systemd/system/bootplate-poweroff.service" <<'UNIT'
[Unit]
Description=Power off once cloud-init is done (bootplate's VM test)
After=cloud-final.service
Wants=cloud-final.service

[Service]
Type=oneshot
ExecStart=/bin/mkdir -p /var/lib/bootplate-vm/run
ExecStart=-/bin/cp -a /run/cluster-api /var/lib/bootplate-vm/run/
ExecStart=-/bin/sh -c 'systemctl list-units --type=service --state=running --no-legend --plain >/var/lib/bootplate-vm/running-services'
ExecStart=/bin/systemctl --no-block poweroff

[Install]
WantedBy=cloud-init.target
UNIT
mkdir -p "$r/etc/systemd/system/cloud-init.target.wants"
ln -sf /etc/systemd/system/bootplate-poweroff.service "$r/etc/systemd/system/cloud-init.target.wants/bootplate-poweroff.service"
if [[ -n $kube ]]; then
  install -m 0755 "$kube/kubeadm" "$kube/kubelet" "$r/usr/bin/"
  mkdir -p "$r/usr/lib/systemd/system/kubelet.service.d"
  cp "$units/kubelet.service" "$r/usr/lib/systemd/system/kubelet.service"
  cp "$units/10-kubeadm.conf" "$r/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf"
  # kubeadm join returns once the kubelet has its client certificate; the Node registers a
  # moment later, which a running machine would do: the power-off waits for it (2 min at most).
  mkdir -p "$r/etc/systemd/system/bootplate-poweroff.service.d"
  cat >"$r/etc/systemd/system/bootplate-poweroff.service.d/kubelet.conf" <<'UNIT'
[Service]
TimeoutStartSec=300
ExecStartPre=/bin/sh -c 'systemctl -q is-active kubelet || exit 0; for _ in $$(seq 120); do journalctl -u kubelet --no-pager | grep -q "Successfully registered node" && exit 0; sleep 1; done'
UNIT
fi
rm -rf "$r/var/lib/apt/lists"/* "$r/var/log/cloud-init"* "$r/var/lib/cloud"/*
: >"$r/etc/resolv.conf"
: >"$r/etc/machine-id"

mkdir -p "$build/out"
cp -L "$r/vmlinuz" "$build/out/vmlinuz"
cp -L "$r/initrd.img" "$build/out/initrd.img"
size=$(( $(du -sm "$r" | cut -f1) + 1024 ))
mkfs.ext4 -q -L root -d "$r" "$build/out/disk.raw" "${size}M" >&2 ||
  die "mkfs.ext4 -d could not make the disk image"
touch "$build/out/.bootplate-complete"
rm -rf "$image"
mv "$build/out" "$image"
find "$cache" -maxdepth 1 -name "$flavour-*" ! -name "$flavour-$key" -exec rm -rf {} +
log "cached $image"
echo "$image"
