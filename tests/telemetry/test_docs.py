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
    assert m.group(1) == reference_markdown(), "regenerate README's table reference from telemetry/schema.py"


def test_every_column_has_a_meaning():
    for spec in all_specs():
        assert spec.doc
        for c in spec.columns:
            assert c.doc, f"{spec.name}.{c.name} is undocumented"


def test_public_names():
    for name in monarch_telemetry.__all__:
        assert getattr(monarch_telemetry, name) is not None
