#!/usr/bin/env bash
# Builds, once, the Debian root the boot-proof tier runs cloud-init in, and prints the path of
# its unpacked copy (the read-only lower layer every run overlays; runs never write to it).
#
#   tests/boot/build-root.sh            # prints e.g. /root/.cache/bootplate/boot/root-1a2b3c4d5e6f
#
# The root: `debootstrap --variant=minbase` of Debian 12 (bookworm) with cloud-init, python3,
# systemd, sudo and curl (about a minute). curl is there because cloud images have it and the boot
# reporter sends with it (docs/boot-channel.md): without it reports are off, and the real joins
# could not show a failed boot on the config. python3-cffi-backend is included by name: cloud-init's
# python3-cryptography depends on it only through a virtual package, which debootstrap does not
# resolve, and cloud-init would stay unconfigured (the fix `apt-get install -f
# python3-cffi-backend` in the root does the same, later). The result is cached as a tarball
# under ${BOOTPLATE_BOOT_CACHE:-~/.cache/bootplate/boot}, keyed by the hash of this script:
# editing the script rebuilds it, nothing else does. The tarball is unpacked next to it once; a
# stamp file marks a complete unpack. Concurrent callers wait on a lock. Needs root (debootstrap,
# chroot) and the network on the first run only.
#
# Environment: BOOTPLATE_BOOT_CACHE (cache directory), BOOTPLATE_DEBIAN_MIRROR (default
# http://deb.debian.org/debian).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
log() { echo "boot-proof: build-root: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root (debootstrap and chroot need it); run the tier with sudo or as root"
for tool in debootstrap chroot tar flock sha256sum; do
  command -v "$tool" >/dev/null || die "$tool is missing: run tests/scripts/install-tools.sh"
done

cache=${BOOTPLATE_BOOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bootplate/boot}
mirror=${BOOTPLATE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
key=$(sha256sum "$here/build-root.sh" | cut -c1-12)
tarball=$cache/debian-bookworm-$key.tar.gz
root=$cache/root-$key
mkdir -p "$cache"

exec 9>"$cache/.lock"
flock 9

if [[ -f $root/.bootplate-complete ]]; then
  echo "$root"
  exit 0
fi

if [[ ! -f $tarball ]]; then
  build=$(mktemp -d "$cache/build.XXXXXX")
  trap 'rm -rf "$build"' EXIT
  log "debootstrap bookworm (minbase, cloud-init, python3, systemd, curl) from $mirror: about a minute, once"
  debootstrap --variant=minbase --include=cloud-init,python3,python3-cffi-backend,systemd,sudo,curl \
    bookworm "$build/root" "$mirror" >"$build/debootstrap.log" 2>&1 ||
    { tail -n 30 "$build/debootstrap.log" >&2; die "debootstrap failed (its log above)"; }
  # shellcheck disable=SC2016 # a dpkg-query format, not a shell expression
  chroot "$build/root" dpkg-query -W -f='${Status}\n' cloud-init | grep -q "install ok installed" ||
    { tail -n 30 "$build/debootstrap.log" >&2; die "cloud-init is not configured in the root (debootstrap's log above)"; }
  # No trace of the build host (debootstrap copies its host name and resolver): instance state,
  # logs and the machine id are made by each run.
  chroot "$build/root" apt-get clean
  rm -rf "$build/root/var/lib/cloud"/* "$build/root/var/log/cloud-init"* "$build/root/var/lib/apt/lists"/*
  echo localhost >"$build/root/etc/hostname"
  : >"$build/root/etc/resolv.conf"
  : >"$build/root/etc/machine-id"
  tar -C "$build/root" --numeric-owner -czf "$build/root.tar.gz" .
  mv "$build/root.tar.gz" "$tarball"
  rm -rf "$build"
  trap - EXIT
  # Older roots (a previous version of this script) are no longer used.
  find "$cache" -maxdepth 1 \( -name 'debian-bookworm-*.tar.gz' -o -name 'root-*' \) \
    ! -name "debian-bookworm-$key.tar.gz" ! -name "root-$key" -exec rm -rf {} +
  log "cached $tarball"
fi

rm -rf "$root"
mkdir -p "$root"
tar -C "$root" --numeric-owner -xzf "$tarball"
touch "$root/.bootplate-complete"
echo "$root"
