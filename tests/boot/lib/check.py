#!/usr/bin/env python3
"""The boot proof's side inside the test root, run by tests/boot/lib/inside.sh with the root's
own python3 (which has PyYAML and cloud-init's modules) in the run's namespaces.

  check.py kind               print `ignition` or `cloud-init`: who consumes the user-data
  check.py instrument-runcmd  after cloud-init's config stage: put step markers between the
                              `runcmd` entries of the script cloud-init wrote (see below)
  check.py run-units          after Ignition: start the enabled oneshot units as systemd would
  check.py run-unit UNIT      run a oneshot unit now (the systemctl stub's `start`)
  check.py start-daemon UNIT  real joins: start a service's ExecStart as a supervised process,
                              as systemd would (Restart=, Type=notify); `stop-daemon UNIT`,
                              `daemon-active UNIT` stop it and ask whether it runs
  check.py check              after the run: compare the root with what the user-data declares;
                              print the report (JSON) on stdout

Inputs: /usr/local/bootplate/user-data (the exact bytes under test), /usr/local/bootplate/case.json
(label, role, Kubernetes version), and what the run left in /run/bootplate: stages.tsv (each
stage's exit status), stubs.log (tests/boot/stubs/stub), errors (tests/boot/lib/trace.bash),
runcmd-steps, units.tsv, kubeadm.jsonl, and for real joins daemons/ (each started service's
process group, log and restarts).

runcmd markers: cloud-init writes all `runcmd` entries into one /bin/sh script, where a failing
entry does not stop the next ones unless the script `set -e`. To tell which entry failed, the
script cloud-init wrote is checked to be exactly `cloudinit.util.shellify(runcmd)` and replaced by
the same entries with a line before each (`start N`) and after each (`end N $?`) appended to
/run/bootplate/runcmd-steps. The entries' bytes do not change; $? at the start of an entry is 0.
"""

import base64
import email
import email.policy
import grp
import gzip
import json
import os
import pwd
import re
import shlex
import socket
import stat
import subprocess
import sys
import urllib.parse

import yaml

BP = "/usr/local/bootplate"
RUN = "/run/bootplate"
USER_DATA = f"{BP}/user-data"
SENTINEL = "/run/cluster-api/bootstrap-success.complete"
RUNCMD_SCRIPT = "/var/lib/cloud/instance/scripts/runcmd"
SCRIPTS_DIR = "/var/lib/cloud/instance/scripts"
UNIT_DIRS = ["/etc/systemd/system", "/run/systemd/system", "/usr/lib/systemd/system"]


