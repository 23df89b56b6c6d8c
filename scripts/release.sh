#!/usr/bin/env bash
# Writes what a bootplate release publishes into OUTDIR (created; files in it are replaced):
#
#   bootplate-image-VERSION.oci.tar   the controller image, ghcr.io/bootplate/bootplate:VERSION,
#                                     as an OCI image archive (tests/scripts/build-images.sh)
#   bootplate-image-VERSION.digest    its manifest digest (sha256:...), the one the components pin
#   bootplate-linux-ARCH              the CLI and controller, static (scripts/build-static.sh):
#                                     the image's own /usr/local/bin/bootplate
#   bootplate-agent-linux-ARCH        the node agent, static (agent/build.sh)
#   bootstrap-bootplate/VERSION/bootstrap-components.yaml
#                                     the clusterctl components, the image pinned by digest
#   bootstrap-bootplate/VERSION/metadata.yaml
#                                     clusterctl's metadata (deploy/metadata.yaml)
#   SHA256SUMS                        the checksum of every file above (`sha256sum -c SHA256SUMS`)
#
# bootstrap-bootplate/VERSION/ is laid out as a clusterctl local repository: a providers: entry
# with `url: OUTDIR/bootstrap-bootplate/VERSION/bootstrap-components.yaml` installs from it
# (docs/install.md); on a web server, the two files are the release's assets.
#
#   scripts/release.sh VERSION OUTDIR     # e.g. scripts/release.sh v0.1.0 out/
#
# VERSION is v<the workspace's version>[-prerelease], and deploy/metadata.yaml must map its
# major.minor series to a contract: the script refuses otherwise. Needs cargo, kubectl, umoci and
# skopeo (tests/scripts/install-tools.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
log() { echo "release: $*" >&2; }
fail() { log "ERROR: $*"; exit 2; }
(($# == 2)) || fail "usage: scripts/release.sh VERSION OUTDIR"
version=$1 out=$2
[[ $version =~ ^v([0-9]+)\.([0-9]+)\.([0-9]+)(-[0-9A-Za-z.-]+)?$ ]] ||
  fail "VERSION $version is not v<major>.<minor>.<patch>[-prerelease]"
major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
workspace=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$root/Cargo.toml")
[[ ${version#v} == "$workspace" || ${version#v} == "$workspace"-* ]] ||
  fail "VERSION $version is not the workspace's version $workspace (Cargo.toml [workspace.package])"
# clusterctl refuses a release whose series metadata.yaml does not list; refuse it here first.
python3 - "$root/deploy/metadata.yaml" "$major" "$minor" <<'EOF' ||
import re, sys
path, major, minor = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
series, entry = [], None
for line in open(path):
    item = re.match(r"^\s*(-\s+)?(major|minor|contract):\s*(\S+)", line)
    if not item:
        continue
    if item.group(1):
        entry = {}
        series.append(entry)
    if entry is not None:
        entry[item.group(2)] = item.group(3)
sys.exit(0 if any(e.get("major") == str(major) and e.get("minor") == str(minor) and e.get("contract")
                  for e in series) else 1)
EOF
  fail "deploy/metadata.yaml has no releaseSeries entry (major: $major, minor: $minor, contract) for $version"

case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) arch=$(uname -m) ;;
esac
mkdir -p "$out"
out=$(cd "$out" && pwd)
repository="$out/bootstrap-bootplate/$version"
mkdir -p "$repository"

# The image first: it builds the release binary (scripts/build-static.sh) when its archive is
# not cached. The CLI below is that binary, taken out of the image: one static build serves both,
# and what the release publishes as `bootplate` is byte for byte what its image runs.
cached=$("$root/tests/scripts/build-images.sh" bootplate | sed -n 's/^bootplate=//p')
[[ -n $cached ]] || fail "tests/scripts/build-images.sh built no bootplate image"
image_name=$(sed -n 's/^ *image: *//p' "$root/deploy/manager/manager.yaml")
image_name=${image_name%:*}
archive="$out/bootplate-image-$version.oci.tar"
rm -f "$archive"
log "writing $archive ($image_name:$version)"
skopeo copy --quiet "oci-archive:$cached" "oci-archive:$archive:$image_name:$version"
digest=$(skopeo inspect --format '{{.Digest}}' "oci-archive:$archive")
[[ $digest == sha256:* ]] || fail "skopeo read no digest from $archive: $digest"
echo "$digest" >"$out/bootplate-image-$version.digest"

log "taking the CLI out of the image, building the agent"
binary=usr/local/bin/bootplate
blob() { tar -xOf "$archive" "blobs/sha256/${1#sha256:}"; }
layers=$(blob "$digest" | python3 -c 'import json, sys; print("\n".join(
  l["digest"] for l in json.load(sys.stdin)["layers"]
  if l["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"))')
rm -f "$out/bootplate-linux-$arch"
for layer in $layers; do
  if blob "$layer" | tar -tzf - | grep -x "$binary" >/dev/null; then
    blob "$layer" | tar -xzOf - "$binary" >"$out/bootplate-linux-$arch"
  fi
done
[[ -s $out/bootplate-linux-$arch ]] || fail "no $binary in the image's layers ($archive)"
chmod 0755 "$out/bootplate-linux-$arch"
cp "$("$root/agent/build.sh" | tail -n1)" "$out/bootplate-agent-linux-$arch"

log "writing the clusterctl components ($image_name@$digest) and metadata"
"$root/deploy/build-components.sh" "$repository/bootstrap-components.yaml" "$digest"
cp "$root/deploy/metadata.yaml" "$repository/metadata.yaml"

sums=$(cd "$out" && find . -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort |
  xargs -d '\n' sha256sum)
echo "$sums" >"$out/SHA256SUMS"
log "done: $out"
echo "$out"
