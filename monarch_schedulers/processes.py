"""Processes that schedulers start on this machine and later stop, known safely."""

from __future__ import annotations

import os
from dataclasses import dataclass

#: Two start times this close name the same process (psutil's clock ticks are 10 ms).
_SAME_START_S = 0.05
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


_boot_time: float | None = None
#: The kernel's flag (in /proc/PID/stat's flags) for a process that has begun to exit.
_PF_EXITING = 0x4


def _proc_stat(pid: int) -> tuple[float, str] | None:
    """(start time as psutil's ``create_time`` reads it, state letter) from /proc, a pid that is gone
    or exiting reading as a zombie; None where there is no /proc to read (then ask psutil)."""
    global _boot_time
    try:
        if _boot_time is None:
            with open("/proc/stat", "rb") as f:
                _boot_time = float(next(ln for ln in f if ln.startswith(b"btime ")).split()[1])
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return (0.0, "Z") if os.path.isdir("/proc/self") else None
    except (OSError, StopIteration, ValueError):
        return None
    fields = data[data.rindex(b")") + 2:].split()  # after the command name, which may hold spaces
    state = fields[0].decode()
    if int(fields[6]) & _PF_EXITING:
        # Killed and tearing down: its sockets are already closed (a client sees the agent gone) while
        # /proc still says R or D for a moment.  Taking it as alive made a SIGKILLed agent read as
        # "stopped or hung" now and then.
        state = "Z"
    return _boot_time + int(fields[19]) / _CLOCK_TICKS, state


@dataclass(frozen=True, slots=True)
class OwnedProcess:
    """A process a scheduler started (a host agent, a port-forward), known by its pid *and* start time.

    A pid alone is not an identity: after a reboot, or once the process has
    exited and the pid wrapped around, the same number names an unrelated
    process, which ``monarch stop`` must never signal.
    """

    pid: int
    started: float  # psutil's create_time (seconds since the epoch)

    @classmethod
    def of(cls, pid: int) -> "OwnedProcess":
        import psutil

        return cls(pid, psutil.Process(pid).create_time())

    def _process(self):  # -> psutil.Process | None
        import psutil

        try:
            p = psutil.Process(self.pid)
            # create_time is boot time plus a tick count: the same process always reads the same.
            if abs(p.create_time() - self.started) > _SAME_START_S:
                return None
            if p.status() == psutil.STATUS_ZOMBIE:  # exited, not reaped yet
                return None
            return p
        except psutil.Error:
            return None

    def _signal_pidfd(self, sig: int) -> bool:
        """Signal it through a pidfd (Linux): the fd names one process for good, so a start time read
        after it was opened proves it is ours, and the signal cannot reach a pid's next owner; a
        fraction of psutil's cost (``monarch stop`` signals every local host agent: 128 took 0.7 s
        through psutil on a loaded machine).  False where there are no pidfds (then psutil)."""
        import signal as _signal

        if not hasattr(os, "pidfd_open") or not hasattr(_signal, "pidfd_send_signal"):
            return False
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return True  # gone: nothing to signal
        except OSError:
            return False  # no pidfd support in this kernel
        try:
            proc = _proc_stat(self.pid)
            if proc is None:
                return False
            started, _ = proc  # one exiting still gets it (a SIGKILL ends some waits of an exit)
            if abs(started - self.started) > _SAME_START_S:
                return True  # another process has the pid now
            try:
                _signal.pidfd_send_signal(fd, sig)
            except ProcessLookupError:
                pass  # it exited meanwhile
            return True
        finally:
            os.close(fd)

    def alive(self) -> bool:
        proc = _proc_stat(self.pid)
        if proc is not None:  # Linux: read /proc, no psutil (every `monarch run` asks this of each agent)
            started, state = proc
            return state != "Z" and abs(started - self.started) <= _SAME_START_S
        return self._process() is not None

    def signal(self, sig: int) -> None:
        """Signal the process if it is still the process we started (never a pid's next owner)."""
        if self._signal_pidfd(sig):
            return
        import psutil

        p = self._process()
        if p is not None:
            try:
                p.send_signal(sig)  # psutil checks the start time again right before signalling
            except psutil.Error:  # it exited meanwhile
                pass
