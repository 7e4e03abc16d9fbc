"""Every table and column is documented once (schema.py), and README carries that same reference."""

from __future__ import annotations

import os
import re

import monarch_telemetry
from monarch_telemetry.schema import all_specs, reference_markdown
from tests.helpers import ROOT


def test_readme_reference_is_the_schema():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    m = re.search(r"<!-- telemetry-reference:[^>]*-->\n(.*)<!-- /telemetry-reference -->", text, re.S)
    assert m, "README lost its telemetry reference"
    assert m.group(1) == reference_markdown(), "regenerate README's table reference from monarch_telemetry/schema.py"


def test_every_column_has_a_meaning():
    for spec in all_specs():
        assert spec.doc
        for c in spec.columns:
            assert c.doc, f"{spec.name}.{c.name} is undocumented"


def test_public_names():
    for name in monarch_telemetry.__all__:
        assert getattr(monarch_telemetry, name) is not None


def test_telemetry_imports_nothing_above_it():
    """agents -> telemetry, never back: monarch_telemetry/ imports no monarch, monarch_cli, agents or schedulers."""
    import ast

    folder = os.path.join(ROOT, "monarch_telemetry")
    for name in os.listdir(folder):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(folder, name)) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for mod in mods:
                top = mod.split(".")[0]
                assert top not in {"monarch", "monarch_cli", "monarch_agents", "monarch_schedulers"}, f"{name} imports {mod}"


def test_recording_needs_no_pyarrow():
    """A proc or client that only records never pays for importing pyarrow or DataFusion."""
    import subprocess
    import sys

    code = ("import sys, monarch_telemetry, monarch_telemetry.recorder as r, monarch_agents.actor_telemetry\n"
            "rec = r.Recorder('h'); rec.message(rec.new_id(), 1, 2, 3, 4, 5, 'e', None, True); rec.take()\n"
            "print('pyarrow' in sys.modules, 'datafusion' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False False", out.stderr
