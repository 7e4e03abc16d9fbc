"""A host agent of a version before fan-outs: every service but ``fanout`` (it drops a Fanout unanswered)."""

from monarch_agents import host_agent
from monarch_agents.services.fanout import FanoutService

if __name__ == "__main__":
    host_agent.main(services=tuple(s for s in host_agent.SERVICES if s is not FanoutService))
