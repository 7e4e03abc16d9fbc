"""The CURVE keys of one job.

Kept apart from the transport so that reading a state file (``monarch status``,
``monarch stop``) does not pay for importing ZeroMQ.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class JobKeys:
    """The CURVE keys of one job, as z85 text (safe to keep in a 0600 file)."""

    server_public: str
    server_secret: str
    client_public: str
    client_secret: str

    def as_dict(self) -> dict:
        """The four keys by name (what agents read from their keys file or stdin)."""
        return {"server_public": self.server_public, "server_secret": self.server_secret,
                "client_public": self.client_public, "client_secret": self.client_secret}

    @classmethod
    def generate(cls) -> "JobKeys":
        import zmq

        sp, ss = zmq.curve_keypair()
        cp, cs = zmq.curve_keypair()
        return cls(sp.decode(), ss.decode(), cp.decode(), cs.decode())
