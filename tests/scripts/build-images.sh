#!/usr/bin/env bash
# Builds the container images of the management cluster that runs Pods, with no registry: each
# is an OCI image archive (an OCI layout in a tar, `ctr -n k8s.io images import ARCHIVE` takes
# it), named as the manifests that run it name it, so that nothing needs an edit:
#
#   pause        the sandbox image `kubeadm config images list` names (registry.k8s.io/pause:3.10.2
#                for kubeadm v1.37; set it as containerd's sandbox_image): tests/tools/pause, on an
#                empty base
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, coredns
#                the control plane `kubeadm init` runs as static Pods and add-ons, each named as
#                `kubeadm config images list --kubernetes-version V [--image-repository REPO]`
#                names it (V the built kubeadm's version; those names, never tags written here):
#                the built binary as /usr/local/bin/NAME, its entrypoint (CoreDNS: /coredns, as
#                CoreDNS's own image), user root. The Kubernetes commands and etcd are linked
#                against the C library (see build-tools.sh): it and its loader are in the image.
#                etcd's tag is the one kubeadm pins, whatever etcd release build-tools.sh builds
#                (likewise CoreDNS's); `--version` tells the binary's own.
#   bootplate    ghcr.io/bootplate/bootplate:v0.1.0 (deploy/manager/manager.yaml): the release
#                binary, static (scripts/build-static.sh), as the Dockerfile's image: same path,
#                entrypoint, command and user; a test compares the two
#   capi-manager registry.k8s.io/cluster-api/cluster-api-controller:CAPI_VERSION, entrypoint
#                /manager, user 65532, as Cluster API's own image
#   cert-manager-controller, -webhook, -cainjector
#                quay.io/jetstack/cert-manager-NAME:CERT_MANAGER_VERSION, entrypoint
#                /app/cmd/NAME/NAME, user 1000, as cert-manager's hack/containers/Containerfile.NAME
#   probe        bootplate.invalid/probe:KUBE_VERSION: BusyBox as /bin/sh and the built kubectl,
#                the pod cluster test's server and in-cluster client (tests/tests/pod_cluster.rs)
#
# The images are built with umoci (an empty image, the files copied into its unpacked root,
# repacked as one layer: Debian's umoci 0.4.7 writes `umoci insert` layers without the tar's end
# blocks, which GNU tar refuses) and written as archives with skopeo, both from Debian
# (tests/scripts/install-tools.sh); the binaries come from tests/scripts/build-tools.sh. Every
# timestamp in an image is the epoch, so the same inputs give the same image digest.
#
# Idempotent and cached by the digest of each image's inputs (the binary, or for bootplate the
# source tree and Cargo.lock, and this script) under ${BOOTPLATE_CACHE:-~/.cache/bootplate}/images/.
# Prints one NAME=ARCHIVE line per image on stdout; progress goes to stderr.
#
#   tests/scripts/build-images.sh [--image-repository REPO] [NAME...]   # all images, or those named
#
# --image-repository is kubeadm's flag (and ClusterConfiguration's imageRepository): the repository
# kubeadm's names are in, registry.k8s.io unless given.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cache="${BOOTPLATE_CACHE:-$HOME/.cache/bootplate}"
images="$cache/images"
mkdir -p "$images"
log() { echo "build-images: $*" >&2; }
# One build at a time (tests run it in parallel): the second waits, then finds the archives.
exec 9>"$images/.lock"
flock 9
for tool in umoci skopeo; do
  command -v "$tool" >/dev/null || { log "ERROR: $tool is missing (tests/scripts/install-tools.sh)"; exit 2; }
done
# The epoch, for every timestamp umoci writes (the files' own are set the same way).
epoch=1970-01-01T00:00:00Z
script_digest=$(sha256sum "$0" | cut -c1-64)
umoci_flags=()
(($(id -u) == 0)) || umoci_flags=(--rootless)

tool() { sed -n "s/^$1=//p" <<<"$tools"; }
version_of() { basename "$(tool "$1")" | sed "s/^$1-//"; }

