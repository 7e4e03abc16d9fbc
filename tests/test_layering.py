"""The layering, kept true: monarch_cli -> monarch -> agents; monarch -> schedulers; agents -> rdmafs, telemetry.

Inside those parts, finer arrows (``INNER``): the workbench's engine (``monarch._workbench``) is under
Monarch's API, so it never imports ``monarch.job``, and imports ``monarch.actor`` only where it
implements an API function with actors (``exec_command``, ``PortForwarder``); its records
(``state``) are data and import neither; schedulers start host agents by command line and never
import the agent's code that runs there (``host_agent``, ``proc_agent``, ``services``);
``monarch_rdmafs`` and ``monarch_telemetry`` are leaves (the agents use them, never the reverse).

Every import in the source is read (top-level and inside functions, ``importlib.import_module``,
``__import__`` and ``sys.modules`` look-ups by name), so a lazy import cannot slip past; and in the
lower layers, every string that names a module of a layer above (``"monarch.actor"`` handed to a
child process to import, say), which is a dependency all the same.  Docstrings may mention them;
logger names such as ``"monarch.host_agent"`` name no module and pass.
"""

from __future__ import annotations

import ast
import os
import re

import pytest

from tests.helpers import ROOT

#: Part (its folder is its import name) -> the top-level names its code may not import.
FORBIDDEN = {
    "monarch_agents": {"monarch", "monarch_cli", "monarch_schedulers"},
    "monarch_schedulers": {"monarch", "monarch_cli"},
    "monarch_rdmafs": {"monarch", "monarch_cli"},
    "monarch_telemetry": {"monarch", "monarch_cli"},
    "monarch": {"monarch_cli"},
    # The CLI talks to the monarch layer only (it builds no agent message itself).
    "monarch_cli": {"monarch_agents", "monarch_schedulers"},
}


#: Module (or package, with everything under it) -> module prefixes it may not import, and why.
INNER = {
    "monarch._workbench": ({"monarch.job"}, "the engine is under the job API"),
    "monarch._workbench.state": ({"monarch.actor", "monarch.job"}, "records are data: the API layer builds API objects from them"),
    "monarch_schedulers": ({"monarch_agents.host_agent", "monarch_agents.proc_agent", "monarch_agents.services"},
                           "a scheduler starts agents by command line"),
    "monarch_rdmafs": ({"monarch_agents", "monarch_telemetry", "monarch_schedulers"}, "a leaf: the agents use it"),
    "monarch_telemetry": ({"monarch_agents", "monarch_rdmafs", "monarch_schedulers"}, "a leaf: the agents use it"),
}
#: The engine's modules that implement a Monarch API function on actors (monarch.job re-exports them).
ENGINE_ON_ACTORS = {"monarch._workbench.exec", "monarch._workbench.port_forward"}


