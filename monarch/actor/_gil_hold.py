"""Monarch's test utility ``hold_gil_for_test``, named at
``monarch._rust_bindings.monarch_hyperactor.actor_mesh``."""

from __future__ import annotations

import ctypes
import threading
import time

__all__ = ["hold_gil_for_test"]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def hold_gil_for_test(delay_secs: float, hold_secs: float) -> None:
    """Start a thread that waits ``delay_secs``, then holds the GIL for ``hold_secs`` without once
    letting go (what a stuck C extension does), and returns at once.

    Python code can't hold the GIL that long (the interpreter hands it over every switch interval,
    and ``time.sleep`` releases it): the thread calls libc's ``nanosleep`` through
    ``ctypes.PyDLL``, whose calls keep the GIL."""
    libc = ctypes.PyDLL(None)
    libc.nanosleep.argtypes = [ctypes.POINTER(_Timespec), ctypes.POINTER(_Timespec)]
    whole = int(hold_secs)

    def hold() -> None:
        time.sleep(delay_secs)
        want = _Timespec(whole, int((hold_secs - whole) * 1e9))
        left = _Timespec(0, 0)
        # A signal cuts nanosleep short (EINTR): sleep what was left, still holding the GIL
        # between the calls but for the few bytecodes of this loop.
        while libc.nanosleep(ctypes.byref(want), ctypes.byref(left)) != 0 and (left.tv_sec or left.tv_nsec):
            want = _Timespec(left.tv_sec, left.tv_nsec)

    threading.Thread(target=hold, name="hold-gil-for-test", daemon=True).start()