# The digest of bootplate's inputs: what its release binary is compiled from, and how.
bootplate_inputs() {
  cd "$root"
  find Cargo.toml Cargo.lock crd-types render controller templates docs/templates.md \
    scripts/build-static.sh -type f -not -path '*/target/*' -print0 |
    sort -z | xargs -0 sha256sum | sha256sum | cut -c1-64
}

# assemble ARCHIVE REF USER ENTRYPOINT CMD(space-separated, may be empty) SRC:DEST...
# Builds the image in a scratch layout beside the cache and writes it as ARCHIVE. A SRC of
# @bootplate is the release binary, built now.
assemble() {
  local archive=$1 ref=$2 user=$3 entrypoint=$4 cmd=$5
  shift 5
  local work
  work=$(mktemp -d "$images/.build.XXXXXX")
  # shellcheck disable=SC2064 # the directory is known now
  trap "rm -rf '$work'; trap - RETURN" RETURN
  umoci init --layout "$work/layout"
  umoci new --image "$work/layout:image"
  umoci unpack "${umoci_flags[@]}" --image "$work/layout:image" "$work/bundle" >&2
  local pair src dest
  for pair in "$@"; do
    src=${pair%%:*} dest=$work/bundle/rootfs${pair#*:}
    [[ $src != @bootplate ]] || src=$("$root/scripts/build-static.sh" bootplate bootplate release | tail -n1)
    mkdir -p "$(dirname "$dest")"
    cp "$src" "$dest"
  done
  # Readable (and the programs runnable) by the image's non-root user, whatever the umask was.
  chmod -R a+rX "$work/bundle/rootfs"
  find "$work/bundle/rootfs" -exec touch -h -d @0 {} +
  umoci repack "${umoci_flags[@]}" --history.created "$epoch" --history.created_by build-images.sh \
    --image "$work/layout:image" "$work/bundle" >&2
  local config=(--created "$epoch" --history.created "$epoch" --history.created_by build-images.sh
    --config.user "$user" --config.entrypoint "$entrypoint"
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
  local arg
  for arg in $cmd; do config+=(--config.cmd "$arg"); done
  umoci config "${config[@]}" --image "$work/layout:image"
  umoci gc --layout "$work/layout"
  rm -f "$archive.tmp"
  skopeo copy --quiet "oci:$work/layout:image" "oci-archive:$archive.tmp:$ref"
  mv "$archive.tmp" "$archive"
}

# image NAME KEY REF USER ENTRYPOINT CMD SRC:DEST...: prints NAME=ARCHIVE, building the archive
# unless one with the same input digest exists. The digest covers KEY (what @bootplate is built
# from), every other SRC's content, the arguments and this script.
image() {
  local name=$1 key=$2
  local pair inputs=("$key" "$script_digest" "$*")
  for pair in "${@:7}"; do
    [[ ${pair%%:*} == @bootplate ]] || inputs+=("$(sha256sum <"${pair%%:*}")")
  done
  local digest
  digest=$(printf '%s\n' "${inputs[@]}" | sha256sum | cut -c1-16)
  local archive="$images/$name-$digest.tar"
  if [[ ! -s "$archive" ]]; then
    log "building $name ($3)"
    assemble "$archive" "${@:3}"
  fi
  echo "$name=$archive"
}

repository=()
if [[ ${1:-} == --image-repository ]]; then
  [[ -n ${2:-} ]] || { log "ERROR: --image-repository needs a repository"; exit 2; }
  repository=(--image-repository "$2")
  shift 2
fi
wanted() { ((${#selected[@]} == 0)) || [[ " ${selected[*]} " == *" $1 "* ]]; }
selected=("$@")
control_plane=(etcd kube-apiserver kube-controller-manager kube-scheduler kube-proxy coredns)
known=(pause bootplate capi-manager cert-manager-controller cert-manager-webhook cert-manager-cainjector probe
  "${control_plane[@]}")
for name in "${selected[@]}"; do
  [[ " ${known[*]} " == *" $name "* ]] || { log "ERROR: no image $name (images: ${known[*]})"; exit 2; }
done
# Every image but bootplate's holds a binary of build-tools.sh (which a release needs none of).
tools=""
for name in "${known[@]}"; do
  if [[ $name != bootplate ]] && wanted "$name"; then
    tools=$("$root/tests/scripts/build-tools.sh")
    break
  fi
done

# The reference kubeadm's image list gives each image, by the list's last path element, tag
# stripped (registry.k8s.io/coredns/coredns:v1.14.6 is coredns's).
declare -A kubeadm_ref=()
if [[ -n $tools ]]; then
  kubeadm_list=$("$(tool kubeadm)" config images list --kubernetes-version "$(version_of kubeadm)" \
    "${repository[@]}")
  while read -r ref; do
    last=${ref##*/}
    kubeadm_ref[${last%%:*}]=$ref
  done <<<"$kubeadm_list"
fi
# ref_of NAME: kubeadm's reference for NAME, or fails (call it as `ref=$(ref_of NAME)`, which
# stops the script).
ref_of() {
  [[ -n ${kubeadm_ref[$1]:-} ]] || { log "ERROR: kubeadm config images list names no $1: $kubeadm_list"; exit 2; }
  echo "${kubeadm_ref[$1]}"
}
# The C library and loader the cgo-enabled builds (the Kubernetes commands, etcd) are linked to.
glibc=(/lib64/ld-linux-x86-64.so.2:/lib64/ld-linux-x86-64.so.2
  /lib/x86_64-linux-gnu/libc.so.6:/lib/x86_64-linux-gnu/libc.so.6)

if wanted pause; then
  ref=$(ref_of pause)
  image pause "" "$ref" 65535:65535 /pause "" "$(tool pause):/pause"
fi
for name in etcd kube-apiserver kube-controller-manager kube-scheduler kube-proxy; do
  wanted "$name" || continue
  ref=$(ref_of "$name")
  image "$name" "" "$ref" 0:0 "/usr/local/bin/$name" "" \
    "$(tool "$name"):/usr/local/bin/$name" "${glibc[@]}"
done
if wanted coredns; then
  ref=$(ref_of coredns)
  image coredns "" "$ref" 0:0 /coredns "" "$(tool coredns):/coredns"
fi
if wanted bootplate; then
  # The image the shipped manifests name, and what the Dockerfile's final stage holds: the binary,
  # and the CA bundle of its distroless base (for generators called without a caBundle).
  bootplate_ref=$(sed -n 's/^ *image: *//p' "$root/deploy/manager/manager.yaml")
  image bootplate "$(bootplate_inputs)" "$bootplate_ref" 65532:65532 /usr/local/bin/bootplate run \
    @bootplate:/usr/local/bin/bootplate \
    /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt
fi
if wanted capi-manager; then
  image capi-manager "" \
    "registry.k8s.io/cluster-api/cluster-api-controller:$(version_of capi-manager-static)" \
    65532:65532 /manager "" "$(tool capi-manager-static):/manager"
fi
if wanted probe; then
  # The pod cluster's probe (tests/tests/pod_cluster.rs): BusyBox (its shell, whose applets it
  # prefers to anything on PATH: httpd, wget, hostname...) as /bin/sh, and the built kubectl as
  # an in-cluster client, with the C library and loader it is linked against (the Kubernetes
  # commands are built in one cgo-enabled go build; see build-tools.sh).
  image probe "" "bootplate.invalid/probe:$(version_of kubectl)" 0:0 /bin/sh "" \
    /bin/busybox:/bin/sh "$(tool kubectl):/bin/kubectl" "${glibc[@]}"
fi
for command in controller webhook cainjector; do
  wanted "cert-manager-$command" || continue
  image "cert-manager-$command" "" \
    "quay.io/jetstack/cert-manager-$command:$(version_of "cert-manager-$command")" 1000 \
    "/app/cmd/$command/$command" "" "$(tool "cert-manager-$command"):/app/cmd/$command/$command"
done
