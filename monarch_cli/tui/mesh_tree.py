"""The mesh as a tree: hosts -> proc agents -> actors, and the ranks of the latest run.

Updated in place every refresh (labels change, nodes come and go) so that the cursor,
what is expanded and the scroll position stay where the user left them: a refresh only
relabels the nodes whose label changed (``statistics()`` says how many), and never makes
Textual rebuild its list of lines unless nodes came, went or were opened.  Hosts start
expanded when the mesh is small; with more hosts or procs they start collapsed (their
line counts procs, ranks and failures), so 1,000 procs are a handful of lines until a
host is opened; a filter opens the hosts it matches in.  Procs start collapsed.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from rich.text import Text
from textual.widgets import Tree

from monarch_cli.tui.source import ActorView, HostView, ProcView, Snapshot
from monarch_cli.tui.text import proc_status, proc_status_words, size, style_of

#: Hosts start expanded up to this many ...
EXPAND_HOSTS_MAX = 8
#: ... and while the mesh has at most this many procs and ranks in all.
EXPAND_PROCS_MAX = 128


@dataclass(frozen=True)
class TreeRefresh:
    """What the last refresh of the tree did."""

    nodes: int
    added: int
    removed: int
    relabelled: int


def _fields(view: Any) -> tuple:
    """A view's values (flat dataclasses of scalars), to tell whether its label can have changed."""
    return tuple(view.__dict__.values())


def _matches(needle: str, *hay: Any) -> bool:
    return any(needle in str(h).lower() for h in hay if h is not None)


class MeshTree(Tree):
    """Hosts, procs, actors and ranks with live status colours; `/` filters by name, status or host."""

    def __init__(self, **kw: Any):
        super().__init__("reservation", **kw)
        self.show_root = True
        self.guide_depth = 3
        self._by_key: dict[tuple, Any] = {}
        #: What each node's label was made from: an unchanged one is not made again.
        self._made_from: dict[tuple, tuple] = {}
        self.filter_text = ""
        self._last: Snapshot | None = None
        self._stats = TreeRefresh(0, 0, 0, 0)

    def statistics(self) -> TreeRefresh:
        """Nodes in the tree, and how many the last refresh added, removed and relabelled."""
        return self._stats

    def set_filter(self, text: str) -> None:
        self.filter_text = text.strip().lower()
        if self._last is not None:
            self.show(self._last)
            if self.filter_text:  # what matched is in sight, even under a collapsed host
                for key, node in self._by_key.items():
                    if key[0] == "host" and node.children and not node.is_expanded:
                        node.expand()

    def show(self, snap: Snapshot) -> None:
        self._last = snap
        root = Text.assemble((f"{snap.name or 'reservation'}", "bold"), f"  {snap.scheduler} {snap.job_id}".rstrip())
        if self.root.label != root:
            self.root.set_label(root)
        wanted = list(self._wanted(snap))
        keys = {k for k, *_ in wanted}
        gone = sorted((k for k in self._by_key if k not in keys), key=len, reverse=True)
        for key in gone:
            node = self._by_key.pop(key)
            self._made_from.pop(key, None)
            try:
                node.remove()
            except (ValueError, KeyError):  # already gone with its parent (textual's _remove)
                pass
        many = len(snap.hosts) > EXPAND_HOSTS_MAX or len(snap.procs) > EXPAND_PROCS_MAX
        added = relabelled = 0
        for key, parent, made_from, make_label, data, leaf in wanted:
            node = self._by_key.get(key)
            if node is None:
                under = self.root if parent is None else self._by_key[parent]
                if leaf:
                    node = under.add_leaf(make_label(), data=data)
                else:
                    node = under.add(make_label(), data=data, expand=key[0] == "host" and not many)
                self._by_key[key] = node
                added += 1
            elif self._made_from.get(key) != made_from:
                label = make_label()
                if node.label != label:  # text and every span's style
                    node.set_label(label)
                    relabelled += 1
            self._made_from[key] = made_from
            node.data = data
        if not self.root.is_expanded:  # expand() makes Textual rebuild every line, even when open
            self.root.expand()
        self._stats = TreeRefresh(len(self._by_key), added, len(gone), relabelled)

    def _wanted(self, snap: Snapshot):
        """(key, parent key, what its label is made from, how to make it, data, leaf) for every node, parents first."""
        needle = self.filter_text
        actors: dict[tuple, list[ActorView]] = {}
        for a in snap.actors:
            actors.setdefault((a.host, a.pid), []).append(a)
        for h in snap.hosts:
            procs = [p for p in snap.procs if p.host == h.host]
            failed = sum(proc_status(p) in ("failed", "killed") for p in procs)
            failed += sum(a.status == "Failed" for p in procs for a in actors.get((h.host, p.pid), []))
            children = []
            for p in procs:
                acts = actors.get((h.host, p.pid), []) if p.kind == "proc" else []
                shown_acts = [a for a in acts if not needle or _matches(needle, a.name, a.status, h.host)]
                proc_hit = not needle or _matches(needle, p.mesh, p.pid, proc_status_words(p), h.host,
                                                  f"rank {p.rank}" if p.kind == "rank" else None)
                if proc_hit or shown_acts:
                    children.append((p, acts if proc_hit else shown_acts))
            if needle and not children and not _matches(needle, h.host):
                continue
            hkey = ("host", h.host)
            counts = (sum(p.kind == "proc" for p in procs), sum(p.kind == "rank" for p in procs), failed)
            yield hkey, None, (_fields(h), counts), partial(self._host_label, h, procs, failed), h, False
            for p, acts in children:
                pkey = (p.kind, h.host, p.pid)
                made_from = (_fields(p), len(acts), sum(a.status == "Failed" for a in acts))
                yield pkey, hkey, made_from, partial(self._proc_label, p, acts), p, not acts
                for a in acts:
                    yield (("actor", h.host, p.pid, a.full_name), pkey, _fields(a), partial(self._actor_label, a), a,
                           True)

    @staticmethod
    def _host_label(h: HostView, procs: list[ProcView], failed: int) -> Text:
        if not h.answering:
            return Text.assemble((h.host, "dim"), ("  not answering", "dim italic"))
        nprocs = sum(p.kind == "proc" for p in procs)
        nranks = sum(p.kind == "rank" for p in procs)
        t = Text.assemble((h.host, "bold"), f"  {nprocs} procs · {nranks} ranks · load {h.load_1m:.1f}")
        if failed:
            t.append(f"  ✗ {failed} failed", style="bold red")
        return t

    @staticmethod
    def _proc_label(p: ProcView, acts: list[ActorView]) -> Text:
        st = proc_status(p)
        if p.kind == "rank":
            t = Text.assemble(f"rank {p.rank}", f"  pid {p.pid}  ", (proc_status_words(p), style_of(st)))
        else:
            t = Text.assemble(f"proc {p.mesh or '?'}/{p.pid}", f"  {len(acts)} actors  ",
                              (proc_status_words(p), style_of(st)))
            failed = sum(a.status == "Failed" for a in acts)
            if failed:
                t.append(f"  ✗ {failed} failed", style="bold red")
        if p.rss_bytes:
            t.append(f"  {size(p.rss_bytes)}", style="dim")
        return t

    @staticmethod
    def _actor_label(a: ActorView) -> Text:
        return Text.assemble(a.name, "  ", (a.status.lower(), style_of(a.status)))
