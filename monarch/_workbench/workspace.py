"""Push a directory to every host of a reservation, where it is served read-only (``monarch sync``).

A sync packs the directory (only files whose stat changed are read again),
asks every host which chunks it lacks, sends those chunks once, to the first
host of a fan-out tree (hosts forward to hosts; each acknowledges each batch
here), and then tells every host to switch its mount to the new manifest.  An
edit (a few KiB new since the last commit) is one round: its chunks inside each
host's switch message, through the tree of host agents.
A batch a host finds corrupted is sent again to that host; a file that changed
while it was being sent restarts the sync from a fresh snapshot; a host that
dies or runs out of disk fails the sync with one line, and no host switches.

What it does not do: delete files on the hosts' own disks, or move bytes by
RDMA (see ``monarch_rdmafs.rdma``).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from monarch import config
from monarch.errors import WorkspaceError
from monarch_agents.errors import SupervisionError
from monarch_agents.messages import PortRef, Reply
from monarch_agents.runtime import Runtime
from monarch_rdmafs import messages as wm
from monarch_rdmafs.errors import SourceChanged, SyncError
from monarch_rdmafs.pack import Packer, PackResult
from monarch_rdmafs.rdma import choose_transport

#: A batch carries about this many bytes (one message, one frame).
BATCH_BYTES = 8 << 20
#: Batches sent and not yet acknowledged by every host.
WINDOW = 4
#: Hosts forward each batch to this many others (1 = a chain).
FANOUT = 2
#: ...and this many when all a sync sends is at most :data:`SMALL_BYTES` (an edit): a host's
#: upload is no concern then, the tree's depth is (256 hosts: 3 hops, not 8).
SMALL_FANOUT = 8
#: New chunks up to this many bytes in all go to every host without asking first which it lacks
#: (when every host had everything the last commit named): one round to every host fewer.
SMALL_BYTES = 1 << 20
#: ...and up to this many, inside each host's message through the tree of host agents (answers
#: merged on the way up), not down the chunk tree with every host acknowledging to the client on
#: a connection of its own (64 hosts: ~70 ms of the client accepting them).  Each subtree's message
#: holds a copy per host: 256 hosts, 8 MiB out of the client at most.
INLINE_BYTES = 32 << 10
_TRIES = 3
#: The answer port of a message sent through the tree (the tree gives it its own).
_NO_PORT = PortRef("", 0)
#: How long past its deadline a fan-out is waited for (its nodes answer by then, or say why not).
_FANOUT_GRACE_S = 1.0


@dataclass(frozen=True, slots=True)
class Target:
    """A host to sync to."""

    addr: str
    host: str
    rank: int
    mountpoint: str = ""  # '' for the host's default place for this mount's name


@dataclass
class SyncResult:
    """What one sync did."""

    generation: str
    files: int
    bytes: int
    sent_chunks: int
    sent_bytes: int
    seconds: float
    changed: bool
    skipped: list[tuple[str, str]] = field(default_factory=list)
    mounts: list[dict] = field(default_factory=list)  # each host's mount status
    transport: str = "tcp"
    transport_reason: str = ""


class WorkspacePusher:
    """Syncs one directory to a fixed set of hosts, as mount ``name``, again and again."""

    def __init__(self, rt: Runtime, source: str, targets: list[Target], *, name: str = "workspace",
                 unreadable: str = "skip", honour_ignores: bool = True, fanout: int = FANOUT,
                 direct: bool | None = None):
        """``direct``: ask each host straight from here, not through the tree of host agents
        (``monarch_agents.fanout``; None: its own rule, by the number of hosts)."""
        self.rt = rt
        self.direct = direct
        self.source = os.path.abspath(source)
        self.targets = list(targets)
        self.name = name
        self.fanout = fanout
        #: A sync fails if no host answers anything for this long (``monarch.config``'s
        #: ``sync_stall_timeout``, ``MONARCH_SYNC_STALL_S``): read here, so a bad value is a clear
        #: error where a sync is asked for, never a failed import.
        self.stall_s = config.seconds("sync_stall_timeout")
        self.packer = Packer(self.source, honour_ignores=honour_ignores, unreadable=unreadable)
        self.committed = ""
        #: Chunk ids every host had at the last commit: not asked about again.
        self.present: set[str] = set()
        #: Test hook: (batch number, payload) -> payload as it goes on the wire.
        self._tamper: Callable[[int, bytes], bytes] | None = None

    def sync(self, force: bool = False) -> SyncResult:
        """Push the directory as it is now; returns once every host serves it.

        A tree identical to the one this pusher last committed costs only the pack
        (a stat per file), unless ``force``.
        """
        if not self.targets:
            raise WorkspaceError("no hosts to sync to", "`monarch serve` first")
        t0 = time.monotonic()
        choice = choose_transport()
        for attempt in range(_TRIES):
            try:
                packed = self._pack()
                if packed.manifest.id == self.committed and not force:
                    m = packed.manifest
                    return SyncResult(m.id, m.files, m.total_bytes, 0, 0, time.monotonic() - t0, False, packed.skipped,
                                      [], choice.kind, choice.reason)
                pushed = self._push_edit(packed)
                if pushed is not None:
                    m = packed.manifest
                    sent_chunks, sent_bytes, mounts = pushed
                    self.committed = m.id
                    self.present = {*packed.sources, m.id}
                    return SyncResult(m.id, m.files, m.total_bytes, sent_chunks, sent_bytes, time.monotonic() - t0,
                                      True, packed.skipped, mounts, choice.kind, choice.reason)
                sent_chunks, sent_bytes = self._send(packed)
                break
            except SourceChanged as e:
                if attempt == _TRIES - 1:
                    raise WorkspaceError(e.message, "sync again once the files are written") from None
        manifest = packed.manifest
        changed = manifest.id != self.committed
        try:
            mounts = self._commit(manifest.id)
        except WorkspaceError as e:
            if "never arrived" not in e.message or not self.present:
                raise
            # A host no longer has a chunk we took it to have (its store was cleaned): ask them all.
            self.present = set()
            try:
                more_chunks, more_bytes = self._send(packed)
            except SourceChanged as sc:
                raise WorkspaceError(sc.message, "sync again once the files are written") from None
            sent_chunks, sent_bytes = sent_chunks + more_chunks, sent_bytes + more_bytes
            mounts = self._commit(manifest.id)
        self.committed = manifest.id
        self.present = {*packed.sources, manifest.id}
        return SyncResult(manifest.id, manifest.files, manifest.total_bytes, sent_chunks, sent_bytes,
                          time.monotonic() - t0, changed, packed.skipped, mounts, choice.kind, choice.reason)

    def close(self) -> list:
        """Stop serving this mount on every host."""
        return self._ask(lambda t: wm.WsUnmount(self.name, _NO_PORT))

    def _ask(self, make: Callable[[Target], Any], targets: list[Target] | None = None) -> list:
        """``make(target)`` to every host (or ``targets``) through the tree of host agents; their
        answers, in order.

        Raises WorkspaceError naming the first host (by rank) that failed or did not answer."""
        targets = self.targets if targets is None else targets
        out = []
        for t, (ok, value) in zip(targets, self._answers(make, targets)):
            if not ok:
                raise self._failure(t, value)
            out.append(value)
        return out

    def _answers(self, make: Callable[[Target], Any], targets: list[Target]) -> list[tuple[bool, Any]]:
        """``make(target)`` to each of ``targets`` through the tree of host agents: ``(ok, answer or
        why not)`` of each, in order (None: no answer)."""
        from monarch_agents.fanout import fan_out

        call = fan_out(self.rt, [(t.addr, t.host, make(t)) for t in targets], timeout_s=self.stall_s,
                       direct=self.direct)
        call.wait(self.stall_s + _FANOUT_GRACE_S)
        return [call.results.get(i, (False, None)) for i in range(len(targets))]

    def _failure(self, t: Target, value: Any) -> WorkspaceError:
        """Host ``t`` failed or did not answer (``value``: why, or None), in a user's words."""
        why = str(value).strip().splitlines()[0] if value is not None and str(value).strip() else ""
        if value is None or why.endswith("gave no answer in time"):
            return WorkspaceError(f"host {t.host} (rank {t.rank}) did not answer within {self.stall_s:.0f} s",
                                  "`monarch status` shows the hosts")
        if "stopped answering" in why:
            return WorkspaceError(f"host {t.host} (rank {t.rank}) died during the sync",
                                  "`monarch status` shows the hosts; `monarch serve` reserves again")
        return WorkspaceError(why)

    # -- steps --------------------------------------------------------------------

    def _pack(self) -> PackResult:
        try:
            return self.packer.pack()
        except SyncError as e:
            raise WorkspaceError(e.message, e.hint) from None

    def _send(self, packed: PackResult) -> tuple[int, int]:
        manifest = packed.manifest
        ids = [c for c in (*packed.sources, manifest.id) if c not in self.present]
        if not ids:
            return 0, 0
        size = sum(packed.sources[c].length if c in packed.sources else len(manifest.data) for c in ids)
        if self.present and size <= SMALL_BYTES:
            # An edit: every host had what the last commit named, so these chunks are new to them all
            # (one that is not is stored once and acknowledged all the same).
            missing = dict.fromkeys(ids)
        else:
            missing = {}
            for lacks in self._ask(lambda t: wm.WsMissing(ids, _NO_PORT)):
                missing.update(dict.fromkeys(lacks))
        if not missing:
            return 0, 0

        def read(cid: str) -> bytes:
            return manifest.data if cid == manifest.id else self.packer.read_chunk(cid, packed.sources[cid])

        if self.present and size <= INLINE_BYTES:
            return self._send_inline(list(missing), read)

        fanout = max(self.fanout, SMALL_FANOUT) if size <= SMALL_BYTES and self.fanout == FANOUT else self.fanout
        return _Transfer(self, list(missing), read, fanout).run()

    def _push_edit(self, packed: PackResult) -> tuple[int, int, list[dict]] | None:
        """An edit (every host had the last commit; at most :data:`INLINE_BYTES` new) in one round:
        its chunks inside each host's switch.  ``(chunks, bytes, mounts)``, or None where it is not
        an edit, or the two rounds must finish it (a chunk corrupted on the way, one a host no
        longer had).  A host that fails otherwise (full disk, gone, silent) fails the sync, and the
        hosts that had switched are switched back to the last commit: as with two rounds, a failed
        sync leaves every host serving the previous tree (those that switched served the new one
        for the moment in between)."""
        manifest = packed.manifest
        if not self.committed or not self.present:
            return None
        ids = [c for c in (*packed.sources, manifest.id) if c not in self.present]
        sizes = [packed.sources[c].length if c in packed.sources else len(manifest.data) for c in ids]
        if not ids or sum(sizes) > INLINE_BYTES:
            return None
        data = [manifest.data if c == manifest.id else self.packer.read_chunk(c, packed.sources[c]) for c in ids]
        payload = b"".join(data)
        wire = self._tamper(0, payload) if self._tamper else payload
        chunks = wm.WsChunks(uuid.uuid4().hex[:12], 0, ids, [len(d) for d in data], wire, [], 1, _NO_PORT)
        answers = self._answers(lambda t: wm.WsCommit(self.name, manifest.id, t.mountpoint, self.source, _NO_PORT,
                                                      chunks), self.targets)
        if all(ok and isinstance(v, dict) for ok, v in answers):
            return len(ids), len(payload), [v for _, v in answers]
        failed = [(t, ok, v) for t, (ok, v) in zip(self.targets, answers) if not (ok and isinstance(v, dict))]

        def redo(ok: bool, v: Any) -> bool:
            """The two rounds finish it: a chunk corrupted on the way, one a host no longer had."""
            return (ok and isinstance(v, wm.WsBatchDone) and bool(v.corrupt) and not v.error) or \
                (not ok and "never arrived" in str(v))

        if all(redo(ok, v) for _, ok, v in failed):
            if any(not ok for _, ok, _ in failed):
                self.present = set()  # a host lost chunks it had: the two rounds ask every host
            return None
        switched = [t for t, (ok, v) in zip(self.targets, answers) if ok and isinstance(v, dict)]
        stuck = self._switch_back(switched)
        t, ok, v = next(f for f in failed if not redo(f[1], f[2]))
        hint = "`monarch status` shows the hosts; sync again once fixed"
        if ok and isinstance(v, wm.WsBatchDone):
            raise WorkspaceError(f"host {t.host} (rank {t.rank}): {v.error}{stuck}", hint)
        e = self._failure(t, v)
        if stuck:
            raise WorkspaceError(e.message + stuck, e.hint or hint)
        raise e

    def _send_inline(self, ids: list[str], read: Callable[[str], bytes]) -> tuple[int, int]:
        """The chunks of a small edit to every host, one message each through the tree of host agents."""
        data = [read(c) for c in ids]
        payload, sizes = b"".join(data), [len(d) for d in data]
        sync_id = uuid.uuid4().hex[:12]
        for _ in range(_TRIES):
            wire = self._tamper(0, payload) if self._tamper else payload
            done = self._ask(lambda t, wire=wire: wm.WsChunks(sync_id, 0, ids, sizes, wire, [], 1, _NO_PORT))
            for t, d in zip(self.targets, done):
                if isinstance(d, wm.WsBatchDone) and d.error:
                    raise WorkspaceError(f"host {t.host} (rank {t.rank}): {d.error}",
                                         "`monarch status` shows the hosts; sync again once fixed")
            if not any(isinstance(d, wm.WsBatchDone) and d.corrupt for d in done):
                return len(ids), len(payload)
        raise WorkspaceError(f"the chunks arrived corrupted {_TRIES} times", "check the network; sync again")

    def _commit(self, manifest_id: str) -> list[dict]:
        """The two rounds' switch: every host serves ``manifest_id``, or none does.  A host that fails
        fails the sync, and those that had switched are switched back to the last commit (as
        :meth:`_push_edit` does); one that cannot be (or, on a first sync, has no tree to go back
        to) is named in the error's one line."""
        answers = self._answers(lambda t: wm.WsCommit(self.name, manifest_id, t.mountpoint, self.source, _NO_PORT),
                                self.targets)
        failed = [(t, v) for t, (ok, v) in zip(self.targets, answers) if not ok]
        if not failed:
            return [v for _, v in answers]
        stuck = self._switch_back([t for t, (ok, _) in zip(self.targets, answers) if ok])
        e = self._failure(*failed[0])
        if stuck:
            raise WorkspaceError(e.message + stuck, e.hint or "`monarch status` shows the hosts; sync again once fixed")
        raise e

    def _switch_back(self, switched: list[Target]) -> str:
        """Switch ``switched`` (hosts that took a sync that failed elsewhere) back to the last commit.
        What to add to the error's line: the hosts left serving the new tree (none: \"\")."""
        if not switched:
            return ""
        previous = self.committed
        if not previous:
            # A first sync: no tree to go back to.  They serve the new one while the others serve none.
            t0 = switched[0]
            more = f" (and {len(switched) - 1} more host{'s' if len(switched) > 2 else ''})" if len(switched) > 1 else ""
            return f"; host {t0.host} (rank {t0.rank}){more} switched and serves the new tree (no previous tree to go back to)"
        back = self._answers(lambda t: wm.WsCommit(self.name, previous, t.mountpoint, self.source, _NO_PORT), switched)
        # A host that could not be switched back serves the new tree while the others serve the
        # previous one: the user must hear it (in the same line), or runs there see other code.
        left = [(t, v) for t, (ok, v) in zip(switched, back) if not (ok and isinstance(v, dict))]
        if not left:
            return ""
        t0, v0 = left[0]
        more = f" (and {len(left) - 1} more host{'s' if len(left) > 2 else ''})" if len(left) > 1 else ""
        return (f"; host {t0.host} (rank {t0.rank}){more} could not be switched back and serves the new "
                f"tree: {self._failure(t0, v0).message}")


