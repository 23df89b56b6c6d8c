#!/usr/bin/env python3
"""Gives a clone's tracked files the modification times they had in the last run, where their
content is the same, so that cargo rebuilds only the crates whose sources changed.

    tests/scripts/source-mtimes.py RECORD

cargo decides that a workspace crate is stale when one of its source files is newer than its
last build. A fresh clone makes every file new, so every run rebuilt every workspace crate in
every profile (the test build, the static release build, the agent's LTO build): about 550 s of
CPU in a warm run, most of it for crates whose sources had not changed.

RECORD (a file in the cargo target directory, removed with it) holds, for each tracked path, the Git blob of
its content and the time it was given in the last run. A path whose blob is the same gets that
time back; any other path (new, changed, or not clean in the work tree) gets the current time,
newer than any build in the target directory, and the record keeps only this run's state. So a
content that comes back after another (A, B, then A) is new again: the builds from B are newer
than A's old time. The record is only sound while nothing but these runs builds into that
target directory. Outside a Git work tree this does nothing.
"""

import os
import subprocess
import sys
import time


def git(*args):
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def tracked():
    """{path: blob} of the index's regular files and symbolic links (not submodules)."""
    files = {}
    for line in git("ls-files", "-s", "-z").split("\0"):
        if not line:
            continue
        meta, path = line.split("\t", 1)
        mode, blob, _stage = meta.split()
        if mode != "160000":
            files[path] = blob
    return files


def not_clean():
    """Paths whose work-tree content may differ from the index's blob."""
    out = git("status", "--porcelain=v1", "-z", "--untracked-files=no")
    return {entry[3:] for entry in out.split("\0") if len(entry) > 3}


def read_record(path):
    record = {}
    try:
        with open(path) as f:
            for line in f:
                fields = line.rstrip("\n").split("\t")
                if len(fields) == 3:
                    record[fields[0]] = (fields[1], int(fields[2]))
    except FileNotFoundError:
        pass
    return record


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: tests/scripts/source-mtimes.py RECORD")
    record_path = sys.argv[1]
    try:
        files = tracked()
        dirty = not_clean()
    except (subprocess.CalledProcessError, FileNotFoundError):
        print("source-mtimes.py: not a Git work tree; times left as they are", file=sys.stderr)
        return
    last = read_record(record_path)
    now = time.time_ns()
    kept, renewed, lines = 0, 0, []
    for path, blob in sorted(files.items()):
        if path in dirty:
            blob = "not-clean"
        previous = last.get(path)
        when = previous[1] if previous and previous[0] == blob and blob != "not-clean" else now
        try:
            os.utime(path, ns=(when, when), follow_symlinks=False)
        except FileNotFoundError:
            continue
        if when == now:
            renewed += 1
        else:
            kept += 1
        lines.append(f"{path}\t{blob}\t{when}\n")
    os.makedirs(os.path.dirname(os.path.abspath(record_path)), exist_ok=True)
    with open(record_path + ".new", "w") as f:
        f.writelines(lines)
    os.replace(record_path + ".new", record_path)
    print(f"source-mtimes.py: {kept} files as in the last run, {renewed} new or changed",
          file=sys.stderr)


if __name__ == "__main__":
    main()
