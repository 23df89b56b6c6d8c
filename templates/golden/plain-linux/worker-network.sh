#!/bin/bash
# Rendered by bootplate from ClusterBootstrapTemplate plain-linux (revision 013566f345766a4c) for role worker.
set -euo pipefail

set -e
# Part network. bootplate_put PATH MODE TEXT: writes TEXT to PATH when it differs
# (through a temporary file renamed over it); false when PATH already held TEXT.
bootplate_put() {
  if [ -f "$1" ] && printf '%s' "$3" | cmp -s - "$1"; then return 1; fi
  { install -d -m 0755 "${1%/*}" && printf '%s' "$3" >"$1.bootplate-new" &&
    chmod "$2" "$1.bootplate-new" && mv -f "$1.bootplate-new" "$1"; } ||
    { echo "bootplate: network: cannot write $1" >&2; exit 1; }
}
# bootplate_drop PATH: removes PATH; false when it was not there.
bootplate_drop() {
  if [ ! -e "$1" ]; then return 1; fi
  rm -f "$1"
}
restart_containerd=
has_containerd=
if containerd --version >/dev/null 2>&1; then has_containerd=1; fi
# Extra CA bundles (network.caBundles) in the trust store, with the distribution's
# tool: update-ca-trust on the RHEL family (/etc/pki/ca-trust), update-ca-certificates
# with SUSE's anchors (/etc/pki/trust) or Debian's; bundles an earlier input named and
# this one does not are removed.
if [ -d /etc/pki/ca-trust/source ]; then
  anchors=/etc/pki/ca-trust/source/anchors trust_tool=update-ca-trust
elif [ -d /etc/pki/trust ]; then
  anchors=/etc/pki/trust/anchors trust_tool=update-ca-certificates
else
  anchors=/usr/local/share/ca-certificates trust_tool=update-ca-certificates
fi
keep=" bootplate-corp.crt "
if command -v "$trust_tool" >/dev/null 2>&1; then
  trust_changed=
  for old in "$anchors"/bootplate-*.crt; do
    case "$keep" in
      *" ${old##*/} "*) ;;
      *) if bootplate_drop "$old"; then trust_changed=1; fi ;;
    esac
  done
  if bootplate_put "$anchors/bootplate-corp.crt" 0644 '-----BEGIN CERTIFICATE-----
MIIBrjCCAVOgAwIBAgIUPsDlyARalflHm0C5777Bd1ugaMowCgYIKoZIzj0EAwIw
KzEpMCcGA1UEAwwgYm9vdHBsYXRlIHNhbXBsZSAobm90IGEgcmVhbCBDQSkwIBcN
MjYxMjAyMDUxNzU1WhgPMjEyNjExMDgwNTE3NTVaMCsxKTAnBgNVBAMMIGJvb3Rw
bGF0ZSBzYW1wbGUgKG5vdCBhIHJlYWwgQ0EpMFkwEwYHKoZIzj0CAQYIKoZIzj0D
AQcDQgAEyPhRhj+6PJsDPakwN0WoZ747Xo/oBThpXX+rr/VZg/0irHUZxKmK+Wxi
IVEMeRsZvoNkwbktOBdFuTc0kr1NuKNTMFEwHQYDVR0OBBYEFJqJ2dkcQ4AAq0OD
ntHFzx9eRITZMB8GA1UdIwQYMBaAFJqJ2dkcQ4AAq0ODntHFzx9eRITZMA8GA1Ud
EwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSQAwRgIhAIK3rbMo/z372bQ7L4YNxnNM
AL7H2VFFj7seGzTfhixXAiEAyA6tBdBaQH1iBKSETuKq2m/4bKcfF/QVdN55msbU
w6M=
-----END CERTIFICATE-----
'; then trust_changed=1; fi
  if [ -n "$trust_changed" ]; then
    $trust_tool >/dev/null
    restart_containerd=1
  fi
elif [ "$keep" != " " ]; then
  echo "bootplate: network.caBundles: no $trust_tool on this image" >&2
  exit 1
