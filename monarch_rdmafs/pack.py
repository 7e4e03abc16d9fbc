"""Pack a directory into a manifest and content-addressed chunks, rehashing only what changed.

Honours ``.gitignore`` and ``.monarchignore`` in every directory (gitignore
syntax; ``.monarchignore`` is read after ``.gitignore``, so ``!pattern`` there
brings back what git ignores); ``.git/`` and ``.monarch/`` are never packed.
Symlinks are kept as links and never followed, wherever they point.  A file is
read under a stat check before and after, so a file that changes while it is
read is read again: what is packed is never torn.

What it does not do: follow symlinks, keep hard links, owners or xattrs, or
pack sockets, FIFOs and devices (they are listed as skipped).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field


from monarch_rdmafs.errors import SourceChanged, WorkspaceUnreadable
from monarch_rdmafs.manifest import CHUNK_SIZE, DIR, FILE, LINK, Entry, Manifest, chunk_id

ALWAYS_IGNORED = frozenset({".git", ".monarch"})
IGNORE_FILES = (".gitignore", ".monarchignore")

#: Small files' bytes are kept from packing until they are sent, up to this much in all.
_KEEP_BYTES = 64 << 20
_KEEP_FILE_MAX = 1 << 20
_READ_TRIES = 3


@dataclass(frozen=True, slots=True)
class ChunkSource:
    """Where a chunk's bytes are on the client."""

    path: str
    offset: int
    length: int


@dataclass
class PackResult:
    """A packed tree: its manifest, where each chunk can be read again, and what was skipped (path, why)."""

    manifest: Manifest
    sources: dict[str, ChunkSource]
    skipped: list[tuple[str, str]] = field(default_factory=list)
    rehashed: int = 0  # files read this time (the others came from the stat cache)


@dataclass(frozen=True, slots=True)
class _Known:
    stamp: tuple
    chunks: tuple[str, ...]


