#!/usr/bin/env python3
"""What a test run left on this machine, removed: scripts/test.sh runs it on every exit (a timeout's
SIGTERM, Ctrl-C, a failure), so a killed run leaves no Slurm cluster, agent, FUSE mount or network
namespace behind.  Standard library only (run it with ``python3 -P``).

    ci_cleanup.py snapshot FILE   note the FUSE mounts and network namespaces there are now
    ci_cleanup.py clean FILE      remove what the run marked ``MONARCH_CI_RUN=<its value>`` left

The run's processes are found by the environment variable ``MONARCH_CI_RUN`` that test.sh exports
(every process the tests start inherits it, the Slurm daemons of the tests' cluster too); a value
is unique to one run, so another run's or another user's processes are never touched.  A FUSE
mount (monarch's own) is unmounted when it is new since the snapshot, answered before the run's
processes were killed and is dead after (ENOTCONN: its server was one of them); a namespace
(monarch-<tag>-h<N>) is removed when it is new since the snapshot and no process is left in it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VAR = "MONARCH_CI_RUN"
_NETNS = re.compile(r"monarch-(?P<tag>[A-Za-z0-9]+)-h\d+")


def _say(text: str) -> None:
    print(f"ci_cleanup: {text}", file=sys.stderr, flush=True)


def _ancestors() -> set[int]:
    """This process and every parent up to init (test.sh carries the mark: it must not be killed)."""
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                data = f.read()
            pid = int(data[data.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError):
            break
    return out


def marked(value: str) -> dict[int, list[str]]:
    """pid -> argv of every live process whose environment holds ``MONARCH_CI_RUN=value``."""
    want, skip, found = f"{VAR}={value}".encode(), _ancestors(), {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if want not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue  # exited, waiting to be reaped: nothing to stop
            with open(f"/proc/{name}/cmdline", "rb") as f:
                found[int(name)] = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except (OSError, IndexError):
            continue
    return found


def fuse_mounts() -> list[str]:
    """The mount points of monarch's own FUSE mounts (a monarch-* subtype: workspaces, remote mounts;
    or a monarch-* fsname: gathers)."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, source = (right.split() + ["", ""])[:2]
            if fstype.startswith("fuse.monarch-") or (fstype == "fuse" and source.startswith("monarch-")):
                points.append(left.split()[4].encode().decode("unicode_escape"))
    return points


def _mount_state(point: str) -> str:
    """'up', 'dead' (its server is gone: ENOTCONN) or 'unknown', asked in a child process: a stat of a
    mount whose server is stopped would hang this one."""
    probe = "import os, sys\ntry:\n    os.stat(sys.argv[1])\nexcept OSError as e:\n    sys.exit(e.errno)"
    try:
        r = subprocess.run([sys.executable, "-c", probe, point], capture_output=True, timeout=5)
    except subprocess.TimeoutExpired:
        return "unknown"
    return {0: "up", errno.ENOTCONN: "dead"}.get(r.returncode, "unknown")


def namespaces() -> list[str]:
    r = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True)
    try:
        return [str(d["name"]) for d in json.loads(r.stdout or "[]")]
    except (ValueError, TypeError, KeyError):
        return []


def snapshot(path: str) -> None:
    with open(path, "w") as f:
        json.dump({"mounts": fuse_mounts(), "netns": namespaces()}, f)


def clean(path: str) -> int:
    value = os.environ.get(VAR, "")
    if not value:
        _say(f"{VAR} is not set: nothing is known to be this run's")
        return 1
    try:
        with open(path) as f:
            before = json.load(f)
    except (OSError, ValueError):
        before = {"mounts": None, "netns": None}
    left = marked(value)
    # Mounts this run's processes may serve: those that answer now, and are new since the snapshot.
    # One that is dead once the run's processes are killed was served by one of them.
    served = [p for p in fuse_mounts() if (before["mounts"] is None or p not in before["mounts"])
              and _mount_state(p) == "up"] if left else []
    # The tests' Slurm clusters first, by their own script: it cancels their jobs, stops the daemons
    # and removes their namespaces (its DIR is in slurmctld's `-f DIR/slurm.conf`).
    for argv in list(left.values()):
        if os.path.basename(argv[0]) == "slurmctld" and "-f" in argv[:-1]:
            cluster = os.path.dirname(argv[argv.index("-f") + 1])
            _say(f"stopping the Slurm cluster in {cluster}")
            try:
                subprocess.run([os.path.join(ROOT, "scripts", "slurm_cluster.sh"), "stop", cluster],
                               stdin=subprocess.DEVNULL, timeout=120)
            except subprocess.TimeoutExpired:
                _say(f"stopping the Slurm cluster in {cluster} took over 120 s")
    # Then every process of the run (agents, zygotes, ranks, mount servers), killed until none is
    # left: one may fork while its parent dies.
    killed_any = False
    for _ in range(100):
        # munged is the machine's, shared with other clusters: slurm_cluster.sh stop decided about it.
        left = {pid: argv for pid, argv in marked(value).items() if os.path.basename(argv[0]) != "munged"}
        if not left:
            break
        killed_any = True
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
    else:
        _say(f"{len(left)} process(es) would not die: {sorted(left)}")
    for point in served:
        if _mount_state(point) != "dead":
            continue
        _say(f"unmounting {point} (its server is gone)")
        subprocess.run(["fusermount3", "-u", "-z", point], capture_output=True)
        if point in fuse_mounts():
            subprocess.run(["umount", "-l", point], capture_output=True)
    tags = set()
    for ns in namespaces():
        m = _NETNS.fullmatch(ns)
        if not m or before["netns"] is None or ns in before["netns"]:
            continue
        r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        if r.returncode == 0 and not r.stdout.strip():
            tags.add(m["tag"])
    for tag in sorted(tags):
        _say(f"removing the network namespaces of {tag}")
        subprocess.run([sys.executable, "-P", os.path.join(ROOT, "monarch_schedulers", "netns.py"), "remove", tag])
    if killed_any:
        _say("killed what the run left running")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "snapshot":
        snapshot(argv[1])
        return 0
    if len(argv) == 2 and argv[0] == "clean":
        return clean(argv[1])
    print("usage: ci_cleanup.py snapshot FILE | clean FILE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
