"""A proc under an interpreter other than the host agent's (``HostMesh.with_python_executable``,
a ``spawn_procs(bootstrap_command=...)`` naming another program): ``python -m monarch_agents.proc_exec``.

The host agent writes the proc's configuration (its keys among it) to this process's stdin, so it
is in neither its arguments nor its environment; then this runs the same proc agent a fork of the
warm zygote runs.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    config = json.loads(sys.stdin.buffer.read() or b"{}")
    if not config:
        sys.exit("monarch_agents.proc_exec: no configuration on stdin (the host agent starts this)")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    from monarch_agents import proc_agent

    code = 1
    try:
        proc_agent.main(config)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        # As a proc forked from the zygote ends: at once, not after joining whatever threads user code left.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: S110 - nothing left to report a failed flush on
                pass
        os._exit(code)


if __name__ == "__main__":
    main()
