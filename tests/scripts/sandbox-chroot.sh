#!/bin/sh
# The sandbox the tests run rendered boot scripts in (controller/tests/templates.rs, and the
# node root of tests/src/mirror.rs): run inside a new mount namespace as
# `sandbox-chroot.sh ROOT COMMAND...`, it binds the host's programs read-only into ROOT (ROOT's
# own /.usr-local as /usr/local), then chroots into ROOT and runs COMMAND with a clean
# environment, the stubs of /bootplate-stubs first on PATH.
set -eu
root=$1
shift
for top in bin sbin lib lib32 lib64 libx32; do
  if [ -L "/$top" ]; then
    if [ ! -L "$root/$top" ]; then ln -s "$(readlink "/$top")" "$root/$top"; fi
  elif [ -d "/$top" ]; then
    mkdir -p "$root/$top"
    mount --bind "/$top" "$root/$top"
    mount -o remount,bind,ro "$root/$top"
  fi
done
mkdir -p "$root/usr" "$root/.usr-local" "$root/dev"
mount --bind /usr "$root/usr"
mount -o remount,bind,ro "$root/usr"
mount --bind "$root/.usr-local" "$root/usr/local"
for dev in null zero random urandom; do
  : >"$root/dev/$dev"
  mount --bind "/dev/$dev" "$root/dev/$dev"
done
exec chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
  PATH=/bootplate-stubs:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
