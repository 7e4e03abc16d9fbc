"""A host agent with one more service, plugged in as a new capability would be.

``python -m tests.agents.echo_service`` runs the real host agent with
``EchoService`` listed first (so it stops last).  Its stop writes what it saw
(children still running, the other services' state) to ``<log_dir>/echo-stop.json``;
the process writes ``<log_dir>/exited-normally`` at interpreter exit, which an
``os._exit`` would skip.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time

from monarch_agents import host_agent
from monarch_agents.messages import Message, PortRef, message
from monarch_agents.services import Service


@message
class Echo(Message):
    text: str
    reply: PortRef


class EchoService(Service):
    name = "echo"

    def __init__(self, agent):
        super().__init__(agent)
        self.count = 0

    def handlers(self):
        return {Echo: self.on_echo}

    def info(self):
        return {"echoed": self.count}

    def on_echo(self, msg: Echo) -> None:
        self.count += 1
        self.agent.reply(msg.reply, (msg.text, threading.current_thread().name))

    def stop(self, deadline: float) -> None:
        runs = next(s for s in self.agent.services if s.name == "runs")
        seen = {"children": len(self.agent.children), "left_s": deadline - time.monotonic(), "runs": len(runs.runs)}
        with open(os.path.join(self.agent.log_dir, "echo-stop.json"), "w") as f:
            json.dump(seen, f)


def _log_dir() -> str:
    return sys.argv[sys.argv.index("--log-dir") + 1]


if __name__ == "__main__":
    # By its importable name: clients pickle Echo as tests.agents.echo_service.Echo, not __main__.Echo.
    from tests.agents.echo_service import EchoService as Plugged

    atexit.register(lambda: open(os.path.join(_log_dir(), "exited-normally"), "w").close())
    host_agent.main(services=(Plugged, *host_agent.SERVICES))
