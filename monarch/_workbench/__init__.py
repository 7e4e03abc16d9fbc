"""The workbench's engine under Monarch's API: private, no compatibility promised.

Reservations (``reserve``, ``state``), the run engine (``run``, ``exec``), run logs, the workspace
push, debug sessions, telemetry queries and the other pieces the ``monarch`` command and
``monarch.job`` are built on.  User programs import ``monarch.actor`` and ``monarch.job``, never
this package.
"""