def read(path, mode="r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except FileNotFoundError:
        return None


def lines(path):
    text = read(path)
    return text.splitlines() if text else []


def case():
    return json.loads(read(f"{BP}/case.json") or "{}")


def raw_user_data():
    data = read(USER_DATA, "rb")
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return data


def kind():
    data = raw_user_data().lstrip()
    if data.startswith(b"{"):
        try:
            config = json.loads(data)
        except ValueError:
            return "ignition"  # Ignition reports the error.
        if isinstance(config, dict) and "ignition" in config:
            return "ignition"
    return "cloud-init"


# --- What the user-data declares ---------------------------------------------------------------


class Declared:
    """Files, units, users, scripts and commands the user-data asks for, and problems found in
    the declarations themselves (wrong types)."""

    def __init__(self):
        self.files = []  # {path, content: bytes, mode, owner: (user, group|None), append, source}
        self.units = []  # {name, enabled: True|False|None, source}
        self.users = []  # {name, keys: [...], source}
        self.hostname = None
        self.runcmd = None
        self.cloud_configs = []
        self.problems = []  # (step, message)


def jinja(text):
    """A user-data starting with cloud-init's `## template: jinja` line, as cloud-init reads it:
    rendered with the instance data (the header line goes). Any other text as it is."""
    first = text.split("\n", 1)[0].strip().replace(" ", "")
    if first != "##template:jinja":
        return text
    # The root's cloud-init, the one that ran, and the instance data it rendered with.
    from cloudinit.handlers.jinja_template import render_jinja_payload_from_file

    return render_jinja_payload_from_file(text, "user-data", "/run/cloud-init/instance-data.json")


def parse_cloud_init(data, declared):
    text = jinja(data.decode("utf-8", "replace"))
    data = text.encode("utf-8")
    head = text.lstrip()[:200].lower()
    if head.startswith("content-type:") or head.startswith("mime-version:"):
        message = email.message_from_bytes(data, policy=email.policy.compat32)
        index = 0
        for part in message.walk():
            if part.is_multipart():
                continue
            index += 1
            payload = part.get_payload(decode=True) or b""
            if payload[:2] == b"\x1f\x8b":
                payload = gzip.decompress(payload)
            ctype = part.get_content_type()
            name = part.get_filename() or f"part {index}"
            if ctype == "text/cloud-config":
                parse_cloud_config(payload.decode("utf-8", "replace"), declared, f"MIME part {name}")
            elif ctype == "text/x-shellscript":
                parse_script(payload.decode("utf-8", "replace"), declared, f"MIME part {name}")
            elif ctype == "text/x-include-url" or ctype == "text/cloud-boothook":
                declared.problems.append((f"MIME part {name}", f"{ctype} is not checked by the boot proof"))
            else:
                parse_cloud_init(payload, declared)
    elif text.startswith("#cloud-config"):
        parse_cloud_config(text, declared, "cloud-config")
    elif text.startswith("#!"):
        parse_script(text, declared, "script")
    else:
        declared.problems.append(
            ("user-data", "neither #cloud-config, a #! script nor a MIME archive: cloud-init ignores it")
        )


def parse_cloud_config(text, declared, source):
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as e:
        declared.problems.append((source, f"not YAML: {e}"))
        return
    if not isinstance(config, dict):
        declared.problems.append((source, "the cloud-config is not a map"))
        return
    declared.cloud_configs.append((source, text))
    for i, entry in enumerate(config.get("write_files") or []):
        step = f"{source} write_files[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            declared.problems.append((step, "an entry needs a path (a string)"))
            continue
        step += f" ({entry['path']})"
        declared.files.append(write_files_entry(entry, step, declared))
    for i, user in enumerate(config.get("users") or []):
        if isinstance(user, dict) and user.get("name"):
            keys = user.get("ssh_authorized_keys") or []
            declared.users.append({"name": user["name"], "keys": list(keys), "source": f"{source} users[{i}]"})
    if config.get("hostname") or config.get("fqdn"):
        declared.hostname = str(config.get("hostname") or config.get("fqdn")).split(".")[0]
    if "runcmd" in config:
        declared.runcmd = config["runcmd"]


def write_files_entry(entry, step, declared):
    perms = entry.get("permissions")
    mode = 0o644
    if perms is not None:
        if isinstance(perms, str) and re.fullmatch(r"(0o)?[0-7]{3,4}", perms.strip()):
            mode = int(perms.strip().replace("0o", ""), 8)
        else:
            what = type(perms).__name__
            declared.problems.append(
                (
                    f"{step} permissions",
                    f"permissions must be an octal string such as \"0644\", not the {what} {perms!r}: "
                    + (
                        f"cloud-init applies it as mode {int(perms):o}"
                        if isinstance(perms, (int, float))
                        else "cloud-init falls back to 0644"
                    ),
                )
            )
            mode = int(perms) if isinstance(perms, (int, float)) and not isinstance(perms, bool) else 0o644
    owner = str(entry.get("owner") or "root:root")
    user, _, group = owner.partition(":")
    content = entry.get("content", "")
    if isinstance(content, str):
        content = content.encode("utf-8")
    elif isinstance(content, bytes):
        pass
    else:
        declared.problems.append((f"{step} content", f"content must be a string, not {type(content).__name__}"))
        content = str(content).encode()
    encoding = str(entry.get("encoding") or "").lower().strip()
    try:
        if encoding in ("gz", "gzip"):
            content = gzip.decompress(content)
        elif encoding in ("gz+base64", "gzip+base64", "gz+b64", "gzip+b64"):
            content = gzip.decompress(base64.b64decode(content))
        elif encoding in ("b64", "base64"):
            content = base64.b64decode(content)
        elif encoding not in ("", "text/plain"):
            declared.problems.append((f"{step} encoding", f"unknown encoding {encoding!r}"))
    except (ValueError, OSError) as e:
        declared.problems.append((f"{step} content", f"content does not decode as {encoding}: {e}"))
    return {
        "path": entry["path"],
        "content": content,
        "mode": mode,
        "owner": (user, group or None),
        "append": bool(entry.get("append")),
        "source": step,
    }


WRITE_FILE = re.compile(r"^bootplate_write_file (.+) <<'([A-Z0-9_]+)'$")


def parse_script(text, declared, source):
    """A script: its `bootplate_write_file PATH MODE OWNER ENCODING <<'EOF'` blocks (the script
    writer's form) are files it declares."""
    script_lines = text.split("\n")
    i = 0
    while i < len(script_lines):
        m = WRITE_FILE.match(script_lines[i])
        i += 1
        if not m:
            continue
        try:
            path, mode, owner, encoding = shlex.split(m.group(1))
        except ValueError:
            continue
        body = []
        while i < len(script_lines) and script_lines[i] != m.group(2):
            body.append(script_lines[i] + "\n")
            i += 1
        data = "".join(body).encode()
        if encoding == "base64":
            data = base64.b64decode(data)
        elif encoding == "gzip+base64":
            data = gzip.decompress(base64.b64decode(data))
        user, _, group = owner.partition(":")
        declared.files.append(
            {
                "path": path,
                "content": data,
                "mode": int(mode, 8),
                "owner": (user, group or None),
                "append": False,
                "source": f"{source} bootplate_write_file {path}",
            }
        )


def data_url(source):
    if not source.startswith("data:"):
        raise ValueError(f"only data: URLs are checked offline, not {source[:40]!r}")
    header, _, payload = source[5:].partition(",")
    if header.endswith(";base64"):
        return base64.b64decode(payload)
    return urllib.parse.unquote_to_bytes(payload)


def ignition_owner(spec):
    spec = spec or {}
    if spec.get("name"):
        return spec["name"]
    if spec.get("id") is not None:
        return int(spec["id"])
    return None


def parse_ignition(data, declared):
    try:
        config = json.loads(data)
    except ValueError as e:
        declared.problems.append(("ignition config", f"not JSON: {e}"))
        return
    storage = config.get("storage") or {}
    for i, f in enumerate(storage.get("files") or []):
        step = f"storage.files[{i}] ({f.get('path')})"
        mode = f.get("mode", 0o644)
        if not isinstance(mode, int) or isinstance(mode, bool):
            declared.problems.append((f"{step} mode", f"mode must be an integer (decimal of the octal mode), not {mode!r}"))
            mode = 0o644
        contents = f.get("contents") or {}
        try:
            content = data_url(contents.get("source") or "data:,")
            if contents.get("compression") == "gzip":
                content = gzip.decompress(content)
        except (ValueError, OSError) as e:
            declared.problems.append((f"{step} contents", str(e)))
            content = b""
        user = ignition_owner(f.get("user")) or "root"
        group = ignition_owner(f.get("group")) or "root"
        declared.files.append(
            {
                "path": f.get("path"),
                "content": content,
                "mode": mode,
                "owner": (user, group),
                "append": False,
                "source": step,
            }
        )
    systemd = config.get("systemd") or {}
    for i, unit in enumerate(systemd.get("units") or []):
        name = unit.get("name")
        step = f"systemd.units[{i}] ({name})"
        if unit.get("contents") is not None:
            declared.files.append(unit_file(f"/etc/systemd/system/{name}", unit["contents"], step))
        for drop_in in unit.get("dropins") or []:
            if drop_in.get("contents") is not None:
                declared.files.append(
                    unit_file(f"/etc/systemd/system/{name}.d/{drop_in.get('name')}", drop_in["contents"], f"{step} drop-in {drop_in.get('name')}")
                )
        declared.units.append({"name": name, "enabled": unit.get("enabled"), "mask": bool(unit.get("mask")), "source": step})
    for i, user in enumerate((config.get("passwd") or {}).get("users") or []):
        declared.users.append(
            {"name": user.get("name"), "keys": list(user.get("sshAuthorizedKeys") or []), "source": f"passwd.users[{i}]"}
        )


def unit_file(path, contents, step):
    return {"path": path, "content": contents.encode(), "mode": 0o644, "owner": ("root", "root"), "append": False, "source": step}


def declared():
    d = Declared()
    data = raw_user_data()
    if kind() == "ignition":
        parse_ignition(data, d)
    else:
        parse_cloud_init(data, d)
    return d


# --- Instrumenting runcmd ------------------------------------------------------------------------


def instrument_runcmd():
    d = declared()
    if not d.runcmd:
        return
    from cloudinit import util  # the root's cloud-init, the one that wrote the script

    original = read(RUNCMD_SCRIPT)
    if original is None:
        return  # cloud-init did not write it: the check reports the runcmd entries as not run.
    if original != util.shellify(d.runcmd):
        print("boot-proof: the runcmd script differs from cloud-init's shellify(runcmd); not instrumented", file=sys.stderr)
        return
    steps = []
    entries = []
    for i, entry in enumerate(d.runcmd):
        if entry is None:
            continue
        steps.append(f"printf 'start %s\\n' {i} >>{RUN}/runcmd-steps")
        steps.append(entry)
        steps.append(f"printf 'end %s %s\\n' {i} \"$?\" >>{RUN}/runcmd-steps")
        entries.append({"index": i, "command": entry if isinstance(entry, str) else shlex.join(map(str, entry))})
    with open(f"{RUN}/runcmd.json", "w") as f:
        json.dump(entries, f)
    with open(f"{RUN}/runcmd.original", "w") as f:
        f.write(original)
    with open(RUNCMD_SCRIPT, "w") as f:
        f.write(util.shellify(steps))


# --- Ignition: the oneshot units ---------------------------------------------------------------


def unit_path(name):
    for d in UNIT_DIRS:
        if os.path.exists(f"{d}/{name}"):
            return f"{d}/{name}"
    return None


def unit_settings(name):
    """The settings of a unit file and its drop-ins, in order: [(section, key, value)]."""
    out = []
    paths = [unit_path(name)] if unit_path(name) else []
    for d in UNIT_DIRS:
        dropins = f"{d}/{name}.d"
        if os.path.isdir(dropins):
            paths += [f"{dropins}/{n}" for n in sorted(os.listdir(dropins)) if n.endswith(".conf")]
    for path in paths:
        section = None
        for line in (read(path) or "").splitlines():
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = line.strip("[]")
            elif "=" in line:
                key, _, value = line.partition("=")
                out.append((section, key.strip(), value.strip()))
    return out


def is_enabled(name):
    r = subprocess.run(["/usr/bin/systemctl", "is-enabled", name], capture_output=True, text=True)
    return r.stdout.strip()


def run_units():
    """Starts, as systemd would at first boot, the oneshot units the Ignition config enabled, in
    their After= and Before= order."""
    d = declared()
    units = [u["name"] for u in d.units if unit_path(u["name"]) and is_enabled(u["name"]) == "enabled"]
    oneshot = [u for u in units if ("Service", "Type", "oneshot") in unit_settings(u)]
    after = {u: {v for s, k, val in unit_settings(u) if k == "After" for v in val.split()} for u in oneshot}
    for u in oneshot:
        for v in {v for s, k, val in unit_settings(u) if k == "Before" for v in val.split()}:
            if v in after:
                after[v].add(u)
    ordered = []
    while len(ordered) < len(oneshot):
        ready = [u for u in oneshot if u not in ordered and not (after[u] & (set(oneshot) - set(ordered)))]
        ordered.append((ready or [u for u in oneshot if u not in ordered])[0])
    for unit in ordered:
        run_unit(unit)


def unit_environment(settings):
    """The environment a unit's commands run with: Environment= and EnvironmentFile= (a `-`
    prefix: the file may be missing), the stubs first on PATH. Returns (env, the first required
    EnvironmentFile that is missing, else None)."""
    env = dict(os.environ)
    for s, k, v in settings:
        if s == "Service" and k == "Environment":
            for assignment in shlex.split(v):
                key, _, value = assignment.partition("=")
                env[key] = value
        elif s == "Service" and k == "EnvironmentFile":
            text = read(v.lstrip("-"))
            if text is None and not v.startswith("-"):
                return env, v
            for line in (text or "").splitlines():
                if "=" in line and not line.lstrip().startswith("#"):
                    key, _, value = line.partition("=")
                    env[key.strip()] = value.strip().strip("\"'")
    env["PATH"] = f"{BP}/stubs:" + env.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    return env, None


def run_unit(unit):
    """Runs a oneshot unit as systemd would: each ExecStartPre/ExecStart/ExecStartPost line (a
    `-` prefix ignores its failure), with Environment= and EnvironmentFile=, skipped when a
    ConditionPathExists= does not hold. The stubs stay first on PATH, also when the unit sets
    PATH. Each command's status goes to /run/bootplate/units.tsv. Returns the unit's status
    (0 for a unit that is not installed or not a oneshot: there is nothing to wait for)."""
    settings = unit_settings(unit)
    if not unit_path(unit) or ("Service", "Type", "oneshot") not in settings:
        return 0
    with open(f"{RUN}/units.tsv", "a") as log:
        for s, k, v in settings:
            if k == "ConditionPathExists" and os.path.exists(v.lstrip("!")) == v.startswith("!"):
                log.write(f"{unit}\tskipped\t0\tConditionPathExists={v}\n")
                return 0
        env, missing = unit_environment(settings)
        if missing:
            log.write(f"{unit}\tEnvironmentFile={missing}\t1\tno such file\n")
            return 1
        for key in ("ExecStartPre", "ExecStart", "ExecStartPost"):
            for s, k, v in settings:
                if s != "Service" or k != key or not v:
                    continue
                argv = shlex.split(v.lstrip("-@+!:"))
                try:
                    status = subprocess.run(argv, env=env).returncode
                except OSError as e:
                    print(f"{unit}: {key}={v}: {e}", file=sys.stderr)
                    status = 203  # systemd's EXIT_EXEC
                log.write(f"{unit}\t{key}={v}\t{status}\t\n")
                log.flush()
                if status != 0 and not v.startswith("-"):
                    return status
    return 0


# --- Real joins: services as supervised processes ----------------------------------------------
#
# With real kubeadm and kubelet (tests/boot/run.sh --real-kube), `systemctl start` of a service
# that is not a oneshot runs its ExecStart as systemd would, without systemd: a supervisor process
# (its own session, so `stop` ends the whole group) restarts it as Restart= says, and for
# Type=notify, start waits for the service's READY=1 on NOTIFY_SOCKET, as systemctl does.

DAEMONS = f"{RUN}/daemons"


def expand_exec(line, env):
    """An Exec line's argv as systemd builds it: `$NAME` alone is split into words, `${NAME}` and
    `$NAME` inside a word are replaced by the value."""
    argv = []
    for word in shlex.split(line.lstrip("-@+!:")):
        whole = re.fullmatch(r"\$(\w+)", word)
        if whole:
            argv += env.get(whole.group(1), "").split()
        else:
            argv.append(re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), word))
    return argv