class _Transfer:
    """One push of chunks to every host: batches down the fan-out tree, acknowledged per host."""

    def __init__(self, pusher: WorkspacePusher, ids: list[str], read: Callable[[str], bytes], fanout: int = FANOUT):
        self.p = pusher
        self.fanout = fanout
        self.ids = ids
        self.read = read
        self.sync_id = uuid.uuid4().hex[:12]
        self.cond = threading.Condition()
        self.waiting: dict[int, set[str]] = {}  # batch -> host addresses still to acknowledge
        self.batches: dict[int, tuple[list[str], list[int]]] = {}
        self.resend: list[tuple[str, list[str]]] = []  # (host address, corrupt ids)
        self.failure: str = ""
        self.port_id = 0
        self.next_batch = 0
        self.last_progress = time.monotonic()

    # PortHandler
    def deliver(self, reply: Reply) -> None:
        done = reply.payload
        with self.cond:
            self.last_progress = time.monotonic()
            if not reply.ok or not isinstance(done, wm.WsBatchDone):
                self.failure = self.failure or str(done)
            elif done.error:
                host = self._host(done.addr)
                self.failure = self.failure or f"host {host.host} (rank {host.rank}): {done.error}"
            else:
                if done.corrupt:
                    self.resend.append((done.addr, done.corrupt))
                self.waiting.get(done.batch, set()).discard(done.addr)
            self.cond.notify_all()

    def lost(self, addr: str, error: SupervisionError) -> None:
        with self.cond:
            t = next((t for t in self.p.targets if t.addr == addr), None)
            who = f"host {t.host} (rank {t.rank})" if t else addr
            self.failure = self.failure or f"{who} died during the sync"
            self.cond.notify_all()

    def _host(self, addr: str) -> Target:
        return next((t for t in self.p.targets if t.addr == addr), Target(addr, addr, -1))

    def run(self) -> tuple[int, int]:
        rt = self.p.rt
        port = rt.open_port(self, [t.addr for t in self.p.targets])
        self.port = port
        sent_chunks = sent_bytes = 0
        try:
            root, rest = self.p.targets[0], [t.addr for t in self.p.targets[1:]]
            everyone = {t.addr for t in self.p.targets}
            for ids, sizes, payload in self._batches():
                self._wait(lambda: len([b for b in self.waiting.values() if b]) < WINDOW)
                self._send(root.addr, rest, ids, sizes, payload, everyone)
                sent_chunks += len(ids)
                sent_bytes += len(payload)
            self._wait(lambda: not any(self.waiting.values()) and not self.resend)
        finally:
            rt.close_port(port.port_id)
        return sent_chunks, sent_bytes

    def _batches(self):
        ids: list[str] = []
        sizes: list[int] = []
        parts: list[bytes] = []
        total = 0
        for cid in self.ids:
            data = self.read(cid)
            ids.append(cid)
            sizes.append(len(data))
            parts.append(data)
            total += len(data)
            if total >= BATCH_BYTES:
                yield ids, sizes, b"".join(parts)
                ids, sizes, parts, total = [], [], [], 0
        if ids:
            yield ids, sizes, b"".join(parts)

    def _send(self, addr: str, forward: list[str], ids: list[str], sizes: list[int], payload: bytes,
              hosts: set[str]) -> None:
        with self.cond:
            batch = self.next_batch
            self.next_batch += 1
            self.waiting[batch] = set(hosts)
            self.batches[batch] = (ids, sizes)
        wire = self.p._tamper(batch, payload) if self.p._tamper else payload
        msg = wm.WsChunks(self.sync_id, batch, ids, sizes, wire,
                          forward, self.fanout, self.port)
        try:
            self.p.rt.send(addr, msg)
        except SupervisionError:
            t = next((t for t in self.p.targets if t.addr == addr), None)
            with self.cond:
                self.failure = self.failure or f"host {t.host if t else addr} died during the sync"

    def _wait(self, ready: Callable[[], bool]) -> None:
        while True:
            with self.cond:
                while not self.failure and not self.resend and not ready():
                    self.cond.wait(0.5)
                    if time.monotonic() - self.last_progress > self.p.stall_s:
                        self.failure = f"the hosts stopped acknowledging chunks for {self.p.stall_s:.0f} s"
                if self.failure:
                    raise WorkspaceError(self.failure, "`monarch status` shows the hosts; sync again once fixed")
                resend, self.resend = self.resend, []
            if not resend:
                return
            for addr, corrupt in resend:
                # Corrupted on the way there: sent again, this time straight to that host.
                ids = list(dict.fromkeys(corrupt))
                data = [self.read(c) for c in ids]
                self._send(addr, [], ids, [len(d) for d in data], b"".join(data), {addr})


