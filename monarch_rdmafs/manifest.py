"""The manifest: one generation of a synced tree, as paths, modes, sizes, mtimes, links and chunk lists.

A manifest is itself stored and sent as a chunk (its bytes hashed like any
other), so a host learns a new generation by the manifest's id alone and the
client sends its bytes once, through the same fan-out as the files' chunks.

What it does not hold: owners, extended attributes, hard links (each path is
its own file), sockets or device files (skipped at pack time).
"""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass, field

import xxhash

#: Files are cut into chunks of this size; an edit inside a large file resends only the chunks it touched.
CHUNK_SIZE = 4 << 20

MANIFEST_FORMAT = "monarch-rdmafs-manifest"
MANIFEST_VERSION = 1

FILE, DIR, LINK = "f", "d", "l"


def chunk_id(data: bytes | memoryview) -> str:
    """The content address of ``data`` (xxh3-128, hex): fast, and catches corruption in transit."""
    return xxhash.xxh3_128_hexdigest(data)


@dataclass(frozen=True, slots=True)
class Entry:
    """One path of the tree ('' is the root directory)."""

    path: str
    kind: str  # FILE | DIR | LINK
    mode: int  # permission bits only
    size: int = 0
    mtime_ns: int = 0
    chunks: tuple[str, ...] = ()
    target: str = ""  # a link's target, exactly as on the client (never followed)

    @property
    def st_mode(self) -> int:
        kind = {FILE: stat.S_IFREG, DIR: stat.S_IFDIR, LINK: stat.S_IFLNK}[self.kind]
        return kind | self.mode

    @property
    def identity(self) -> tuple:
        """What a reader can see of this entry; equal identity means the same bytes and attributes."""
        return (self.kind, self.mode, self.size, self.mtime_ns, self.chunks, self.target)


@dataclass(frozen=True)
class Manifest:
    """A whole tree, entries sorted by path; ``id`` names the generation."""

    entries: tuple[Entry, ...]
    data: bytes = field(repr=False, default=b"")

    @classmethod
    def build(cls, entries: list[Entry]) -> "Manifest":
        ordered = tuple(sorted(entries, key=lambda e: e.path))
        rows = [[e.path, e.kind, e.mode, e.size, e.mtime_ns, list(e.chunks) if e.kind == FILE else e.target]
                for e in ordered]
        data = json.dumps({"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "entries": rows},
                          separators=(",", ":")).encode()
        return cls(ordered, data)

    @classmethod
    def from_bytes(cls, data: bytes) -> "Manifest":
        """Parse a manifest; raises ValueError if it is not one this version reads."""
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"not a manifest: {e}") from None
        if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
            raise ValueError("not a manifest")
        if doc.get("version") != MANIFEST_VERSION:
            raise ValueError(f"manifest version {doc.get('version')}, this reads {MANIFEST_VERSION}")
        entries = []
        try:
            for path, kind, mode, size, mtime_ns, extra in doc["entries"]:
                if kind == FILE:
                    entries.append(Entry(path, kind, mode, size, mtime_ns, tuple(extra)))
                else:
                    entries.append(Entry(path, kind, mode, size, mtime_ns, (), extra if kind == LINK else ""))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a manifest: {e}") from None
        _validate(entries)
        return cls(tuple(entries), bytes(data))

    @property
    def id(self) -> str:
        return chunk_id(self.data)

    def chunk_ids(self) -> set[str]:
        return {c for e in self.entries for c in e.chunks}

    @property
    def files(self) -> int:
        return sum(1 for e in self.entries if e.kind == FILE)

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries if e.kind == FILE)

    def by_path(self) -> dict[str, Entry]:
        return {e.path: e for e in self.entries}


def _validate(entries: list[Entry]) -> None:
    """Raise ValueError unless ``entries`` is a tree a host may serve or write out: relative paths with no
    ``..``, ``.`` or empty parts, each under a directory entry (never under a link, which a materialized
    tree would follow), sorted and unique, with well-formed chunk ids and sizes that match them."""
    from monarch_rdmafs.store import is_chunk_id

    if not entries or entries[0].path != "" or entries[0].kind != DIR:
        raise ValueError("a manifest starts with its root directory")
    kinds = {"": DIR}
    previous = ""
    for e in entries[1:]:
        p = e.path
        if type(p) is not str or not p or p <= previous:
            raise ValueError(f"manifest paths out of order or repeated at {p!r}")
        previous = p
        parts = p.split("/")
        if p.startswith("/") or "\0" in p or any(x in ("", ".", "..") for x in parts):
            raise ValueError(f"manifest path {p!r} is not a plain relative path")
        if e.kind not in (FILE, DIR, LINK) or type(e.mode) is not int or not 0 <= e.mode <= 0o7777:
            raise ValueError(f"manifest entry {p!r} has kind {e.kind!r} and mode {e.mode!r}")
        if type(e.size) is not int or e.size < 0 or type(e.mtime_ns) is not int:
            raise ValueError(f"manifest entry {p!r} has a bad size or time")
        if kinds.get(parent_of(p)[0]) != DIR:
            raise ValueError(f"manifest path {p!r} is not inside a directory of the tree")
        if e.kind == FILE:
            if not all(is_chunk_id(c) for c in e.chunks) or len(e.chunks) != -(-e.size // CHUNK_SIZE):
                raise ValueError(f"manifest file {p!r} has bad chunk ids or a size that does not match them")
        elif e.kind == LINK and (type(e.target) is not str or "\0" in e.target):
            raise ValueError(f"manifest link {p!r} has a bad target")
        kinds[p] = e.kind


def parent_of(path: str) -> tuple[str, str]:
    """('a/b', 'c') for 'a/b/c'; ('', 'c') for 'c'."""
    head, _, tail = path.rpartition("/")
    return head, tail