def daemon_group(unit):
    try:
        return int(read(f"{DAEMONS}/{unit}.pgid").strip())
    except (AttributeError, ValueError):
        return None


def daemon_active(unit):
    group = daemon_group(unit)
    if group is None:
        return False
    try:
        os.killpg(group, 0)
        return True
    except OSError:
        return False


def stop_daemon(unit):
    import signal
    import time
    group = daemon_group(unit)
    if group is None:
        return 0
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(group, sig)
        except OSError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and daemon_active(unit):
            time.sleep(0.1)
        if not daemon_active(unit):
            break
    os.remove(f"{DAEMONS}/{unit}.pgid")
    return 0


def start_daemon(unit):
    """Starts (or restarts) `unit`'s ExecStart under a supervisor. Returns its status: 0 started
    (and ready, for Type=notify), else what systemctl would fail with."""
    import time
    settings = unit_settings(unit)
    execs = [v for s, k, v in settings if s == "Service" and k == "ExecStart"]
    # An empty ExecStart= resets the list (drop-ins replace the command so).
    while "" in execs:
        execs = execs[execs.index("") + 1:]
    # A oneshot ran to its end already (run-unit); a unit without a command has nothing to run.
    if not unit_path(unit) or not execs or ("Service", "Type", "oneshot") in settings:
        return 0
    stop_daemon(unit)
    env, missing = unit_environment(settings)
    if missing:
        print(f"{unit}: EnvironmentFile={missing}: no such file", file=sys.stderr)
        return 1
    os.makedirs(DAEMONS, exist_ok=True)
    notify = ("Service", "Type", "notify") in settings
    restart = next((v for s, k, v in reversed(settings) if s == "Service" and k == "Restart"), "no")
    delay = next((v for s, k, v in reversed(settings) if s == "Service" and k == "RestartSec"), "0.1")
    ready = f"{DAEMONS}/{unit}.ready"
    if os.path.exists(ready):
        os.remove(ready)
    argv = [sys.executable, os.path.abspath(__file__), "supervise", unit, restart,
            delay.rstrip("s") or "0", json.dumps(expand_exec(execs[-1], env)), str(notify)]
    with open(f"{DAEMONS}/{unit}.log", "a") as log:
        child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                 start_new_session=True, close_fds=True)
    with open(f"{DAEMONS}/{unit}.pgid", "w") as f:
        f.write(str(child.pid))
    deadline = time.monotonic() + 60
    while notify and not os.path.exists(ready):
        if child.poll() is not None or time.monotonic() > deadline:
            print(f"{unit}: did not report READY=1 (its log: {DAEMONS}/{unit}.log)", file=sys.stderr)
            return 1
        time.sleep(0.1)
    return 0


