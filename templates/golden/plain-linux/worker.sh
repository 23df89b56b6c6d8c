#!/bin/bash
# Rendered by bootplate from ClusterBootstrapTemplate plain-linux (revision 013566f345766a4c) for role worker.
set -euo pipefail

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
