#!/usr/bin/env bash
# Builds the real peers the tests run against, from their Go modules (tests/tools/*/go.mod):
# kube-apiserver and kube-controller-manager (k8s.io/kubernetes; its garbage collector removes
# what ownerReferences say is orphaned, as in any real cluster), kubeadm and kubelet (the same
# module: the real joins run them on the machines bootplate's user-data sets up), kube-scheduler
# and kube-proxy (the management cluster that runs Pods, tests/src/pod_cluster), kubectl (the
# in-cluster client of that cluster's probe image), etcd
# (go.etcd.io/etcd/server/v3) and etcdctl (go.etcd.io/etcd/etcdctl/v3, a tool of the same
# module file: tests/tests/control_plane.rs lists a real etcd's members), the Cluster API manager, clusterctl and the kubeadm bootstrap
# provider's manager (sigs.k8s.io/cluster-api), and the manager of the oldest Cluster API release
# bootplate supports (tests/tools/capi-oldest: scenarios a and b of tests/tests/capi.rs run
# against it too, with its own CRDs and manifests), distribution's container registry
# (tests/tools/registry, the mirror of tests/tests/network.rs), crictl (tests/tools/crictl, the
# CRI client that pulls through that mirror), CoreDNS (the control-plane images of
# tests/scripts/build-images.sh) and Ignition v0.35.0 (the boot proof of Ignition spec 2.x).
#
# Idempotent and cached by version under ${BOOTPLATE_CACHE:-~/.cache/bootplate}: binaries in
# bin/NAME-VERSION, the module and build caches in go/. Once cached it needs no network.
# Prints one NAME=PATH line per tool on stdout; progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/../tools"

cache="${BOOTPLATE_CACHE:-$HOME/.cache/bootplate}"
# No DWARF from the compiler: the binaries are stripped anyway (-ldflags "-s -w"), and a cold
# build of etcd took 12 % less CPU without it (docs/testing.md).
export GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" GOFLAGS="-mod=readonly -buildvcs=false -gcflags=all=-dwarf=false"
export GOTOOLCHAIN=local
mkdir -p "$cache/bin" "$GOMODCACHE" "$GOCACHE"
# One run at a time: a test that asks for the tools while ci.sh still builds them waits here,
# then finds them built.
exec 8>"$cache/bin/.lock"
flock 8
# Each build is a row of the step table (tests/scripts/steps.sh) when BOOTPLATE_STEPS names one.
# shellcheck source=tests/scripts/steps.sh
source ../scripts/steps.sh
log() { echo "build-tools: $*" >&2; }

command -v go >/dev/null || { log "ERROR: go is not on PATH (Go 1.26 is needed)"; exit 2; }

# The version a module requires, read from its go.mod (the one place each version is pinned).
required() { (cd "$1" && go list -m -f '{{.Version}}' "$2"); }

kube_version=$(required kube k8s.io/kubernetes)
etcd_version=$(required etcd go.etcd.io/etcd/server/v3)
capi_version=$(required capi sigs.k8s.io/cluster-api)
capi_oldest_version=$(required capi-oldest sigs.k8s.io/cluster-api)
# v1.11 is the newest cert-manager whose commands are packages of the main module: from v1.12 on
# cmd/controller, cmd/webhook and cmd/cainjector are modules of their own, and the module proxy
# answers 404 for them.
cert_manager_version=$(required cert-manager github.com/cert-manager/cert-manager)

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

cert_manager_ldflags="-s -w -X github.com/cert-manager/cert-manager/pkg/util.AppVersion=$cert_manager_version"

# build NAME VERSION MODULE_DIR PACKAGE LDFLAGS [PRINTED]: builds bin/NAME-VERSION unless it
# exists; prints PRINTED=PATH (PRINTED defaults to NAME).
build() {
  local name=$1 version=$2 dir=$3 package=$4 ldflags=$5 printed=${6:-$1}
  local out="$cache/bin/$name-$version"
  if [[ ! -x "$out" ]]; then
    log "building $name $version from $package (minutes when cold)"
    local started=$SECONDS
    (cd "$dir" && step "  go build $name" go build -trimpath -ldflags "$ldflags" -o "$out.tmp" "$package") >&2
    mv "$out.tmp" "$out"
    log "built $name in $((SECONDS - started)) s"
  fi
  echo "$printed=$out"
}

