"""``monarch.timer``: time sections of code, on the CPU or, with CUDA, on the GPU (Monarch's names).

    from monarch.timer import ExecutionTimer
    with ExecutionTimer.time("step"):          # CUDA events when CUDA is there, else perf_counter
        ...
    ExecutionTimer.summary()["step"]           # {"count", "mean_ms", "total_ms", "min_ms", "max_ms"}

GPU sections are measured between two CUDA events of the current stream; the elapsed time is
read once the end event completes (a helper thread waits for it), so ``stop`` does not block.
``summary`` and ``get_latest_measurement`` wait for those in flight.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Iterator, Optional

__all__ = ["ExecutionTimer", "execution_timer_start", "execution_timer_stop", "get_latest_timer_measurement",
           "get_execution_timer_average_ms"]

log = logging.getLogger("monarch.timer")


def _cuda() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


class ExecutionTimer:
    """Named timing sections, process-wide (class methods, as in Monarch)."""

    _lock = threading.Lock()
    _times: dict[str, list[float]] = {}
    _cpu_starts: dict[str, list[float]] = {}
    _gpu_starts: dict[str, list[Any]] = {}
    _waiters: dict[str, list[threading.Thread]] = {}
    _warned = False

    @classmethod
    @contextlib.contextmanager
    def time(cls, name: Optional[str] = None, use_cpu: bool = False) -> Iterator[None]:
        cls.start(name, use_cpu)
        try:
            yield
        finally:
            cls.stop(name, use_cpu)

    @classmethod
    def start(cls, name: Optional[str] = None, use_cpu: bool = False) -> None:
        name = name or "default"
        torch = None if use_cpu else _cuda()
        with cls._lock:
            cls._times.setdefault(name, [])
            if torch is None:
                if not use_cpu and not cls._warned:
                    cls._warned = True
                    log.warning("CUDA is not available: ExecutionTimer measures CPU time")
                cls._cpu_starts.setdefault(name, []).append(time.perf_counter())
                return
        stream = torch.cuda.current_stream()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record(stream)
        with cls._lock:
            cls._gpu_starts.setdefault(name, []).append((begin, end, stream))

    @classmethod
    def stop(cls, name: Optional[str] = None, use_cpu: bool = False) -> None:
        name = name or "default"
        with cls._lock:
            cpu = cls._cpu_starts.get(name)
            gpu = cls._gpu_starts.get(name)
            if cpu and (use_cpu or not gpu):
                cls._times[name].append((time.perf_counter() - cpu.pop()) * 1000.0)
                return
            if not gpu:
                raise RuntimeError(f"ExecutionTimer.stop({name!r}) without a start()")
            begin, end, stream = gpu.pop()
        end.record(stream)

        def wait() -> None:
            end.synchronize()
            with cls._lock:
                cls._times[name].append(begin.elapsed_time(end))

        t = threading.Thread(target=wait, name="execution-timer", daemon=True)
        t.start()
        with cls._lock:
            cls._waiters.setdefault(name, []).append(t)

    @classmethod
    def _settle(cls, name: Optional[str] = None) -> None:
        with cls._lock:
            names = [name] if name else list(cls._waiters)
            waiting = [t for n in names for t in cls._waiters.pop(n, [])]
        for t in waiting:
            t.join()

    @classmethod
    def reset(cls) -> None:
        cls._settle()
        with cls._lock:
            cls._times.clear()
            cls._cpu_starts.clear()
            cls._gpu_starts.clear()

    @classmethod
    def summary(cls) -> dict[str, dict[str, float]]:
        cls._settle()
        with cls._lock:
            return {n: {"count": len(t), "mean_ms": sum(t) / len(t), "total_ms": sum(t), "min_ms": min(t),
                        "max_ms": max(t)} for n, t in cls._times.items() if t}

    @classmethod
    def get_latest_measurement(cls, name: Optional[str] = None) -> float:
        name = name or "default"
        cls._settle(name)
        with cls._lock:
            times = cls._times.get(name)
            if not times:
                log.warning("no timing recorded for section %r", name)
                return 0.0
            return times[-1]


def execution_timer_start(name: Optional[str] = None, use_cpu: bool = False) -> None:
    ExecutionTimer.start(name, use_cpu)


def execution_timer_stop(name: Optional[str] = None, use_cpu: bool = False) -> None:
    ExecutionTimer.stop(name, use_cpu)


def get_latest_timer_measurement(name: Optional[str] = None) -> Any:
    """The latest measurement of ``name``, in ms, as a float64 tensor."""
    import torch

    return torch.tensor(ExecutionTimer.get_latest_measurement(name), dtype=torch.float64)


def get_execution_timer_average_ms(name: str = "default") -> Any:
    """The mean of ``name``'s measurements, in ms, as a float64 tensor."""
    import torch

    return torch.tensor(ExecutionTimer.summary()[name]["mean_ms"], dtype=torch.float64)
