"""The workbench's engine under Monarch's API: private, no compatibility promised.

Reservations (``reserve``, ``state``), the run engine (``run``, ``exec``), run logs, the workspace
push, debug sessions, telemetry queries and the other pieces the ``monarch`` command and
``monarch.job`` are built on.  User programs import ``monarch.actor`` and ``monarch.job``, never
this package.
"""


def command_process(on: bool = True) -> None:
    """This process is a ``monarch`` command (status, run, debug, dashboard, query...), not a program
    with actors: the runtimes it starts hear only the reservation's host agents, never a proc's key
    (any rank or actor holds one).  An actor program a command runs is a process of its own."""
    from monarch_agents.keys import admit_only_agents

    admit_only_agents(on)
