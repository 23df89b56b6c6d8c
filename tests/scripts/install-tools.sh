#!/usr/bin/env bash
# Installs (idempotently) the Debian packages the test suite uses: the real consumers of the
# rendered output (cloud-init, ignition, shellcheck), promtool for the alert rules, debootstrap
# for the boot proof, containerd and runc (the container runtime the real kubelet of the joins
# talks to), umoci and skopeo (tests/scripts/build-images.sh builds the images of the cluster
# that runs Pods with them; ca-certificates is the CA bundle bootplate's image carries), for the
# VM boots qemu, cloud-localds and e2fsprogs (mkfs.ext4 -d, debugfs), curl, whose documented
# command line tests/tests/docs checks, and xmllint (libxml2-utils), which validates
# `bootplate lint --format junit` against the JUnit XSD; libblkid-dev for the cgo build of Ignition
# v0.35.0 (tests/scripts/build-tools.sh).
# The management cluster that runs Pods (tests/src/pod_cluster) adds the bridge and host-local
# CNI plugins (containernetworking-plugins, in /usr/lib/cni), nftables (kube-proxy runs in its
# nftables mode, which drives `nft`), iptables (the CNI plugins and kube-proxy's start-up clean-up
# of older modes call it), iproute2 (the cluster's network namespace, veth and routes) and
# busybox-static (the shell, HTTP server and client of its probe image). python3-venv makes the
# virtual environment of cloudbase-init (tests/windows/cloudbase-init.sh). It also raises the
# kernel's inotify instances per user to 1024 when lower (the kubelets running at once need more
# than the default 128).
# kube-apiserver, etcd, kubeadm, the kubelet and Cluster API come from Go modules instead
# (tests/scripts/build-tools.sh).
set -euo pipefail
log() { echo "install-tools: $*" >&2; }
sudo_if_needed() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

packages=(cloud-init ignition shellcheck prometheus debootstrap debian-archive-keyring openssl
  containerd runc umoci skopeo ca-certificates qemu-system-x86 qemu-utils cloud-image-utils e2fsprogs curl
  libxml2-utils libblkid-dev containernetworking-plugins nftables iptables iproute2 busybox-static python3-venv)
need=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if ((${#need[@]})); then
  log "installing ${need[*]}"
  sudo_if_needed apt-get update -qq >&2 || true
  # cloud-init's maintainer scripts try to start services; there is no init system here.
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${need[@]}" >&2
fi
for tool in cloud-init ignition-validate shellcheck promtool kubectl debootstrap go openssl \
  containerd containerd-shim-runc-v2 runc umoci skopeo qemu-system-x86_64 qemu-img cloud-localds mkfs.ext4 \
  debugfs curl xmllint nft iptables ip nsenter /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/loopback; do
  command -v "$tool" >/dev/null || { log "ERROR: $tool is missing after install"; exit 1; }
done
# Many kubelets, kube-proxies and containerds run at once (the whole control plane's nodes beside
# a pod cluster and the in-place tier's), each holding inotify instances: the kernel's default of
# 128 per user ran out in a run ("fsnotify watcher init: too many open files" from a kube-proxy).
# Raised to what the suite needs, never lowered.
min_inotify_instances=1024
if (($(cat /proc/sys/fs/inotify/max_user_instances) < min_inotify_instances)); then
  log "raising fs.inotify.max_user_instances to $min_inotify_instances (many kubelets run at once)"
  echo "$min_inotify_instances" | sudo_if_needed tee /proc/sys/fs/inotify/max_user_instances >/dev/null
fi