def supervise(unit, restart, delay, argv, notify):
    """The supervisor of one service: runs argv, again after `delay` s when Restart= says so."""
    import time
    env = dict(os.environ)
    sock = None
    if notify == "True":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        path = f"{DAEMONS}/{unit}.notify"
        if os.path.exists(path):
            os.remove(path)
        sock.bind(path)
        env["NOTIFY_SOCKET"] = path
    while True:
        print(f"bootplate boot proof: starting {unit}: {' '.join(argv)}", flush=True)
        try:
            child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
        except OSError as e:
            print(f"{unit}: {e}", flush=True)
            return 203
        while child.poll() is None:
            if sock is not None:
                sock.settimeout(0.2)
                try:
                    if b"READY=1" in sock.recv(4096):
                        open(f"{DAEMONS}/{unit}.ready", "w").close()
                except OSError:
                    pass
            else:
                time.sleep(0.2)
        status = child.returncode
        print(f"bootplate boot proof: {unit} exited {status}", flush=True)
        with open(f"{DAEMONS}/{unit}.restarts", "a") as f:
            f.write(f"{status}\n")
        if restart == "always" or (restart == "on-failure" and status != 0):
            time.sleep(float(delay))
            continue
        return status


# --- The check -------------------------------------------------------------------------------


class Report:
    def __init__(self):
        self.failures = []
        self.data = {}

    def fail(self, step, message):
        self.failures.append({"step": step, "message": message})


