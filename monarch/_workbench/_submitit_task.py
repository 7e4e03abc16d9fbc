"""One host's share of a submitit job on a monarch reservation (run by the host agent, not by users).

``python -m monarch._workbench._submitit_task FOLDER`` starts ``MONARCH_SUBMITIT_TASKS_PER_NODE`` tasks of
``python -m submitit.core._submit FOLDER``, each with its ranks in the environment and its output
in submitit's log files (``<job>_<task>_log.out`` / ``.err``), then waits for them:

* ``SIGTERM``/``SIGINT``/``SIGUSR2`` are passed on to every task (a cancel, a preemption);
* at ``timeout - signal_delay`` the tasks get SIGUSR2 (submitit's checkpoint signal), at the
  timeout SIGTERM, then SIGKILL;
* a task that asks to be requeued (exit code :data:`REQUEUE_EXIT_CODE`, after checkpointing) starts
  the tasks of this host again, with the checkpointed submission.

Its exit code is the first failing task's (128 + signal for a task killed by a signal).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from monarch._workbench.exit_status import exit_status

#: What a task exits with to be started again (see MonarchJobEnvironment._requeue).
REQUEUE_EXIT_CODE = 144
#: What this launcher exits with when the job ran out of time (as `timeout(1)` does).
TIMEOUT_EXIT_CODE = 124
_MAX_REQUEUES = 6
_KILL_GRACE_S = 2.0


def _paths(folder: str, job_id: str, task: int) -> tuple[str, str]:
    base = os.path.join(folder, f"{job_id}_{task}_log")
    return base + ".out", base + ".err"


class Tasks:
    def __init__(self, folder: str):
        env = os.environ
        self.folder = folder
        self.job_id = env["MONARCH_SUBMITIT_JOB_ID"]
        self.per_node = int(env["MONARCH_SUBMITIT_TASKS_PER_NODE"])
        self.node = int(env["NODE_RANK"])
        self.timeout_s = float(env.get("MONARCH_SUBMITIT_TIMEOUT_S") or 0)
        self.signal_delay_s = float(env.get("MONARCH_SUBMITIT_SIGNAL_DELAY_S") or 0)
        self.merge_stderr = env.get("MONARCH_SUBMITIT_STDERR_TO_STDOUT") == "1"
        self.procs: list[subprocess.Popen] = []
        self.files: list = []
        self.timed_out = False

    def start(self) -> None:
        # The folder its client made private (0700): a task unpickles its function from it.
        from monarch_agents.files import private_dir

        private_dir(self.folder)
        for local in range(self.per_node):
            rank = self.node * self.per_node + local
            out_path, err_path = _paths(self.folder, self.job_id, rank)
            out = open(out_path, "ab")
            err = out if self.merge_stderr else open(err_path, "ab")
            self.files += [out] if err is out else [out, err]
            env = {**os.environ, "MONARCH_SUBMITIT_LOCALID": str(local), "MONARCH_SUBMITIT_GLOBALID": str(rank),
                   "SUBMITIT_EXECUTOR": "monarch"}
            self.procs.append(subprocess.Popen([sys.executable, "-u", "-m", "submitit.core._submit", self.folder],
                                               env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL))

    def forward(self, signum: int, *_: object) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.send_signal(signum)
                except ProcessLookupError:
                    pass

    def wait(self) -> list[int]:
        started = time.monotonic()
        warned = False
        while any(p.poll() is None for p in self.procs):
            elapsed = time.monotonic() - started
            if self.timeout_s and not warned and elapsed >= max(0.0, self.timeout_s - self.signal_delay_s):
                warned = True
                self.forward(signal.SIGUSR2)
            if self.timeout_s and elapsed >= self.timeout_s + _KILL_GRACE_S:
                self.timed_out = True
                self.forward(signal.SIGTERM)
                deadline = time.monotonic() + _KILL_GRACE_S
                while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
                    time.sleep(0.02)
                self.forward(signal.SIGKILL)
                break
            time.sleep(0.01)
        codes = [p.wait() for p in self.procs]
        # Tasks that fail after the timeout signal ran out of time (submitit's own answer to it, for a
        # callable that cannot checkpoint, is to fail), unless they asked to be requeued.
        if warned and REQUEUE_EXIT_CODE not in codes and any(codes):
            self.timed_out = True
        for f in self.files:
            f.close()
        self.procs, self.files = [], []
        return codes


def exit_code(codes: list[int]) -> int:
    """The first failing task's status (tasks are one run: the first failure is the news)."""
    for c in codes:
        if c != 0:
            return exit_status(c)
    return 0


def main() -> None:
    tasks = Tasks(sys.argv[1])
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
        signal.signal(sig, tasks.forward)
    for _ in range(_MAX_REQUEUES + 1):
        tasks.start()
        codes = tasks.wait()
        if REQUEUE_EXIT_CODE not in codes:
            break
    sys.exit(TIMEOUT_EXIT_CODE if tasks.timed_out else exit_code(codes))


if __name__ == "__main__":
    main()