# -- a reservation's workspace -------------------------------------------------------------


@dataclass
class WorkspaceSpec:
    """What ``monarch serve --workspace`` asked for; kept in the job state."""

    source: str
    env_dir: str = ""
    unreadable: str = "skip"

    def mounts(self) -> list[tuple[str, str, bool]]:
        """(mount name, local folder, honour ignore files) for each tree to sync."""
        out = [("workspace", self.source, True)]
        if self.env_dir:
            out.append(("env", self.env_dir, False))  # an environment is synced whole
        return out


def check_source(path: str, what: str = "workspace") -> str:
    """The absolute path of a folder to sync; WorkspaceError naming it if it is missing or unreadable."""
    p = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(p):
        raise WorkspaceError(f"{what} {path} does not exist", "give an existing folder")
    if not os.path.isdir(p):
        raise WorkspaceError(f"{what} {path} is not a folder", "give a folder")
    if not os.access(p, os.R_OK | os.X_OK):
        raise WorkspaceError(f"{what} {path} cannot be read: permission denied", "check its permissions")
    return p


class ReservationSync:
    """The workspace (and environment) of one reservation, synced to all its hosts.

    The stat cache and the last generation committed are kept in the job's folder,
    so a ``monarch run`` that changed nothing pays only for a stat of each file.
    """

    def __init__(self, record: Any, rt: Runtime | None = None):
        spec = WorkspaceSpec(**record.workspace)
        self.record = record
        self.rt = rt or record.runtime()
        hosts = sorted(record.hosts, key=lambda h: h.host_rank)
        targets = [Target(h.addr, h.host, h.host_rank) for h in hosts]
        # A pod's host agent holds no client key: it could not forward (see monarch._workbench.hosts).
        direct = True if record.spec.scheduler == "kubernetes" else None
        self.pushers = [WorkspacePusher(self.rt, src, targets, name=name, unreadable=spec.unreadable,
                                        honour_ignores=ignores, direct=direct) for name, src, ignores in spec.mounts()]
        self._index_path = os.path.join(record.job_dir, "workspace.index")
        self._load_index()

    def sync(self) -> list[SyncResult]:
        """Push every tree now (unchanged trees cost a stat of each file)."""
        results = []
        for p in self.pushers:
            results.append(p.sync())
        self._save_index()
        return results

    def mounts(self) -> dict[int, dict]:
        """Host rank -> the workspace mount's status there, from the last sync."""
        return self._mounts

    def _load_index(self) -> None:
        import pickle

        self._mounts: dict[int, dict] = {}
        try:
            with open(self._index_path, "rb") as f:
                saved = pickle.load(f)
        except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, ValueError):
            return
        if not isinstance(saved, dict) or saved.get("hosts") != [t.addr for t in self.pushers[0].targets]:
            return
        for p in self.pushers:
            known = saved.get("known", {}).get(p.name)
            if isinstance(known, dict):
                p.packer._known = known
            p.committed = saved.get("committed", {}).get(p.name, "")
            p.present = set(saved.get("present", {}).get(p.name, ()))

    def _save_index(self) -> None:
        import pickle

        from monarch._workbench.state import write_atomic

        data = {"hosts": [t.addr for t in self.pushers[0].targets],
                "known": {p.name: p.packer._known for p in self.pushers},
                "committed": {p.name: p.committed for p in self.pushers},
                "present": {p.name: sorted(p.present) for p in self.pushers}}
        try:
            # Not durable: two fsyncs were 15-70 ms of an edit's sync under load, and a crash that
            # loses the index only costs the next sync a hash of each file and a question to each host.
            write_atomic(self._index_path, pickle.dumps(data, protocol=5), durable=False)
        except OSError:
            pass  # only a cache


