"""The workspace service's messages: the chunk protocol between a client and the hosts.

A sync is: ``WsMissing`` to every host (which chunk ids does it lack), then
``WsChunks`` batches sent once by the client to the first host of a fan-out
tree (each host stores what it lacks and forwards the batch to its subtrees;
every host acknowledges each batch to the client), then ``WsCommit`` to every
host (switch the mount to the new manifest, which is itself a chunk).  The
same messages serve a later sync: only missing chunks travel; an edit's few new
chunks ride inside its ``WsCommit`` (one round).

``reply`` fields are the agents' port references (opaque here); answers are
the agents' ``Reply`` messages, sent through the callable the service is given.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class WsMissing:
    """Which of ``ids`` does this host lack?  Answers the list."""

    ids: list
    reply: Any


@dataclass(slots=True)
class WsChunks:
    """A batch of chunks; store the missing ones, forward to ``forward`` (a fan-out tree), acknowledge.

    The chunks travel as one buffer (``payload``, cut by ``sizes``) so that a batch of
    many small files is one frame, sent out of band (shared memory between processes of a host).
    """

    sync_id: str
    batch: int
    ids: list
    sizes: list
    payload: Any  # bytes-like
    forward: list  # addresses below this host in the tree, in tree order
    fanout: int
    reply: Any

    def __reduce__(self) -> Any:
        return WsChunks, (self.sync_id, self.batch, self.ids, self.sizes, pickle.PickleBuffer(self.payload),
                          self.forward, self.fanout, self.reply)

    def chunks(self):
        """(id, bytes-like) for each chunk of the batch."""
        view = memoryview(self.payload)
        pos = 0
        for cid, n in zip(self.ids, self.sizes):
            yield cid, view[pos:pos + n]
            pos += n

    def subtrees(self) -> list[tuple[str, list]]:
        """(next host, its own forward list) for each subtree below this host."""
        return split_tree(self.forward, self.fanout)


def split_tree(hosts: list, fanout: int) -> list[tuple[str, list]]:
    """Cut ``hosts`` into at most ``fanout`` subtrees: (root, the rest of that subtree).

    ``fanout`` 1 is a chain; every host then receives each byte once and sends it once.
    """
    if not hosts:
        return []
    k = max(1, fanout)
    per = -(-len(hosts) // k)
    return [(hosts[i], list(hosts[i + 1:i + per])) for i in range(0, len(hosts), per)]


@dataclass(slots=True)
class WsBatchDone:
    """A host's acknowledgement of one batch (the payload of its Reply); ``addr`` is the host agent's."""

    addr: str
    batch: int
    stored: int
    corrupt: list = field(default_factory=list)
    error: str = ""


@dataclass(slots=True)
class WsCommit:
    """Serve ``manifest_id`` at mount ``name`` (``mountpoint`` '' for the default place); answers the mount's status.

    ``source`` is the folder's path on the client: a command started there (or below) on
    this host starts in the mount instead.
    """

    name: str
    manifest_id: str
    mountpoint: str
    source: str
    reply: Any
    #: An edit's few new chunks (a ``WsChunks``), stored before the switch: one round to every host
    #: instead of two.  If they cannot all be stored, the answer is their ``WsBatchDone`` and the
    #: host does not switch.
    inline: Any = None


@dataclass(slots=True)
class WsUnmount:
    """Stop serving mount ``name``; answers True if it was mounted."""

    name: str
    reply: Any


@dataclass(slots=True)
class WsStatus:
    """Answers the service's status: mounts, store, transport."""

    reply: Any


@dataclass(slots=True)
class WsListDir:
    """For gather_mount: the entries of a directory on the host, as (name, mode, size, mtime_ns) rows."""

    path: str
    reply: Any


@dataclass(slots=True)
class WsStat:
    """For gather_mount: (mode, size, mtime_ns, link target or '') of a path on the host."""

    path: str
    reply: Any


@dataclass(slots=True)
class WsRead:
    """For gather_mount: bytes of a file on the host."""

    path: str
    offset: int
    length: int
    reply: Any
