#!/usr/bin/env bash
# Builds the real peers the tests run against, from their Go modules (tests/tools/*/go.mod):
# kube-apiserver and kube-controller-manager (k8s.io/kubernetes; its garbage collector removes
# what ownerReferences say is orphaned, as in any real cluster), kubeadm and kubelet (the same
# module: the real joins run them on the machines bootplate's user-data sets up), etcd
# (go.etcd.io/etcd/server/v3), the Cluster API manager, clusterctl and the kubeadm bootstrap
# provider's manager (sigs.k8s.io/cluster-api), and the manager of the oldest Cluster API release
# bootplate supports (tests/tools/capi-oldest: scenarios a and b of tests/tests/capi.rs run
# against it too, with its own CRDs and manifests).
#
# Idempotent and cached by version under ${BOOTPLATE_CACHE:-~/.cache/bootplate}: binaries in
# bin/NAME-VERSION, the module and build caches in go/. Once cached it needs no network.
# Prints one NAME=PATH line per tool on stdout; progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/../tools"

cache="${BOOTPLATE_CACHE:-$HOME/.cache/bootplate}"
export GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" GOFLAGS="-mod=readonly -buildvcs=false"
export GOTOOLCHAIN=local
mkdir -p "$cache/bin" "$GOMODCACHE" "$GOCACHE"
log() { echo "build-tools: $*" >&2; }

command -v go >/dev/null || { log "ERROR: go is not on PATH (Go 1.26 is needed)"; exit 2; }

# The version a module requires, read from its go.mod (the one place each version is pinned).
required() { (cd "$1" && go list -m -f '{{.Version}}' "$2"); }

kube_version=$(required kube k8s.io/kubernetes)
etcd_version=$(required etcd go.etcd.io/etcd/server/v3)
capi_version=$(required capi sigs.k8s.io/cluster-api)
capi_oldest_version=$(required capi-oldest sigs.k8s.io/cluster-api)

kube_minor=${kube_version#v1.}
kube_minor=${kube_minor%%.*}
kube_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$kube_version
  -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$kube_minor
  -X k8s.io/component-base/version.gitTreeState=clean
  -X k8s.io/client-go/pkg/version.gitVersion=$kube_version"
capi_ldflags() {
  echo "-s -w -X sigs.k8s.io/cluster-api/version.gitVersion=$1
  -X sigs.k8s.io/cluster-api/version.gitMajor=1
  -X sigs.k8s.io/cluster-api/version.gitTreeState=clean"
}

# build NAME VERSION MODULE_DIR PACKAGE LDFLAGS [PRINTED]: builds bin/NAME-VERSION unless it
# exists; prints PRINTED=PATH (PRINTED defaults to NAME).
build() {
  local name=$1 version=$2 dir=$3 package=$4 ldflags=$5 printed=${6:-$1}
  local out="$cache/bin/$name-$version"
  if [[ ! -x "$out" ]]; then
    log "building $name $version from $package (minutes when cold)"
    local started=$SECONDS
    (cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$out.tmp" "$package") >&2
    mv "$out.tmp" "$out"
    log "built $name in $((SECONDS - started)) s"
  fi
  echo "$printed=$out"
}

build kube-apiserver "$kube_version" kube k8s.io/kubernetes/cmd/kube-apiserver "$kube_ldflags"
build kube-controller-manager "$kube_version" kube k8s.io/kubernetes/cmd/kube-controller-manager "$kube_ldflags"
build kubeadm "$kube_version" kube k8s.io/kubernetes/cmd/kubeadm "$kube_ldflags"
build kubelet "$kube_version" kube k8s.io/kubernetes/cmd/kubelet "$kube_ldflags"
build etcd "$etcd_version" etcd . "-s -w"
build capi-manager "$capi_version" capi sigs.k8s.io/cluster-api/core "$(capi_ldflags "$capi_version")"
build clusterctl "$capi_version" capi sigs.k8s.io/cluster-api/cmd/clusterctl "$(capi_ldflags "$capi_version")"
build cabpk-manager "$capi_version" capi sigs.k8s.io/cluster-api/bootstrap/kubeadm "$(capi_ldflags "$capi_version")"
# Releases before v1.14 keep the core manager's main package at the module's root.
build capi-manager "$capi_oldest_version" capi-oldest sigs.k8s.io/cluster-api \
  "$(capi_ldflags "$capi_oldest_version")" capi-manager-oldest
