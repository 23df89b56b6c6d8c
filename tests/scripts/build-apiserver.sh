#!/usr/bin/env bash
# Builds kube-apiserver from Debian bookworm's `kubernetes` source package and caches the binary.
# Idempotent: exits at once when the cached binary exists. Prints the binary's path on stdout.
# Why from source: no kind/envtest downloads are reachable here; Debian's source package is.
set -euo pipefail

version=1.20.2
cache="${BOOTPLATE_CACHE:-$HOME/.cache/bootplate}"
out="$cache/kube-apiserver-$version"
log() { echo "build-apiserver: $*" >&2; }

if [[ -x "$out" ]]; then
  echo "$out"
  exit 0
fi

sudo_if_needed() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

mkdir -p "$cache"
src_list=/etc/apt/sources.list.d/bootplate-deb-src.sources
if [[ ! -f "$src_list" ]]; then
  log "adding a deb-src entry for bookworm main"
  sudo_if_needed tee "$src_list" >/dev/null <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  sudo_if_needed apt-get update -qq >&2
fi

need=()
for pkg in golang-1.19-go etcd-server rsync golang-github-modern-go-reflect2-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  log "installing ${need[*]}"
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
fi

work="$cache/build"
mkdir -p "$work"
cd "$work"
if [[ ! -d "kubernetes-$version" ]]; then
  log "downloading the kubernetes source package"
  apt-get source --download-only kubernetes >&2
  rm -rf "kubernetes-$version.partial"
  mkdir "kubernetes-$version.partial"
  orig=$(ls kubernetes_*.orig.tar.gz | head -n1)
  tar -xzf "$orig" -C "kubernetes-$version.partial" --strip-components=1
  mv "kubernetes-$version.partial" "kubernetes-$version"
fi
tree="$work/kubernetes-$version"

# Go 1.19 crashes reflect2 v1.0.1 on the first custom-resource write; Debian ships 1.0.2.
if [[ ! -f "$tree/.bootplate-reflect2-patched" ]]; then
  log "replacing vendored reflect2 with Debian's 1.0.2"
  rm -rf "$tree/vendor/github.com/modern-go/reflect2"
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "$tree/vendor/github.com/modern-go/reflect2"
  touch "$tree/.bootplate-reflect2-patched"
fi

export PATH=/usr/lib/go-1.19/bin:$PATH
export GOCACHE="$cache/gocache"
if [[ ! -f "$tree/.bootplate-generated" ]]; then
  log "generating code (about 40 s)"
  (cd "$tree" && make generated_files >&2)
  touch "$tree/.bootplate-generated"
fi

gopath="$work/gopath"
mkdir -p "$gopath/src/k8s.io"
ln -sfn "$tree" "$gopath/src/k8s.io/kubernetes"
log "building kube-apiserver (3-4 minutes cold)"
(cd "$gopath/src/k8s.io/kubernetes" && GOPATH="$gopath" GO111MODULE=off GOFLAGS= \
  go build -o "$out.tmp" ./cmd/kube-apiserver >&2)
mv "$out.tmp" "$out"
echo "$out"
