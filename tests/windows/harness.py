"""Runs one user-data through cloudbase-init's own user-data code, as a Windows machine would.

    python harness.py USER_DATA SANDBOX

cloudbase-init's `UserDataPlugin` (plugins/common/userdata.py) reads USER_DATA as a metadata
service hands it over and dispatches it with its own code: `#cloud-config` to its cloud-config
plugin and cloud-config plugins (`write_files`, `runcmd`, ...), `#ps1_sysnative` and
`<powershell>` scripts to its script handling (userdatautils, execcmd).

What stands in for Windows (this harness runs on Linux):
- the OS layer: `cloudbaseinit.osutils.factory.get_os_utils` returns `StandInOSUtils`, which
  runs nothing. It records every command cloudbase-init hands it with the shell it is handed
  to: `cmd` (`execute_process(..., shell=True)`, a `.cmd` batch), `powershell` (with
  `sysnative`) or the program named; and the text of the script file it was given;
- the file system of `write_files`: its module's `os` is a stand-in whose paths map a Windows
  path (`C:\\k\\a.yaml`) into SANDBOX (`SANDBOX/C/k/a.yaml`); a path that is not an absolute
  Windows path is recorded as an error. Temporary script files go to SANDBOX/.tmp.

Everything else is cloudbase-init 1.1.9 as released. Prints one JSON document: the files under
SANDBOX (Windows path -> base64 of the bytes), the commands, every log record cloudbase-init
wrote (level, logger, message) and the plugin's result. Exit status 0 whatever cloudbase-init
did: the test judges the JSON.
"""

import base64
import json
import logging
import ntpath
import os
import posixpath
import sys
import tempfile
import types

USER_DATA, SANDBOX = sys.argv[1], os.path.abspath(sys.argv[2])
RECORDS = []
COMMANDS = []
PATH_ERRORS = []


class Recorder(logging.Handler):
    def emit(self, record):
        RECORDS.append(
            {"level": record.levelname, "logger": record.name, "message": record.getMessage()}
        )


def to_sandbox(path):
    """A Windows path's place in the sandbox; a path that is not absolute is recorded."""
    drive, rest = ntpath.splitdrive(path)
    if len(drive) != 2 or not rest.startswith(("\\", "/")):
        PATH_ERRORS.append(path)
        return os.path.join(SANDBOX, "not-a-windows-path", path.replace("/", "_"))
    parts = [p for p in ntpath.normpath(rest).split("\\") if p]
    return os.path.join(SANDBOX, drive[0].upper(), *parts)


def from_sandbox(path):
    relative = os.path.relpath(path, SANDBOX).split(os.sep)
    return relative[0] + ":\\" + "\\".join(relative[1:])


class StandInOSUtils:
    """cloudbase-init's OS layer on Windows (osutils/windows.py), for what user-data uses."""

    def get_default_script_exec_header(self):
        # What WindowsUtils returns: runcmd entries are joined into a cmd.exe batch.
        from cloudbaseinit import constant

        return constant.SCRIPT_HEADER_CMD

    def _record(self, shell, args, script_path, **extra):
        with open(script_path, "rb") as handle:
            script = handle.read()
        COMMANDS.append(
            dict(
                shell=shell,
                args=[str(a) for a in args],
                script=script.decode("utf-8", "replace"),
                **extra,
            )
        )
        return b"", b"", 0

    def execute_process(self, args, shell=True, decode_output=False):
        args = list(args)
        shell_name = "cmd" if shell else posixpath.basename(str(args[0]))
        return self._record(shell_name, args, args[-1])

    def execute_powershell_script(self, script_path, sysnative=True):
        return self._record("powershell", [script_path], script_path, sysnative=bool(sysnative))

    def set_path_admin_acls(self, path):
        pass

    def take_path_ownership(self, path, username=None):
        pass


def stand_in_os():
    """write_files' `os`: the real module, with paths mapped into the sandbox."""
    path = types.SimpleNamespace(
        abspath=lambda p: to_sandbox(p),
        dirname=os.path.dirname,
        isdir=os.path.isdir,
    )
    return types.SimpleNamespace(
        path=path, makedirs=os.makedirs, chmod=os.chmod, linesep="\r\n"
    )


class MetadataService:
    def __init__(self, data):
        self._data = data

    def get_decoded_user_data(self):
        return self._data

    def get_instance_data(self):
        return {}


def main():
    os.makedirs(os.path.join(SANDBOX, ".tmp"), exist_ok=True)
    tempfile.tempdir = os.path.join(SANDBOX, ".tmp")
    root = logging.getLogger()
    root.addHandler(Recorder())
    root.setLevel(logging.DEBUG)

    from cloudbaseinit import conf

    conf.CONF([], project="cloudbase-init", default_config_files=[])
    from cloudbaseinit.osutils import factory

    factory.get_os_utils = lambda: StandInOSUtils()
    from cloudbaseinit.plugins.common.userdataplugins.cloudconfigplugins import write_files

    write_files.os = stand_in_os()
    from cloudbaseinit.plugins.common import userdata

    with open(USER_DATA, "rb") as handle:
        data = handle.read()
    result = userdata.UserDataPlugin().execute(MetadataService(data), {})

    files = {}
    for directory, subdirs, names in os.walk(SANDBOX):
        subdirs[:] = [d for d in subdirs if d != ".tmp"]
        for name in names:
            full = os.path.join(directory, name)
            with open(full, "rb") as handle:
                files[from_sandbox(full)] = base64.b64encode(handle.read()).decode()
    json.dump(
        {
            "files": files,
            "commands": COMMANDS,
            "log": RECORDS,
            "path_errors": PATH_ERRORS,
            "result": list(result),
        },
        sys.stdout,
        indent=1,
    )


main()