def owner_ids(owner):
    user, group = owner
    uid = user if isinstance(user, int) else pwd.getpwnam(user).pw_uid
    gid = None
    if group is not None:
        gid = group if isinstance(group, int) else grp.getgrnam(group).gr_gid
    return uid, gid


MOVE = re.compile(r"^\s*mv\s+(?:-[A-Za-z]+\s+)*(/\S+)\s+(/\S+)\s*$")


def moves(d):
    """The declared files the user-data's own commands move once they ran (a `mv SOURCE TARGET`
    line of runcmd or of a file it writes, whose SOURCE is a declared file): {source: where the
    file ends up}. A TARGET ending in `/` or naming a directory receives the file by its name."""
    declared_paths = {f["path"] for f in d.files}
    texts = [f["content"].decode("utf-8", "replace") for f in d.files]
    texts += [e if isinstance(e, str) else shlex.join(map(str, e)) for e in (d.runcmd or []) if e is not None]
    out = {}
    for text in texts:
        for line in text.splitlines():
            m = MOVE.match(line)
            if m and m.group(1) in declared_paths:
                source, target = m.groups()
                if target.endswith("/") or os.path.isdir(target):
                    target = target.rstrip("/") + "/" + source.rsplit("/", 1)[1]
                out[source] = target
    return out


def check_files(d, report):
    # A later declaration of the same path replaces an earlier one (except appends).
    final = {}
    for f in d.files:
        if f["append"] and f["path"] in final:
            prev = final[f["path"]]
            final[f["path"]] = dict(prev, content=prev["content"] + f["content"], source=f["source"])
        else:
            final[f["path"]] = f
    moved = moves(d)
    out = []
    for declared_path, f in final.items():
        path = moved.get(declared_path, declared_path)
        entry = {"path": declared_path, "source": f["source"], "declaredMode": f"{f['mode']:04o}",
                 "declaredOwner": ":".join(str(x) for x in f["owner"] if x is not None)}
        out.append(entry)
        if path != declared_path:
            entry["movedTo"] = path
            if os.path.lexists(declared_path):
                report.fail(f["source"], f"{declared_path} is still there: the user-data's `mv` to {path} did not run")
                entry["ok"] = False
                continue
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            report.fail(f["source"], f"{path} was not written" + (f" (moved from {declared_path})" if path != declared_path else ""))
            entry["ok"] = False
            continue
        actual = read(path, "rb") if stat.S_ISREG(st.st_mode) else None
        entry.update(mode=f"{stat.S_IMODE(st.st_mode):04o}", uid=st.st_uid, gid=st.st_gid)
        problems = []
        if actual is None:
            problems.append("is not a regular file")
        elif f["append"] and not actual.endswith(f["content"]):
            problems.append("does not end with the appended content")
        elif not f["append"] and actual != f["content"]:
            problems.append(f"content differs from the declared content ({len(actual)} bytes written, {len(f['content'])} declared)")
        if stat.S_IMODE(st.st_mode) != f["mode"]:
            problems.append(f"mode is {stat.S_IMODE(st.st_mode):04o}, declared {f['mode']:04o}")
        try:
            uid, gid = owner_ids(f["owner"])
            if st.st_uid != uid or (gid is not None and st.st_gid != gid):
                problems.append(f"owner is {st.st_uid}:{st.st_gid}, declared {entry['declaredOwner']} ({uid}:{gid})")
        except KeyError as e:
            problems.append(f"the declared owner {entry['declaredOwner']} does not exist in the root ({e})")
        entry["ok"] = not problems
        for p in problems:
            report.fail(f["source"], f"{path}: {p}")
    report.data["files"] = out


def bash_words(text):
    """The words of a line of `printf '%q '` output (backslashes, '...' and $'...')."""
    words, word, i = [], None, 0
    while i < len(text):
        c = text[i]
        if c == " ":
            if word is not None:
                words.append(word)
            word, i = None, i + 1
            continue
        word = word or ""
        if c == "\\":
            word, i = word + text[i + 1 : i + 2], i + 2
        elif c == "'":
            end = text.index("'", i + 1)
            word, i = word + text[i + 1 : end], end + 1
        elif text.startswith("$'", i):
            end = i + 2
            while text[end] != "'":
                end += 2 if text[end] == "\\" else 1
            raw = text[i + 2 : end].encode("latin-1", "backslashreplace")
            word, i = word + raw.decode("unicode_escape").encode("latin-1").decode("utf-8", "replace"), end + 1
        else:
            word, i = word + c, i + 1
    if word is not None:
        words.append(word)
    return words


# systemctl verbs that ask rather than act: their status is an answer, not a failure.
SYSTEMCTL_QUERIES = {"is-active", "is-enabled", "is-failed", "is-system-running", "status", "show", "cat"}