def imported_names(source: str) -> list[tuple[int, str]]:
    """(line, module) for every module ``source`` imports or looks up by name."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                out.append((node.lineno, node.module))
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            target = ast.unparse(f.value) if isinstance(f, ast.Attribute) else ""
            by_name = name in ("import_module", "__import__") or (name in ("get", "pop") and target == "sys.modules")
            if by_name and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                out.append((node.lineno, node.args[0].value))
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "sys.modules":
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                out.append((node.lineno, key.value))
    return out


#: The top-level packages: each is the folder of the same name.
FOLDER_OF = {name: name for name in ("monarch", "monarch_cli", "monarch_agents", "monarch_schedulers",
                                     "monarch_rdmafs", "monarch_telemetry")}
#: Lower layers, where a string naming an upper layer's module is a hidden import.
STRING_CHECKED = ("monarch_agents", "monarch_schedulers", "monarch_rdmafs", "monarch_telemetry")
_DOTTED = re.compile(r"(?<![\w.])(monarch(?:_[a-z]+)?)((?:\.[A-Za-z_]\w*)*)")


def _is_module(top: str, rest: list[str], root: str = ROOT) -> bool:
    """Whether ``top.rest[0]...`` (or a shorter prefix of it, one part at least) is a module in this checkout."""
    base = os.path.join(root, FOLDER_OF[top])
    for n in range(len(rest), 0, -1):
        path = os.path.join(base, *rest[:n])
        if os.path.isdir(path) or os.path.isfile(path + ".py"):
            return True
    return False


def module_strings(source: str, forbidden: set[str], root: str = ROOT) -> list[tuple[int, str]]:
    """(line, name) for every string constant, docstrings aside, naming a module of ``forbidden``:
    ``"monarch_cli"`` or ``"monarch_cli.x"`` whatever follows; ``"monarch.x"`` when monarch/x is a module."""
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docstrings:
            continue
        for m in _DOTTED.finditer(node.value):
            top, rest = m.group(1), [p for p in m.group(2).split(".") if p]
            if top not in forbidden or top not in FOLDER_OF:
                continue
            # Bare "monarch" is the product's name everywhere; any other top-level name is a module.
            if (top != "monarch" and not rest) or (rest and _is_module(top, rest, root)):
                out.append((node.lineno, m.group(0)))
    return sorted(out)


def _sources(folder: str):
    base = os.path.join(ROOT, folder)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield os.path.join(dirpath, name)


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_no_import_against_the_arrows(folder):
    bad = []
    for path in _sources(folder):
        with open(path) as f:
            for line, module in imported_names(f.read()):
                if module.split(".")[0] in FORBIDDEN[folder]:
                    bad.append(f"{os.path.relpath(path, ROOT)}:{line} imports {module}")
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


#: Strings that are values of Monarch's own rows, not modules named: Monarch's ``spans`` table says its
#: Python user spans' tracing target is 'monarch.actor', and our view of that table says the same.
ROW_VALUES = {("monarch_telemetry/schema.py", "monarch.actor")}


@pytest.mark.parametrize("folder", STRING_CHECKED)
def test_no_upper_module_named_in_a_string(folder):
    bad = []
    for path in _sources(folder):
        rel = os.path.relpath(path, ROOT)
        with open(path) as f:
            for line, name in module_strings(f.read(), FORBIDDEN[folder]):
                if (rel, name) not in ROW_VALUES:
                    bad.append(f"{rel}:{line} names {name!r}")
    assert not bad, "modules of an upper layer named in strings (pass them in from that layer):\n" + "\n".join(bad)


def test_the_string_check_sees_module_names_and_not_logger_names():
    src = ('"""Docstring: monarch.actor is the API."""\n'
           'PRELOAD = ["monarch_agents.proc_agent", "monarch.actor"]\n'
           'def f():\n    """monarch._workbench.state in a docstring."""\n'
           '    run(["python", "-m", "monarch_cli.main"], env={"M": "monarch._workbench.state.JobSpec"})\n'
           'log = logging.getLogger("monarch.host_agent")\nLABEL = "monarch.pytorch.org/mesh-name"\n'
           'NAME = "monarch"\nCLI = "monarch_cli"\n')
    assert module_strings(src, {"monarch", "monarch_cli"}) == [
        (2, "monarch.actor"), (5, "monarch._workbench.state.JobSpec"), (5, "monarch_cli.main"), (9, "monarch_cli")]


def test_the_check_sees_every_kind_of_import():
    src = ("import monarch.job\nfrom monarch.errors import X\ndef f():\n    import monarch_cli.main\n"
           "importlib.import_module('monarch.actor')\nsys.modules.get('monarch.actor')\nsys.modules['monarch']\n"
           "from . import sibling\nlogging.getLogger('monarch.agents')\n")
    assert [m for _, m in imported_names(src)] == ["monarch.job", "monarch.errors", "monarch_cli.main",
                                                    "monarch.actor", "monarch.actor", "monarch"]


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[:-len(".py")].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_inner_arrows():
    """INNER's rules, and monarch.actor only in ENGINE_ON_ACTORS among the engine's modules."""
    bad = []
    for folder in FOLDER_OF:
        for path in _sources(folder):
            name = _module_name(path)
            rules = [(forbidden, why) for owner, (forbidden, why) in INNER.items() if _under(name, owner)]
            if _under(name, "monarch._workbench") and name not in ENGINE_ON_ACTORS:
                rules.append(({"monarch.actor"}, "only exec and port_forward implement API functions on actors"))
            if not rules:
                continue
            with open(path) as f:
                for line, module in imported_names(f.read()):
                    for forbidden, why in rules:
                        if any(_under(module, p) for p in forbidden):
                            bad.append(f"{os.path.relpath(path, ROOT)}:{line} imports {module} ({why})")
    assert not bad, "imports against the inner arrows:\n" + "\n".join(bad)


def test_inner_arrows_see_a_violation(tmp_path, monkeypatch):
    """The check above is no formality: a record that builds a HostMesh is caught."""
    base = tmp_path / "monarch" / "_workbench"
    base.mkdir(parents=True)
    (base / "state.py").write_text("def host_mesh():\n    from monarch.actor._mesh import HostMesh\n")
    import tests.test_layering as me

    monkeypatch.setattr(me, "ROOT", str(tmp_path))
    monkeypatch.setattr(me, "FOLDER_OF", {"monarch": "monarch"})
    with pytest.raises(AssertionError, match=r"state.py:2 imports monarch.actor._mesh \(records are data"):
        test_inner_arrows()