# build_kube NAME...: the Kubernetes commands k8s.io/kubernetes/cmd/NAME, as bin/NAME-VERSION.
# The missing ones are built by ONE `go build -o DIR` invocation: the commands share most of their
# packages, and one invocation compiles each package once and runs the links side by side.
build_kube() {
  local name missing=() packages=()
  for name in "$@"; do
    [[ -x "$cache/bin/$name-$kube_version" ]] || missing+=("$name")
  done
  if ((${#missing[@]})); then
    log "building ${missing[*]} $kube_version from k8s.io/kubernetes in one go build (minutes when cold)"
    local started=$SECONDS out="$cache/bin/kube-build.tmp"
    rm -rf "$out" && mkdir -p "$out"
    for name in "${missing[@]}"; do packages+=("k8s.io/kubernetes/cmd/$name"); done
    (cd kube && step "  go build ${missing[*]}" go build -trimpath -ldflags "$kube_ldflags" -o "$out/" "${packages[@]}") >&2
    for name in "${missing[@]}"; do mv "$out/$name" "$cache/bin/$name-$kube_version"; done
    rmdir "$out"
    log "built ${missing[*]} in $((SECONDS - started)) s"
  fi
  for name in "$@"; do echo "$name=$cache/bin/$name-$kube_version"; done
}

# The builds run as three chains side by side (the Kubernetes commands; etcd and Cluster API; the
# rest): one `go build` leaves a core idle in its links and its widest packages' compiles, three
# keep both busy (the tests' Rust build runs beside them too, tests/scripts/ci.sh). Each chain's
# NAME=PATH lines are printed in this order once all have ended.
kube_chain() {
  build_kube kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubeadm kubelet kubectl
}

capi_chain() {
build etcd "$etcd_version" etcd . "-s -w"
# etcdctl, at the server's version (tests/tools/etcd/go.mod's tool directive).
build etcdctl "$etcd_version" etcd go.etcd.io/etcd/etcdctl/v3 "-s -w"
# Cluster API's manager is built once, static (its image needs that, see below), and serves as
# the host process too; clusterctl and the kubeadm provider are static as well so that the three
# share one set of compiled packages (a cgo and a static build compile everything twice).
CGO_ENABLED=0 build capi-manager-static "$capi_version" capi sigs.k8s.io/cluster-api/core "$(capi_ldflags "$capi_version")"
echo "capi-manager=$cache/bin/capi-manager-static-$capi_version"
CGO_ENABLED=0 build clusterctl "$capi_version" capi sigs.k8s.io/cluster-api/cmd/clusterctl "$(capi_ldflags "$capi_version")"
CGO_ENABLED=0 build cabpk-manager "$capi_version" capi sigs.k8s.io/cluster-api/bootstrap/kubeadm "$(capi_ldflags "$capi_version")"
# Releases before v1.14 keep the core manager's main package at the module's root.
build capi-manager "$capi_oldest_version" capi-oldest sigs.k8s.io/cluster-api \
  "$(capi_ldflags "$capi_oldest_version")" capi-manager-oldest
}

other_chain() {
# The binaries of the images tests/scripts/build-images.sh builds: Cluster API's manager (above) and
# cert-manager's controller, webhook and CA injector (github.com/cert-manager/cert-manager), and
# `pause` (tests/tools/pause, the repo's own sandbox program). They run on an empty base: static,
# with Go's own resolver (CGO_ENABLED=0), as those projects build their own images.
for command in controller webhook cainjector; do
  CGO_ENABLED=0 build "cert-manager-$command" "$cert_manager_version" cert-manager \
    "github.com/cert-manager/cert-manager/cmd/$command" "$cert_manager_ldflags"
done
# helm, at the version cert-manager itself requires, renders cert-manager's install manifest.
# Static like the three above: built from the same module file, it shares their compiled packages.
CGO_ENABLED=0 build helm "$helm_version" cert-manager helm.sh/helm/v3/cmd/helm "-s -w"
# pause has no version of its own: its sources' digest names the build.
CGO_ENABLED=0 build pause "$pause_version" pause . "-s -w"

# distribution's container registry (github.com/distribution/distribution/v3, tests/tools/registry:
# its root command with the filesystem driver), the TLS mirror containerd pulls through in
# tests/tests/network.rs.
CGO_ENABLED=0 build registry "$registry_version" registry . "-s -w"

# crictl (sigs.k8s.io/cri-tools, tests/tools/crictl), the CRI client: tests/tests/network.rs pulls
# through containerd's CRI plugin with it, the way the kubelet's image pulls go.
CGO_ENABLED=0 build crictl "$crictl_version" crictl sigs.k8s.io/cri-tools/cmd/crictl "-s -w"

# CoreDNS (github.com/coredns/coredns, tests/tools/coredns: coremain with the plugins of kubeadm's
# Corefile), the cluster DNS `kubeadm init` deploys: static, as CoreDNS builds its own image, for
# the control-plane images of tests/scripts/build-images.sh. The plugin list lives in main.go, so
# its digest is part of the build's name.
coredns_build="$coredns_version-$(cat coredns/go.mod coredns/main.go | sha256sum | cut -c1-12)"
CGO_ENABLED=0 build coredns "$coredns_build" coredns . "-s -w"

# Ignition v0.35.0 (github.com/coreos/ignition, tests/tools/ignition-spec2), the last Ignition of
# the spec-2 era: the boot proof runs it on Ignition configs of spec 2.x (the kubeadm bootstrap
# provider writes 2.3), which its Ignition 2.14 refuses (tests/boot/lib/inside.sh picks one by the
# config's version). The module predates Go modules: its go.mod pins the dependencies at the
# commits of Ignition's glide.lock where the module proxy serves them. It needs cgo (libblkid, and
# the user and group lookups it makes in the target root); linked static, as glibc's files NSS
# module is part of libc. It runs chroot from the host, which keeps it in /usr/sbin as Debian does
# (Ignition's default is /usr/bin/chroot, Container Linux's place).
ignition_spec2_ldflags="-s -w -X github.com/coreos/ignition/internal/version.Raw=$ignition_spec2_version
  -X github.com/coreos/ignition/internal/distro.chrootCmd=/usr/sbin/chroot -linkmode external -extldflags -static"
CGO_ENABLED=1 build ignition-spec2 "$ignition_spec2_version" ignition-spec2 github.com/coreos/ignition/internal \
  "$ignition_spec2_ldflags" 2> >(grep -v 'in statically linked applications requires at runtime\|in function' >&2)
}

# The versions every chain reads, resolved before they start.
helm_version=$(required cert-manager helm.sh/helm/v3)
pause_version=$(cat pause/go.mod pause/main.go | sha256sum | cut -c1-16)
registry_version=$(required registry github.com/distribution/distribution/v3)
crictl_version=$(required crictl sigs.k8s.io/cri-tools)
coredns_version=$(required coredns github.com/coredns/coredns)
ignition_spec2_version=$(required ignition-spec2 github.com/coreos/ignition)
chains=$(mktemp -d)
pids=()
for chain in kube_chain capi_chain other_chain; do
  "$chain" >"$chains/$chain" &
  pids+=($!)
done
for pid in "${pids[@]}"; do
  wait "$pid" || { log "ERROR: a build failed (its output above)"; rm -rf "$chains"; exit 1; }
done
cat "$chains/kube_chain" "$chains/capi_chain" "$chains/other_chain"
rm -rf "$chains"

# The last line, cert-manager-manifest=PATH, is cert-manager's static install manifest, rendered
# as its release renders `cert-manager.yaml` (cached as manifests/cert-manager-VERSION.yaml): the
# Namespace, then `helm template` of its chart (deploy/charts) with the CRDs (deploy/crds) as the
# chart's installCRDs template. clusterctl installs cert-manager from such a file
# (`cert-manager: url:` in its configuration), as `kubectl apply -f` does.
# render_cert_manager OUT: cert-manager's static manifest from its module's chart and CRDs.
render_cert_manager() {
  local module chart work
  module=$(cd cert-manager && go list -m -f '{{.Dir}}' github.com/cert-manager/cert-manager)
  work=$(mktemp -d)
  chart="$work/cert-manager"
  cp -r "$module/deploy/charts/cert-manager" "$chart"
  chmod -R u+w "$chart"
  # The release tool sets the chart's version, and puts the CRDs in as one template.
  sed -e "s/^version: .*/version: $cert_manager_version/" \
    -e "s/^appVersion: .*/appVersion: $cert_manager_version/" \
    -e 's/{{IS_PRERELEASE}}/false/' "$chart/Chart.template.yaml" >"$chart/Chart.yaml"
  {
    echo '{{- if .Values.installCRDs }}'
    for crd in "$module"/deploy/crds/crd-*.yaml; do echo '---'; cat "$crd"; done
    echo '{{- end }}'
  } >"$chart/templates/crds.yaml"
  {
    cat "$module/deploy/manifests/namespace.yaml"
    "$cache/bin/helm-$helm_version" template cert-manager "$chart" --namespace cert-manager \
      --kube-version "$kube_version" --set installCRDs=true --set startupapicheck.enabled=false
  } >"$1.tmp"
  rm -rf "$work"
  mv "$1.tmp" "$1"
}
manifest="$cache/manifests/cert-manager-$cert_manager_version.yaml"
if [[ ! -s "$manifest" ]]; then
  log "rendering cert-manager's manifest $cert_manager_version"
  mkdir -p "$cache/manifests"
  render_cert_manager "$manifest"
fi
echo "cert-manager-manifest=$manifest"