fi
# Registry hosts (network.registryMirrors): only with containerd, a directory per
# registry under its config_path. Directories an earlier input wrote (marked) go first.
if [ -n "$has_containerd" ]; then
  for old in /etc/containerd/certs.d/*/.bootplate-network; do
    if [ -f "$old" ]; then rm -rf "${old%/.bootplate-network}"; fi
  done
  install -d -m 0755 '/etc/containerd/certs.d/registry.k8s.io'
  : >'/etc/containerd/certs.d/registry.k8s.io'/.bootplate-network
  bootplate_put '/etc/containerd/certs.d/registry.k8s.io/mirror-0-ca.crt' '0644' '-----BEGIN CERTIFICATE-----
MIIBrjCCAVOgAwIBAgIUPsDlyARalflHm0C5777Bd1ugaMowCgYIKoZIzj0EAwIw
KzEpMCcGA1UEAwwgYm9vdHBsYXRlIHNhbXBsZSAobm90IGEgcmVhbCBDQSkwIBcN
MjYxMjAyMDUxNzU1WhgPMjEyNjExMDgwNTE3NTVaMCsxKTAnBgNVBAMMIGJvb3Rw
bGF0ZSBzYW1wbGUgKG5vdCBhIHJlYWwgQ0EpMFkwEwYHKoZIzj0CAQYIKoZIzj0D
AQcDQgAEyPhRhj+6PJsDPakwN0WoZ747Xo/oBThpXX+rr/VZg/0irHUZxKmK+Wxi
IVEMeRsZvoNkwbktOBdFuTc0kr1NuKNTMFEwHQYDVR0OBBYEFJqJ2dkcQ4AAq0OD
ntHFzx9eRITZMB8GA1UdIwQYMBaAFJqJ2dkcQ4AAq0ODntHFzx9eRITZMA8GA1Ud
EwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSQAwRgIhAIK3rbMo/z372bQ7L4YNxnNM
AL7H2VFFj7seGzTfhixXAiEAyA6tBdBaQH1iBKSETuKq2m/4bKcfF/QVdN55msbU
w6M=
-----END CERTIFICATE-----
' || true
  bootplate_put '/etc/containerd/certs.d/registry.k8s.io/hosts.toml' '0644' 'server = "https://registry.k8s.io"

[host."https://mirror.corp.example:5000"]
  capabilities = ["pull", "resolve"]
  ca = "/etc/containerd/certs.d/registry.k8s.io/mirror-0-ca.crt"

' || true
else
  echo "bootplate: network.registryMirrors: containerd is not installed; no hosts.toml written" >&2
fi
# Proxy (network.proxy): /etc/environment (pam_env reads it at login) as a marked
# block, and containerd's drop-in when containerd is installed.
touch /etc/environment
sed '/^# BEGIN bootplate network.proxy$/,/^# END bootplate network.proxy$/d' /etc/environment \
  >/etc/environment.bootplate-new
{ echo '# BEGIN bootplate network.proxy'; printf '%s' 'HTTP_PROXY=http://proxy.corp.example:3128
http_proxy=http://proxy.corp.example:3128
HTTPS_PROXY=http://proxy.corp.example:3128
https_proxy=http://proxy.corp.example:3128
NO_PROXY=localhost,127.0.0.1,::1,192.168.0.0/16,10.96.0.0/12,.svc,.cluster.local,api.demo.example.com,demo-bastion-0,.corp.example
no_proxy=localhost,127.0.0.1,::1,192.168.0.0/16,10.96.0.0/12,.svc,.cluster.local,api.demo.example.com,demo-bastion-0,.corp.example
'
  echo '# END bootplate network.proxy'; } >>/etc/environment.bootplate-new
chmod 0644 /etc/environment.bootplate-new
mv -f /etc/environment.bootplate-new /etc/environment
dropin=/etc/systemd/system/containerd.service.d/20-bootplate-network-proxy.conf
if [ -n "$has_containerd" ] && bootplate_put "$dropin" 0644 '[Service]
Environment="HTTP_PROXY=http://proxy.corp.example:3128"
Environment="http_proxy=http://proxy.corp.example:3128"
Environment="HTTPS_PROXY=http://proxy.corp.example:3128"
Environment="https_proxy=http://proxy.corp.example:3128"
Environment="NO_PROXY=localhost,127.0.0.1,::1,192.168.0.0/16,10.96.0.0/12,.svc,.cluster.local,api.demo.example.com,demo-bastion-0,.corp.example"
Environment="no_proxy=localhost,127.0.0.1,::1,192.168.0.0/16,10.96.0.0/12,.svc,.cluster.local,api.demo.example.com,demo-bastion-0,.corp.example"
'; then
  systemctl daemon-reload
  restart_containerd=1
fi
# Time servers (network.ntpServers): chrony where it is installed (a sources file in
# Debian's sources.d, or /etc/chrony.d named by sourcedir on the RHEL and SUSE
# families), else systemd-timesyncd.
set -- 'ntp1.corp.example' '10.0.0.1'
for server in "$@"; do
  case "$server" in
    '' | -* | *[!A-Za-z0-9.:-]*) echo "bootplate: network.ntpServers: a server is not a host name or address" >&2; exit 1 ;;
  esac
done
if command -v chronyc >/dev/null 2>&1; then
  ntp_text=$(printf 'server %s iburst\n' "$@"; echo .)
  if [ -f /etc/chrony.conf ]; then
    ntp_dir=/etc/chrony.d ntp_conf=/etc/chrony.conf ntp_reload="systemctl try-restart chronyd"
  else
    ntp_dir=/etc/chrony/sources.d ntp_conf='' ntp_reload="chronyc reload sources"
  fi
  ntp_file=$ntp_dir/bootplate-network.sources
else
  ntp_text=$(printf '[Time]\nNTP=%s\n' "$*"; echo .)
  ntp_file=/etc/systemd/timesyncd.conf.d/bootplate-network.conf ntp_dir='' ntp_conf=''
  ntp_reload="systemctl try-restart systemd-timesyncd"
fi
ntp_changed=
if [ "$#" -gt 0 ]; then
  if bootplate_put "$ntp_file" 0644 "${ntp_text%.}"; then ntp_changed=1; fi
  if [ -n "$ntp_conf" ] && ! grep -qs "^sourcedir $ntp_dir\$" "$ntp_conf"; then
    echo "sourcedir $ntp_dir" >>"$ntp_conf"
    ntp_changed=1
  fi
elif bootplate_drop "$ntp_file"; then
  ntp_changed=1
fi
if [ -n "$ntp_changed" ]; then $ntp_reload >/dev/null; fi
# containerd reads the trust store and its environment when it starts.
if [ -n "$restart_containerd" ] && systemctl is-active --quiet containerd; then
  systemctl restart containerd
fi
# Part system: the host name and the packages.
hostname='demo-bastion-0'
case "$hostname" in
  '' | -* | *[!A-Za-z0-9.-]*) echo "bootplate: hostname: not a host name" >&2; exit 1 ;;
esac
if command -v hostnamectl >/dev/null 2>&1; then
  hostnamectl set-hostname "$hostname"
else
  echo "$hostname" >/etc/hostname
  hostname "$hostname"
fi
packages=()
for package in "${packages[@]}"; do
  case "$package" in
    '' | -* | *[!A-Za-z0-9.+_:=~*-]*) echo "bootplate: packages: not a package name" >&2; exit 1 ;;
  esac
done
if ((${#packages[@]})); then
  if command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q "${packages[@]}"
  elif command -v dnf >/dev/null 2>&1; then
    dnf install -y -q "${packages[@]}"
  elif command -v zypper >/dev/null 2>&1; then
    zypper --non-interactive install "${packages[@]}"
  else
    echo "bootplate: packages: no apt-get, dnf or zypper on this image" >&2
    exit 1
  fi
fi
# Part users: accounts with their SSH keys (variable users).
# bootplate_user NAME SUDO SHELL GROUPS KEY...: creates or updates the user NAME, with
# the keys KEY... as its only authorized SSH keys.
bootplate_user() {
  local name=$1 sudo=$2 shell=$3 groups=$4 home key
  shift 4
  if [[ ! $name =~ ^[a-z_][a-z0-9_-]{0,31}$ ]]; then
    echo "bootplate: users: a name is not a user name" >&2
    return 1
  fi
  if [[ ! $shell =~ ^/[A-Za-z0-9/._-]+$ ]]; then
    echo "bootplate: users: a shell is not a path" >&2
    return 1
  fi
  if [[ ! $groups =~ ^[a-z0-9_,-]*$ ]]; then
    echo "bootplate: users: a group is not a group name" >&2
    return 1
  fi
  for key in "$@"; do
    if [[ $key == *[$'\n\r']* ]]; then
      echo "bootplate: users: an SSH key spans lines" >&2
      return 1
    fi
  done
  if id -u "$name" >/dev/null 2>&1; then
    usermod --shell "$shell" "$name"
  else
    useradd --create-home --shell "$shell" "$name"
  fi
  if [[ -n $groups ]]; then
    usermod --append --groups "$groups" "$name"
  fi
  home=$(getent passwd "$name" | cut -d: -f6) || true
  home=${home:-/home/$name}
  install -d -m 0700 "$home/.ssh"
  if (($#)); then printf '%s\n' "$@"; fi >"$home/.ssh/authorized_keys"
  chmod 0600 "$home/.ssh/authorized_keys"
  chown -R "$name:" "$home/.ssh"
  if [[ $sudo == true ]]; then
    install -d -m 0750 /etc/sudoers.d
    printf '%s ALL=(ALL) NOPASSWD:ALL\n' "$name" >"/etc/sudoers.d/90-bootplate-$name"
    chmod 0440 "/etc/sudoers.d/90-bootplate-$name"
    visudo -c -q -f "/etc/sudoers.d/90-bootplate-$name"
  fi
}
# Part service: one systemd service from the variables serviceName, serviceDescription,
# serviceCommand, serviceUser and serviceEnvironment. Its command runs from a wrapper
# script that holds every argument quoted: no shell and no systemd syntax sees them.
service_name=''
service_description=''
service_user='root'
service_command=()
service_environment=()
if [[ -n $service_name ]]; then
  if [[ ! $service_name =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*$ ]]; then
    echo "bootplate: serviceName: not a unit name" >&2
    exit 1
  fi
  if [[ $service_description == *[$'\n\r%\\']* ]]; then
    echo "bootplate: serviceDescription: not one line of plain text" >&2
    exit 1
  fi
  if [[ ! $service_user =~ ^[a-z_][a-z0-9_-]*$ ]]; then
    echo "bootplate: serviceUser: not a user name" >&2
    exit 1
  fi
  if ((${#service_command[@]} == 0)); then
    echo "bootplate: serviceCommand: empty, but serviceName is set" >&2
    exit 1
  fi
  if ! id -u "$service_user" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin "$service_user"
  fi
  wrapper=/usr/local/libexec/bootplate/$service_name
  install -d -m 0755 /usr/local/libexec/bootplate
  {
    echo '#!/bin/bash'
    echo "# $service_name.service: written by bootplate from serviceCommand and serviceEnvironment."
    for ((i = 0; i < ${#service_environment[@]}; i += 2)); do
      if [[ ! ${service_environment[i]} =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
        echo "bootplate: serviceEnvironment: a name is not a variable name" >&2
        exit 1
      fi
      printf 'export %s=%q\n' "${service_environment[i]}" "${service_environment[i + 1]}"
    done
    printf 'exec'
    printf ' %q' "${service_command[@]}"
    printf '\n'
  } >"$wrapper"
  chmod 0755 "$wrapper"
  {
    echo '[Unit]'
    echo "Description=$service_description"
    echo 'Wants=network-online.target'
    echo 'After=network-online.target'
    echo
    echo '[Service]'
    echo "User=$service_user"
    echo "ExecStart=$wrapper"
    echo 'Restart=on-failure'
    echo
    echo '[Install]'
    echo 'WantedBy=multi-user.target'
  } >"/etc/systemd/system/$service_name.service"
  systemctl daemon-reload
  systemctl enable --now "$service_name.service"
fi
mkdir -p /run/cluster-api
echo success > /run/cluster-api/bootstrap-success.complete