def stub_calls():
    calls = []
    for line in lines(f"{RUN}/stubs.log"):
        status, name, args = line.split("\t", 2)
        argv = bash_words(args)
        words = [a for a in argv if not a.startswith("-")]
        query = name == "systemctl" and bool(words) and words[0] in SYSTEMCTL_QUERIES
        calls.append({"program": name, "args": argv, "status": int(status), "query": query})
    return calls


def check_units(d, report, calls):
    enabled_by_command = []
    for c in calls:
        if c["program"] == "systemctl":
            words = [a for a in c["args"] if not a.startswith("-")]
            if words and words[0] == "enable":
                enabled_by_command += [w if "." in w else f"{w}.service" for w in words[1:]]
    units = []
    names = [u["name"] for u in d.units]
    written = [f["path"].rsplit("/", 1)[1] for f in d.files if re.fullmatch(r"/etc/systemd/system/[^/]+\.[a-z]+", f["path"])]
    # A unit that only gets drop-ins (its file comes with a package) is reported too.
    written += [m.group(1) for f in d.files
                if (m := re.fullmatch(r"/etc/systemd/system/([^/]+\.[a-z]+)\.d/[^/]+\.conf", f["path"]))]
    for n in enabled_by_command + written:
        if n not in names:
            names.append(n)
    for name in names:
        declared = next((u for u in d.units if u["name"] == name), None)
        want = True if name in enabled_by_command else (declared or {}).get("enabled")
        state = is_enabled(name) if unit_path(name) or (declared or {}).get("mask") else "no unit file"
        entry = {"name": name, "enabledWanted": want, "state": state,
                 "unitFile": unit_path(name), "dropIns": drop_ins(name)}
        units.append(entry)
        source = (declared or {}).get("source") or f"systemctl enable {name}"
        if (declared or {}).get("mask"):
            if state != "masked":
                report.fail(source, f"{name} should be masked, systemctl is-enabled says {state!r}")
        elif want is True:
            if state == "no unit file":
                report.fail(source, f"{name} should be enabled but has no unit file")
            elif state not in ("enabled", "enabled-runtime", "static", "alias", "indirect", "generated"):
                report.fail(source, f"{name} should be enabled, systemctl is-enabled says {state!r}")
        elif want is False and state == "enabled":
            report.fail(source, f"{name} is declared enabled: false but is enabled")
    report.data["units"] = units


def drop_ins(name):
    out = []
    for d in UNIT_DIRS:
        if os.path.isdir(f"{d}/{name}.d"):
            out += [f"{d}/{name}.d/{n}" for n in sorted(os.listdir(f"{d}/{name}.d"))]
    return out


def schema_errors():
    """What `cloud-init schema` says of each cloud-config the user-data holds."""
    out = []
    for source, text in declared().cloud_configs:
        path = f"{RUN}/schema-check.yaml"
        with open(path, "w") as f:
            f.write(text)
        r = subprocess.run(["cloud-init", "schema", "--config-file", path], capture_output=True, text=True)
        if r.returncode != 0:
            message = " ".join((r.stderr or r.stdout).split())
            out.append(f"{source}: {message.replace('Error: ', '').replace(path, source)}")
    return "; ".join(out) or "(cloud-init schema finds no error)"


def check_stages(report, explained):
    """Each stage's exit status, all of them in the report's data. A cloud-init stage fails
    when one of its modules does; when those are reported (a failed step, a module's failure in
    cloud-init's log: `explained`), the stage's status is not reported again as a failure; any
    other non-zero status is, so that no stage crash hides behind an unrelated failure.
    """
    stages = []
    for line in lines(f"{RUN}/stages.tsv"):
        name, status, seconds = line.split("\t")
        stages.append({"stage": name, "status": int(status), "seconds": float(seconds)})
        if int(status) != 0 and not (name.startswith("cloud-init") and explained):
            report.fail(name, f"exited with status {status}{stage_output(name)}")
    report.data["stages"] = stages


def check_cloud_init_log(report, steps_failed):
    """cloud-init's own warnings: schema problems, and modules that failed (scripts-user fails
    when a script or runcmd does, which the steps already name)."""
    log = read("/var/log/cloud-init.log") or ""
    for line in log.splitlines():
        if "[WARNING]" not in line:
            continue
        if "Invalid cloud-config provided" in line:
            report.fail("cloud-init (schema)", "cloud-init found the cloud-config invalid: " + schema_errors())
        elif "Undecodable permissions" in line:
            report.fail("cloud-init write_files", line.split(" - ", 1)[-1])
        m = re.search(r"Running module (\S+) .* failed", line)
        if m and not (m.group(1) == "scripts-user" and steps_failed):
            report.fail(f"cloud-init module {m.group(1)}", line.split(" - ", 1)[-1])


def check_runcmd(d, report):
    entries = json.loads(read(f"{RUN}/runcmd.json") or "[]")
    if d.runcmd and not entries:
        if read(f"{RUN}/runcmd.original") is None and read(RUNCMD_SCRIPT) is None:
            report.fail("runcmd", "cloud-init did not write the runcmd script")
        return []
    started, ended = set(), {}
    for line in lines(f"{RUN}/runcmd-steps"):
        words = line.split()
        if words[0] == "start":
            started.add(int(words[1]))
        elif words[0] == "end":
            ended[int(words[1])] = int(words[2])
    steps = []
    failed = False
    for e in entries:
        i = e["index"]
        state = "not run" if i not in started else ("stopped the script" if i not in ended else ("ok" if ended[i] == 0 else f"exited {ended[i]}"))
        steps.append({"step": f"runcmd[{i}]", "command": e["command"], "state": state})
        if state == "ok":
            continue
        if state == "not run" and failed:
            continue
        failed = True
        report.fail(f"runcmd[{i}]", f"{state}: {first_line(e['command'])}{error_detail()}{output_tail()}")
    return steps