class Packer:
    """Packs one directory again and again; a file whose stat did not change is not read again.

    ``unreadable`` says what to do with files or folders that cannot be read:
    ``"skip"`` lists them in :attr:`PackResult.skipped`, ``"fail"`` refuses the
    whole pack with :class:`WorkspaceUnreadable`.
    """

    def __init__(self, root: str, *, honour_ignores: bool = True, unreadable: str = "skip"):
        if unreadable not in ("skip", "fail"):
            raise ValueError(f"unreadable must be 'skip' or 'fail', not {unreadable!r}")
        self.root = os.path.abspath(root)
        self.honour_ignores = honour_ignores
        self.unreadable = unreadable
        self._known: dict[str, _Known] = {}
        self._kept: dict[str, bytes] = {}
        self._kept_total = 0

    def pack(self) -> PackResult:
        """Walk the tree now; raises WorkspaceUnreadable if the root is missing or unreadable."""
        try:
            st = os.stat(self.root)
        except FileNotFoundError:
            raise WorkspaceUnreadable(f"workspace {self.root} does not exist", "check the path") from None
        except OSError as e:
            raise WorkspaceUnreadable(f"workspace {self.root} cannot be read: {e.strerror}", "check its permissions") from None
        if not stat.S_ISDIR(st.st_mode):
            raise WorkspaceUnreadable(f"workspace {self.root} is not a directory", "give a directory")
        if not os.access(self.root, os.R_OK | os.X_OK):
            raise WorkspaceUnreadable(f"workspace {self.root} cannot be read: permission denied", "check its permissions")
        self._kept = {}
        self._kept_total = 0
        entries = [Entry("", DIR, stat.S_IMODE(st.st_mode), 0, st.st_mtime_ns)]
        sources: dict[str, ChunkSource] = {}
        skipped: list[tuple[str, str]] = []
        known: dict[str, _Known] = {}
        counter = [0]
        self._walk(self.root, "", [], entries, sources, skipped, known, counter)
        if skipped and self.unreadable == "fail":
            path, why = skipped[0]
            more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
            raise WorkspaceUnreadable(f"cannot read {path}: {why}{more}", "fix the permissions, or sync with --unreadable skip")
        self._known = known
        return PackResult(Manifest.build(entries), sources, skipped, counter[0])

    def read_chunk(self, cid: str, src: ChunkSource) -> bytes:
        """The chunk's bytes, read again now; raises SourceChanged if they are not what was packed."""
        data = self._kept.get(cid)
        if data is not None:
            return data
        try:
            with open(src.path, "rb") as f:
                f.seek(src.offset)
                data = f.read(src.length)
        except OSError as e:
            raise SourceChanged(f"{src.path} changed during the sync ({e.strerror})") from None
        if len(data) != src.length or chunk_id(data) != cid:
            raise SourceChanged(f"{src.path} changed during the sync")
        return data

    # -- walking --------------------------------------------------------------

    def _walk(self, abs_dir: str, rel_dir: str, specs: list, entries: list, sources: dict, skipped: list,
              known: dict, counter: list) -> None:
        try:
            with os.scandir(abs_dir) as it:
                items = sorted(it, key=lambda d: d.name)
        except OSError as e:
            skipped.append((rel_dir or ".", e.strerror or str(e)))
            return
        if self.honour_ignores:
            present = [d.name for d in items if d.name in IGNORE_FILES]
            if present:  # opened only where they exist: most folders have none
                specs = specs + self._ignore_specs(abs_dir, rel_dir)
        for d in items:
            rel = f"{rel_dir}/{d.name}" if rel_dir else d.name
            if d.name in ALWAYS_IGNORED and not rel_dir:
                continue
            try:
                st = d.stat(follow_symlinks=False)
            except OSError as e:
                skipped.append((rel, e.strerror or str(e)))
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            if self._ignored(specs, rel, is_dir):
                continue
            if stat.S_ISLNK(st.st_mode):
                try:
                    target = os.readlink(d.path)
                except OSError as e:
                    skipped.append((rel, e.strerror or str(e)))
                    continue
                entries.append(Entry(rel, LINK, 0o777, len(target), st.st_mtime_ns, (), target))
            elif is_dir:
                if not os.access(d.path, os.R_OK | os.X_OK):
                    skipped.append((rel + "/", "permission denied"))
                    continue
                entries.append(Entry(rel, DIR, stat.S_IMODE(st.st_mode), 0, st.st_mtime_ns))
                self._walk(d.path, rel, specs, entries, sources, skipped, known, counter)
            elif stat.S_ISREG(st.st_mode):
                entry = self._file(d.path, rel, st, sources, skipped, known, counter)
                if entry is not None:
                    entries.append(entry)
            else:
                skipped.append((rel, "not a regular file, directory or link"))

    def _ignore_specs(self, abs_dir: str, rel_dir: str) -> list:
        lines: list[str] = []
        for name in IGNORE_FILES:
            try:
                with open(os.path.join(abs_dir, name), encoding="utf-8", errors="replace") as f:
                    lines.extend(f.read().splitlines())
            except OSError:
                continue
        if not lines:
            return []
        import pathspec  # only where a folder has ignore files: its import is ~30 ms of every `monarch sync`

        return [(rel_dir, pathspec.GitIgnoreSpec.from_lines(lines))]

    @staticmethod
    def _ignored(specs: list, rel: str, is_dir: bool) -> bool:
        # The deepest file that has a say wins, as in git (a later spec can re-include with '!').
        verdict = False
        for base, spec in specs:
            sub = rel[len(base) + 1:] if base else rel
            result = spec.check_file(sub + "/" if is_dir else sub)
            if result.include is not None:
                verdict = result.include
        return verdict

    def _file(self, path: str, rel: str, st: os.stat_result, sources: dict, skipped: list, known: dict,
              counter: list) -> Entry | None:
        stamp = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        prev = self._known.get(rel)
        if prev is not None and prev.stamp == stamp:
            chunks = prev.chunks
            mtime_ns = st.st_mtime_ns
            size = st.st_size
        else:
            try:
                chunks, size, mtime_ns, stamp = self._read_stable(path, rel)
            except PermissionError:
                skipped.append((rel, "permission denied"))
                return None
            except OSError as e:
                skipped.append((rel, e.strerror or str(e)))
                return None
            counter[0] += 1
        known[rel] = _Known(stamp, chunks)
        for i, cid in enumerate(chunks):
            sources.setdefault(cid, ChunkSource(path, i * CHUNK_SIZE, min(CHUNK_SIZE, size - i * CHUNK_SIZE)))
        return Entry(rel, FILE, stat.S_IMODE(st.st_mode), size, mtime_ns, chunks)

    def _read_stable(self, path: str, rel: str) -> tuple[tuple[str, ...], int, int, tuple]:
        for _ in range(_READ_TRIES):
            with open(path, "rb") as f:
                before = os.fstat(f.fileno())
                chunks = []
                kept = []
                total = 0
                while True:
                    data = f.read(CHUNK_SIZE)
                    if not data:
                        break
                    total += len(data)
                    cid = chunk_id(data)
                    chunks.append(cid)
                    if before.st_size <= _KEEP_FILE_MAX:
                        kept.append((cid, data))
                after = os.fstat(f.fileno())
            if (before.st_size, before.st_mtime_ns, before.st_ctime_ns) == (after.st_size, after.st_mtime_ns, after.st_ctime_ns) \
                    and total == after.st_size:
                for cid, data in kept:
                    if self._kept_total + len(data) <= _KEEP_BYTES and cid not in self._kept:
                        self._kept[cid] = data
                        self._kept_total += len(data)
                stamp = (after.st_size, after.st_mtime_ns, after.st_ctime_ns, after.st_ino)
                return tuple(chunks), total, after.st_mtime_ns, stamp
        raise SourceChanged(f"{rel} kept changing while it was read", "sync again once it is written")
