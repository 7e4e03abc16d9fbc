"""The CURVE keys of one job, and which of them each role holds.

Three kinds of process, three key pairs:

* the **client** (``monarch`` commands, the controller program) holds every key,
  and so do host agents that the client starts itself (local, Slurm): the
  client's key may ask a host agent to run a command, open a shell, spawn procs
  or shut down;
* **host agents** listen with their own server key pair (``host_*``), so only a
  peer that can prove the client's key, or a proc's, is heard by one; what a
  proc may ask of a host agent is decided there (``monarch_agents.host_agent``);
* **procs**, and so all user code in actors, get :meth:`JobKeys.for_procs`: the
  proc key pair (``proc_*``) and the members' server pair, with neither the
  client's secret nor the host agents'.  They can talk to the client and to other
  procs, and can ask their own host agent for what actors need, but cannot pass
  for the client to any host agent;
* host agents in pods (Kubernetes), where user code can read what the agent
  reads, get :meth:`JobKeys.for_hosts`: no client secret.  They speak with the
  host pair (role ``host``), which a client takes answers from as from its
  agents, but which another host agent treats as it treats a proc.

Kept apart from the transport so that reading a state file (``monarch status``,
``monarch stop``) does not pay for importing ZeroMQ.  Keys made before roles
existed (only the first four) still work: every process then holds every key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: The roles a message can come from (what a receiver's policy sees).
CLIENT, PROC, LOCAL_PROC, MEMBER, HOST = "client", "proc", "local-proc", "member", "host"


#: Set in a ``monarch`` command's process (:func:`admit_only_agents`): the runtimes it starts take
#: messages only from holders of the client's key (its host agents), never from a proc's key, which
#: every rank and actor holds.  Here, not in ``client``, so setting it imports no ZeroMQ.
_agents_only = False


def admit_only_agents(on: bool = True) -> None:
    global _agents_only
    _agents_only = on


def agents_only() -> bool:
    return _agents_only


@dataclass(frozen=True, slots=True)
class JobKeys:
    """The CURVE keys of one job, as z85 text (safe to keep in a 0600 file)."""

    server_public: str  # the members' (client's and procs') server pair
    server_secret: str
    client_public: str
    client_secret: str  # "" in a proc's keys and a pod's host agent's
    host_public: str = ""  # host agents' server pair
    host_secret: str = ""  # "" in a proc's keys
    proc_public: str = ""
    proc_secret: str = ""

    def as_dict(self) -> dict:
        """The keys by name (what agents read from their keys file or stdin)."""
        return asdict(self)

    @classmethod
    def generate(cls) -> "JobKeys":
        import zmq

        pairs = [zmq.curve_keypair() for _ in range(4)]
        (sp, ss), (cp, cs), (hp, hs), (pp, ps) = [(p.decode(), s.decode()) for p, s in pairs]
        return cls(sp, ss, cp, cs, hp, hs, pp, ps)

    def for_procs(self) -> "JobKeys":
        """What a proc (user code) holds: no client secret, no host agent secret."""
        if not self.proc_secret:  # keys from before roles: nothing to take away
            return self
        return JobKeys(self.server_public, self.server_secret, self.client_public, "",
                       self.host_public, "", self.proc_public, self.proc_secret)

    def for_hosts(self) -> "JobKeys":
        """What a host agent whose files user code can read (a pod) holds: its own pair, the proc
        pair it hands its procs, the members' server pair and the public keys; no client secret."""
        if not self.host_secret or not self.proc_secret:  # keys from before roles: nothing to take away
            return self
        return JobKeys(self.server_public, self.server_secret, self.client_public, "",
                       self.host_public, self.host_secret, self.proc_public, self.proc_secret)

    @property
    def role(self) -> str:
        if self.client_secret:
            return CLIENT
        return HOST if self.host_secret else PROC

    @property
    def identity(self) -> tuple[str, str]:
        """This process's own key pair as a CURVE client: the client's, a pod's host agent's, or a proc's."""
        if self.client_secret:
            return (self.client_public, self.client_secret)
        if self.host_secret:
            return (self.host_public, self.host_secret)
        return (self.proc_public, self.proc_secret)

    @property
    def host_server(self) -> tuple[str, str]:
        """The host agents' server pair (the members' one for keys from before roles)."""
        return (self.host_public, self.host_secret) if self.host_public else (self.server_public, self.server_secret)

    @property
    def member_secret(self) -> str:
        """The secret every member holds, which proves membership to a same-host member listener."""
        return self.proc_secret or self.client_secret

    def admitted(self) -> dict[str, str]:
        """The CURVE client keys a listener admits, and the role each stands for."""
        roles = {self.client_public: CLIENT}
        if self.host_public:
            roles[self.host_public] = HOST
        if self.proc_public:
            roles[self.proc_public] = PROC
        return roles