def first_line(command):
    meaningful = [l.strip() for l in command.splitlines() if l.strip() and not l.strip().startswith("#") and l.strip() != "set -e"]
    text = meaningful[0] if meaningful else command.strip()
    return f"`{text[:120]}`" + (f" (+{len(command.splitlines()) - 1} lines)" if "\n" in command.strip() else "")


def stage_output(name):
    """Why a stage failed, from its output: Ignition's first CRITICAL line, else the last lines."""
    text = read(f"{RUN}/stages.log") or ""
    section = text.split(f"== {name}\n", 1)[-1].split(f"== {name}: exit", 1)[0]
    critical = [l.split(":", 1)[1].strip() for l in section.splitlines() if l.startswith("CRITICAL")]
    if critical:
        return f": {critical[0]}"
    out = [l.strip() for l in section.splitlines() if l.strip()]
    return f": {' | '.join(out[-3:])}" if out else ""


def output_tail():
    """The last lines the commands printed in cloud-init's final stage (where runcmd and the
    scripts run), without cloud-init's own lines."""
    text = read("/var/log/cloud-init-output.log") or ""
    final = text.rsplit("running 'modules:final'", 1)
    if len(final) < 2:
        return ""
    out = [
        line.strip()
        for line in final[1].splitlines()[1:]
        if line.strip()
        and not line.startswith(("Cloud-init v.", "ci-info:"))
        and not re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ - ", line)
    ]
    return f"; last output: {' | '.join(out[-3:])}" if out else ""


def error_records():
    out = []
    for line in lines(f"{RUN}/errors"):
        parts = line.split("\t", 4)
        if len(parts) == 5:
            out.append({"status": int(parts[0]), "depth": int(parts[1]), "file": parts[2], "line": int(parts[3]), "command": parts[4]})
    return out


def error_detail():
    stubs = [c for c in stub_calls() if c["status"] != 0 and not c["query"]]
    if stubs:
        c = stubs[-1]
        return f"; the stub `{c['program']} {' '.join(c['args'])}` exited {c['status']}"
    return ""


def check_scripts(d, report, k):
    """Scripts cloud-init ran (x-shellscript parts) or the Ignition units ran: the ERR records
    and, for cloud-init, its own account of the script's status."""
    steps = []
    records = error_records()
    if k == "cloud-init":
        log = read("/var/log/cloud-init.log") or ""
        for path in sorted(os.listdir(SCRIPTS_DIR)) if os.path.isdir(SCRIPTS_DIR) else []:
            if path == "runcmd":
                continue
            full = f"{SCRIPTS_DIR}/{path}"
            m = re.search(r"Command: \['" + re.escape(full) + r"'\]\nExit code: (\d+)", log)
            status = int(m.group(1)) if m else 0
            steps.append(script_step(f"user-data script {path}", full, status, records, report))
    else:
        for line in lines(f"{RUN}/units.tsv"):
            unit, what, status, note = line.split("\t")
            if what == "skipped":
                steps.append({"step": unit, "state": f"skipped ({note})"})
                continue
            command = what.split("=", 1)[1] if "=" in what else what
            script = shlex.split(command.lstrip("-@+!:"))[0] if command else ""
            steps.append(script_step(f"{unit} {what}", script, int(status), records, report, note))
    return steps


def script_step(step, path, status, records, report, note=""):
    mine = [r for r in records if r["file"] == path]
    top = [r for r in mine if r["depth"] == 0]
    state = "ok" if status == 0 and not top else f"exited {status}"
    entry = {"step": step, "state": state, "errors": mine}
    if status != 0 or top:
        cause = (top or mine)[-1] if (top or mine) else None
        where = f" at line {cause['line']}: `{cause['command']}` exited {cause['status']}" if cause else ""
        if status == 0 and top:
            state = f"a command failed{where} (the script went on)"
            entry["state"] = state
            report.fail(step, state)
        else:
            report.fail(step, f"exited {status}{where}{(' ' + note) if note else ''}{error_detail()}")
    return entry


def check_stubs(report, calls):
    report.data["stubCalls"] = calls
    for c in calls:
        if c["status"] != 0 and not c["query"]:
            report.fail(f"stub {c['program']}", f"`{c['program']} {' '.join(c['args'])}` exited {c['status']}")


def check_kubeadm(report, c):
    records = [json.loads(line) for line in lines(f"{RUN}/kubeadm.jsonl")]
    report.data["kubeadm"] = records
    mentions = b"kubeadm" in raw_user_data()
    role = c.get("role")
    version = c.get("kubernetesVersion") or ""
    if not mentions or not role:
        return
    want = "init" if role == "init" else "join"
    calls_ = [r for r in records if r["subcommand"] == want]
    for r in calls_:
        # A real kubeadm's own words say why it failed.
        if r.get("real") and r.get("status") != 0:
            tail = [line.strip() for line in r.get("outputTail", []) if line.strip()]
            errors = [line for line in tail if line.lower().startswith(("error", "[error"))]
            report.fail("kubeadm", f"the real `kubeadm {want}` exited {r.get('status')}: "
                        + " | ".join(errors or tail[-3:]))
    if want == "join" and any(r.get("real") and r.get("status") == 0 for r in calls_):
        check_kubelet(report)
    if not calls_:
        report.fail("kubeadm", f"kubeadm {want} was not run (role {role})")
        return
    for r in calls_:
        m = re.match(r"v(\d+)\.(\d+)", version)
        if m:
            expected = "kubeadm.k8s.io/v1beta4" if (int(m.group(1)), int(m.group(2))) >= (1, 31) else "kubeadm.k8s.io/v1beta3"
            for doc in r["documents"]:
                if str(doc["apiVersion"]).startswith("kubeadm.k8s.io/") and doc["apiVersion"] != expected:
                    report.fail("kubeadm", f"{r['config']}: {doc['kind']} is {doc['apiVersion']}, Kubernetes {version} reads {expected}")


