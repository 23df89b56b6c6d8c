#!/usr/bin/env bash
# Boots one rendered user-data in a real VM: a copy of the image of tests/vm/build-image.sh
# under qemu-system-x86_64 (TCG), its own kernel and initrd, a NoCloud seed disk (cloud-localds)
# holding the user-data, user-mode networking with the guest restricted (nothing outside the VM
# is reachable) unless --reach-host. The image powers itself off after cloud-init's final
# stage; the disk is then left for the caller to read (debugfs -R "cat PATH" DIR/disk.raw).
#
#   tests/vm/boot.sh --image DIR --user-data FILE --out DIR [--hostname NAME]
#                    [--reach-host]
#
# --reach-host: the guest's connections to 10.0.2.2 reach the host's loopback (a control plane
# served on 127.0.0.1). qemu refuses a guestfwd rule on 10.0.2.2 and its guestfwd serves one
# connection at a time, so this lifts the restriction instead: the guest could also reach
# further through the host's network (the image has no package lists and nothing asks to). OUT gets disk.raw, seed.img, console.log (the
# serial console) and seconds (the boot's wall time, power-on to power-off).
# BOOTPLATE_VM_TIMEOUT bounds the boot (default 1200 s: a boot that joins took over 600 s under TCG
# while the other tiers kept both cores busy; the limit only ends a boot that hangs).
# BOOTPLATE_VM_CPUS: the guest's vCPUs (default 1). BOOTPLATE_VM_NICE: qemu's niceness (default
# -5, above the test run's other processes; ignored without the privilege). Under TCG the guest
# is CPU-bound and its own time limits are tight (kubeadm's CRI check, systemd's): one vCPU
# given a core when it needs one boots in one to three minutes beside the other tiers, where two
# vCPUs competing with them took over ten and failed those limits. BOOTPLATE_VM_KVM=1 uses KVM instead of
# TCG (a KVM boot hung on the machines this was written on). BOOTPLATE_VM_MEMORY: MiB (1024).
#
# Exit status: 0 cloud-init finished and the machine powered off; 1 it did not (the console's
# tail on stderr); 2 the boot could not be made (a tool or the image is missing).
set -euo pipefail
usage() { echo "usage: $0 --image DIR --user-data FILE --out DIR [--hostname NAME] [--reach-host]" >&2; exit 2; }
image="" user_data="" out="" hostname=bootplate-vm restrict=on
while (($#)); do
  case "$1" in
    --image) image=${2-}; shift 2 ;;
    --user-data) user_data=${2-}; shift 2 ;;
    --out) out=${2-}; shift 2 ;;
    --hostname) hostname=${2-}; shift 2 ;;
    --reach-host) restrict=off; shift ;;
    *) usage ;;
  esac
done
[[ -n $image && -n $user_data && -n $out ]] || usage
die() { echo "vm: ERROR: $*" >&2; exit 2; }
for tool in qemu-system-x86_64 cloud-localds timeout; do
  command -v "$tool" >/dev/null || die "$tool is missing: run tests/scripts/install-tools.sh"
done
for f in disk.raw vmlinuz initrd.img; do
  [[ -f $image/$f ]] || die "no $f in $image (tests/vm/build-image.sh builds it)"
done
[[ -f $user_data ]] || die "no user-data file $user_data"

rm -rf "$out"
mkdir -p "$out"
cp --sparse=always "$image/disk.raw" "$out/disk.raw"
printf 'instance-id: %s\nlocal-hostname: %s\n' "$hostname-$$" "$hostname" >"$out/meta-data"
cloud-localds "$out/seed.img" "$user_data" "$out/meta-data"

netdev=user,id=net0,restrict=$restrict
accel=(-accel tcg)
[[ ${BOOTPLATE_VM_KVM:-0} == 1 ]] && accel=(-accel kvm -cpu host)

start=$(date +%s)
status=0
timeout --kill-after=10 "${BOOTPLATE_VM_TIMEOUT:-1200}" \
  nice -n "${BOOTPLATE_VM_NICE:--5}" qemu-system-x86_64 "${accel[@]}" \
  -m "${BOOTPLATE_VM_MEMORY:-1024}" -smp "${BOOTPLATE_VM_CPUS:-1}" -nographic -no-reboot -nodefaults \
  -serial "file:$out/console.log" \
  -kernel "$image/vmlinuz" -initrd "$image/initrd.img" \
  -append "root=LABEL=root rw console=ttyS0 panic=-1" \
  -drive "file=$out/disk.raw,format=raw,if=virtio" \
  -drive "file=$out/seed.img,format=raw,if=virtio,readonly=on" \
  -netdev "$netdev" -device virtio-net-pci,netdev=net0 \
  >"$out/qemu.log" 2>&1 || status=$?
echo $(($(date +%s) - start)) >"$out/seconds"
if ((status != 0)); then
  tail -n 40 "$out/console.log" >&2 || true
  cat "$out/qemu.log" >&2
  echo "vm: FAILED: qemu exited with $status$( ((status == 124)) && echo ' (timeout)')" >&2
  exit 1
fi
if ! grep -q 'Cloud-init v\. .* finished at' "$out/console.log"; then
  tail -n 40 "$out/console.log" >&2
  echo "vm: FAILED: the machine powered off without cloud-init finishing" >&2
  exit 1
fi
