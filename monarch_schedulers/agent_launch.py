"""The command line that starts a host agent, shared by every scheduler."""

from __future__ import annotations

import json
import os
import sys

from monarch_agents.keys import JobKeys
from monarch_agents.files import write_atomic


def write_keys(job_dir: str, keys: JobKeys) -> str:
    """Keys for the agents of a job, in a 0600 file they read at start (never on a command line)."""
    path = os.path.join(job_dir, "keys.json")
    write_atomic(path, json.dumps(keys.as_dict()).encode())
    return path


def read_keys(job_dir: str) -> JobKeys:
    with open(os.path.join(job_dir, "keys.json")) as f:
        return JobKeys(**json.load(f))


def agent_argv(job_dir: str, *, python: str | None = None, extra: list[str] | None = None,
               preload: tuple[str, ...] | list[str] = (), keys_on_stdin: bool = False) -> list[str]:
    """``python -m monarch_agents.host_agent`` with the job's files; rank and hostname are added per host.

    ``preload``: modules its zygote imports once (a scheduler's ``agent_preload``).  ``keys_on_stdin``:
    the starter writes the keys to the agent's stdin (a pipe), so no file is named; else the agent
    reads the job folder's 0600 keys file, once, at start."""
    return [
        python or sys.executable, "-m", "monarch_agents.host_agent",
        *([] if keys_on_stdin else ["--keys-file", os.path.join(job_dir, "keys.json")]),
        *preload_args(preload),
        *(extra or []),
    ]


def preload_args(preload: tuple[str, ...] | list[str]) -> list[str]:
    """The host agent's ``--preload`` argument for ``preload`` (none for an empty list)."""
    return ["--preload", ",".join(preload)] if preload else []


def agent_file(job_dir: str, rank: int | str) -> str:
    return os.path.join(job_dir, "agents", f"{rank}.json")


#: Where a scheduler says how clients reach the agents when not at their addresses (kubernetes'
#: port-forward); absent when they are reached directly.
ROUTE_FILE = "route.json"


def read_route(job_dir: str) -> dict | None:
    """How a client reaches this job's agents (``monarch_agents.client.ensure_runtime``'s ``route``); None: directly."""
    try:
        with open(os.path.join(job_dir, ROUTE_FILE)) as f:
            route = json.load(f)
    except (OSError, ValueError):
        return None
    return route if isinstance(route, dict) else None


def project_root() -> str:
    """Where the ``agents`` package lives, for PYTHONPATH of agents started elsewhere."""
    # realpath: an editable install reaches this file through a link in site-packages.
    return os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
