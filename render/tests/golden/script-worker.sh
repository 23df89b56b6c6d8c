#!/bin/bash
# Rendered by bootplate from ClusterBootstrapTemplate golden (revision 4cf3b76b9cbb301b) for role worker.
set -euo pipefail

# bootplate_write_file PATH MODE OWNER ENCODING: write stdin to PATH.
bootplate_write_file() {
  mkdir -p -- "$(dirname -- "$1")"
  case "$4" in
    base64) (umask 077 && base64 -d > "$1") ;;
    gzip+base64) (umask 077 && base64 -d | gzip -d > "$1") ;;
    *) (umask 077 && cat > "$1") ;;
  esac
  chown -- "$3" "$1"
  chmod -- "$2" "$1"
}
bootplate_write_file '/etc/modules-load.d/k8s.conf' '0644' 'root:root' plain <<'BOOTPLATE_EOF'
overlay
br_netfilter
BOOTPLATE_EOF
bootplate_write_file '/usr/local/bin/bootplate-hello' '0755' 'root:root' base64 <<'BOOTPLATE_EOF'
IyEvYmluL3NoCmVjaG8gaGVsbG8K
BOOTPLATE_EOF
bootplate_write_file '/etc/bootplate/greeting' '0644' 'root:root' gzip+base64 <<'BOOTPLATE_EOF'
H4sIAAAAAAAC/0vOzy0oSi0uTk1RSC9KTS3JzEvnAgAtfs3lFAAAAA==
BOOTPLATE_EOF
bootplate_write_file '/run/kubeadm/kubeadm.yaml' '0600' 'root:root' plain <<'BOOTPLATE_EOF'
apiVersion: kubeadm.k8s.io/v1beta4
kind: JoinConfiguration
nodeRegistration:
  name: "sample-cluster-worker-0"
  kubeletExtraArgs:
    - name: node-labels
      value: "tier=general"
discovery:
  bootstrapToken:
    apiServerEndpoint: "sample-cluster.example.invalid:6443"
    token: "sample.notarealtoken000"
    caCertHashes: ["sha256:0000000000000000000000000000000000000000000000000000000000000000"]
BOOTPLATE_EOF
bootplate_write_file '/etc/motd' '0644' 'root:root' plain <<'BOOTPLATE_EOF'
Provisioned by bootplate.
BOOTPLATE_EOF
bootplate_write_file '/etc/bootplate/no-final-newline' '0640' 'root' base64 <<'BOOTPLATE_EOF'
bm8gZmluYWwgbmV3bGluZQ==
BOOTPLATE_EOF
bootplate_write_file '/etc/systemd/system/containerd.service.d/10-proxy.conf' '0644' 'root:root' plain <<'BOOTPLATE_EOF'
[Service]
Environment=HTTP_PROXY="http://proxy.example.invalid:3128" HTTPS_PROXY="http://proxy.example.invalid:3128"
BOOTPLATE_EOF
bootplate_write_file '/etc/systemd/system/bootplate-example.service' '0644' 'root:root' plain <<'BOOTPLATE_EOF'
[Unit]
Description=Example unit written but not enabled

[Service]
ExecStart=/usr/local/bin/bootplate-hello
BOOTPLATE_EOF

systemctl daemon-reload
echo pre-command
apt-get update
apt-get install -y kubelet='1.31.0'-* kubeadm='1.31.0'-*
kubeadm join --config /run/kubeadm/kubeadm.yaml
echo post-command
systemctl enable 'containerd.service'
mkdir -p /run/cluster-api
echo success > /run/cluster-api/bootstrap-success.complete
