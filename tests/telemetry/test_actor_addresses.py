"""``actors.full_name`` is Monarch's actor address (``actor.proc@location``, read back by
``monarch.actor.ActorAddr.from_string``), and the agents that really run a job (each host's host
agent, each proc's proc agent) have their rows in the host mesh and proc mesh they serve, as
Monarch's HostAgent and ProcAgent do; our own views (the admin tree, the TUI) still list only the
program's actors."""

from __future__ import annotations

import time

from monarch._rust_bindings.monarch_hyperactor.proc import ActorAddr
from monarch._workbench.job_services import AdminTree, hosts_of
from monarch.actor import Actor, endpoint
from monarch.job import ProcessJob


class Addressed(Actor):
    @endpoint
    def where(self) -> int:
        import os

        return os.getpid()


def _rows(q, sql: str, n: int) -> list[dict]:
    """The rows of ``sql`` once there are ``n`` (rows reach the hosts a few times a second)."""
    rows: list[dict] = []
    for _ in range(100):
        rows = q(sql)["rows"]
        if len(rows) >= n:
            break
        time.sleep(0.2)
    return rows


def test_actor_rows_are_monarch_addresses_with_the_agents_in_their_meshes(no_leaked_processes):
    job = ProcessJob({"hosts": 1}).enable_telemetry()
    state = job.state(cached_path=None)
    q = state.query_engine_client.query
    try:
        actors = state.hosts.spawn_procs(per_host={"gpus": 2}, name="addr_procs").spawn("addressed", Addressed)
        pids = sorted(pid for _, pid in actors.where.call().get().items())
        rows = _rows(q, "SELECT a.full_name, a.display_name, a.rank, m.class, m.given_name, m.id AS mesh "
                        "FROM actors a JOIN meshes m ON a.mesh_id = m.id", 6)
        addrs = [(r, ActorAddr.from_string(r["full_name"])) for r in rows]  # every row is an address

        agents = sorted((r["rank"], a) for r, a in addrs if a.label == "proc_agent")
        assert [rank for rank, _ in agents] == [0, 1]
        assert {r["given_name"] for r, a in addrs if a.label == "proc_agent"} == {"addr_procs"}
        assert all(r["display_name"] is None for r, a in addrs if a.label in ("proc_agent", "host_agent"))
        # A proc's agent names the process its actors run in: rank r's actor is in rank r's proc.
        workers = {r["rank"]: a for r, a in addrs if r["given_name"] == "addressed"}
        assert [workers[rank].proc_id for rank in (0, 1)] == [a.proc_id for _, a in agents]
        assert sorted(int(a.proc_label.rsplit("-", 1)[1]) for _, a in agents) == pids

        [host_agent] = [(r, a) for r, a in addrs if a.label == "host_agent"]
        assert host_agent[0]["class"] == "Host" and host_agent[0]["rank"] == 0
        [root] = [ActorAddr.from_string(r["full_name"])
                  for r in q("SELECT full_name FROM actors WHERE display_name = '<root>'")["rows"]]
        assert (root.label, root.proc_label) == ("client", "local")

        # Our own views list the program's actors only (the agents are system actors).
        tree = AdminTree(hosts_of({"hosts": state.hosts}), "now")
        host_ref = tree.resolve("root")["children"][0]
        procs = [tree.resolve(ref) for ref in tree.resolve(host_ref)["children"]]
        listed = [c for p in procs if p["properties"]["Proc"]["proc_name"].startswith("addr_procs")
                  for c in p["children"]]
        assert len(listed) == 2 and all("proc_agent" not in c for c in listed), listed
        assert all(tree.resolve(c)["properties"]["Actor"]["actor_type"] == "Addressed" for c in listed)
    finally:
        job.kill()