def check_kubelet(report):
    """After a real join: the kubelet runs and registered its Node (inside.sh waited for it)."""
    log = read(f"{DAEMONS}/kubelet.service.log") or ""
    registered = re.search(r'Successfully registered node" node="([^"]+)"', log)
    report.data["kubelet"] = {"registered": registered.group(1) if registered else None,
                              "restarts": lines(f"{DAEMONS}/kubelet.service.restarts")}
    if not registered:
        tail = [line for line in log.splitlines() if line.startswith(("E", "F"))][-5:]
        report.fail("kubelet", "the kubelet did not register its Node within 60 s after kubeadm join: "
                    + (" | ".join(tail) or "(no error in its log)"))


def users(d):
    out = []
    names = {u["name"] for u in d.users}
    for p in pwd.getpwall():
        if p.pw_uid >= 1000 and p.pw_uid != 65534 or p.pw_name in names:
            keys = []
            for path in (f"{p.pw_dir}/.ssh/authorized_keys",):
                keys += [l for l in (read(path) or "").splitlines() if l.strip() and not l.startswith("#")]
            keydir = f"{p.pw_dir}/.ssh/authorized_keys.d"
            if os.path.isdir(keydir):
                for n in sorted(os.listdir(keydir)):
                    keys += [l for l in (read(f"{keydir}/{n}") or "").splitlines() if l.strip() and not l.startswith("#")]
            out.append({"name": p.pw_name, "uid": p.pw_uid, "home": p.pw_dir, "shell": p.pw_shell, "authorizedKeys": keys})
    return out


def check_users(d, report):
    found = {u["name"]: u for u in users(d)}
    report.data["users"] = list(found.values())
    for u in d.users:
        if u["name"] not in found:
            report.fail(u["source"], f"user {u['name']} was not created")
            continue
        for key in u["keys"]:
            if key.strip() not in [k.strip() for k in found[u["name"]]["authorizedKeys"]]:
                report.fail(u["source"], f"user {u['name']}: SSH key {key[:40]}... is not authorized")


def check():
    c = case()
    k = kind()
    d = declared()
    report = Report()
    report.data.update(label=c.get("label"), consumer=k)
    for step, message in d.problems:
        report.fail(step, message)
    calls = stub_calls()
    steps = []
    if k == "cloud-init":
        steps += check_runcmd(d, report)
    steps += check_scripts(d, report, k)
    report.data["steps"] = steps
    steps_failed = any(not s["state"].startswith(("ok", "skipped")) for s in steps)
    if k == "cloud-init":
        check_cloud_init_log(report, steps_failed)
    # A cloud-init stage fails when one of its modules does: explained by a failed step (the
    # scripts module) or a module's failure found in the log, and by nothing else (a schema
    # warning or a declaration problem does not make a stage exit non-zero).
    explained = steps_failed or any(f["step"].startswith("cloud-init module") for f in report.failures)
    check_stages(report, explained=explained)
    check_files(d, report)
    check_units(d, report, calls)
    check_stubs(report, calls)
    check_kubeadm(report, c)
    check_users(d, report)
    report.data["hostname"] = socket.gethostname()
    report.data["etcHostname"] = (read("/etc/hostname") or "").strip()
    if d.hostname and report.data["hostname"] != d.hostname:
        report.fail("hostname", f"the hostname is {report.data['hostname']!r}, the cloud-config sets {d.hostname!r}")
    sentinel = os.path.exists(SENTINEL)
    report.data["sentinel"] = sentinel
    wants_sentinel = SENTINEL.encode() in raw_user_data() or b"bootstrap-success.complete" in raw_user_data()
    if (steps_failed or any(f["step"].startswith("stub ") for f in report.failures)) and sentinel:
        report.fail("sentinel", f"{SENTINEL} was written although the bootstrap failed: an infrastructure provider would report this machine bootstrapped")
    elif wants_sentinel and not sentinel and not report.failures:
        report.fail("sentinel", f"{SENTINEL} was not written")
    report.data["failures"] = report.failures
    report.data["ok"] = not report.failures
    json.dump(report.data, sys.stdout, indent=1, default=str)
    print()


def main():
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "kind":
        print(kind())
    elif command == "instrument-runcmd":
        instrument_runcmd()
    elif command == "run-units":
        run_units()
    elif command == "run-unit" and len(sys.argv) == 3:
        sys.exit(run_unit(sys.argv[2]))
    elif command == "start-daemon" and len(sys.argv) == 3:
        sys.exit(start_daemon(sys.argv[2]))
    elif command == "stop-daemon" and len(sys.argv) == 3:
        sys.exit(stop_daemon(sys.argv[2]))
    elif command == "daemon-active" and len(sys.argv) == 3:
        sys.exit(0 if daemon_active(sys.argv[2]) else 3)
    elif command == "supervise" and len(sys.argv) == 7:
        sys.exit(supervise(sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5]), sys.argv[6]))
    elif command == "check":
        check()
    else:
        sys.exit(f"usage: {sys.argv[0]} kind|instrument-runcmd|run-units|run-unit|start-daemon|stop-daemon|daemon-active|check")


if __name__ == "__main__":
    main()