def set_workspace(record: Any, path: str, *, source: str, env_dir: str = "", unreadable: str = "skip") -> None:
    """Record in the job state that ``source`` (and ``env_dir``) are synced to the hosts."""
    from monarch._workbench.state import save_state

    record.workspace = {"source": check_source(source),
                        "env_dir": check_source(env_dir, "environment folder") if env_dir else "",
                        "unreadable": unreadable}
    save_state(path, record)


def describe(results: list[SyncResult], hosts: int) -> str:
    """One line about a sync, in a user's words."""
    parts = []
    for r, name in zip(results, ("workspace", "env")):
        what = f"{name}: {r.files:,} files, {fmt_bytes(r.bytes)}"
        if not r.changed and not r.sent_chunks:
            parts.append(f"{what}, unchanged")
        else:
            parts.append(f"{what}, sent {fmt_bytes(r.sent_bytes)} ({r.sent_chunks} chunks) in {r.seconds * 1000:.0f} ms")
    skipped = sum(len(r.skipped) for r in results)
    line = f"synced to {hosts} host{'s' if hosts != 1 else ''}: " + "; ".join(parts)
    if skipped:
        line += f"; skipped {skipped} unreadable: " + ", ".join(p for r in results for p, _ in r.skipped[:5])
    return line


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
