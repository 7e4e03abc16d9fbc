"""Telemetry you can query with SQL across every host (installed as ``monarch_telemetry``).

Every host agent, proc agent and client records into bounded in-memory Arrow tables
(``table.py``, ``recorder.py``); ``monarch query`` plans the SQL once, pushes each scan to
every host agent and runs the rest over all their rows with DataFusion (``engine.py``).
The tables and their columns are documented in ``schema.py`` (``monarch query --tables``).

Importing this package is cheap: pyarrow and DataFusion load only with the modules that
need them (a proc that only records never imports them).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from monarch_telemetry.recorder import Recorder, hash_id
from monarch_telemetry.schema import TABLES, VIEWS, Column, TableSpec, ViewSpec, all_specs, reference_markdown

_LAZY = {
    "Table": "monarch_telemetry.table", "Store": "monarch_telemetry.table",
    "QueryError": "monarch_telemetry.engine", "QueryTimeout": "monarch_telemetry.engine",
    "DEFAULT_ROW_LIMIT": "monarch_telemetry.engine", "plan": "monarch_telemetry.engine",
    "finish": "monarch_telemetry.engine", "query_tables": "monarch_telemetry.engine",
    "HostTelemetry": "monarch_telemetry.host", "explain": "monarch_telemetry.why", "Why": "monarch_telemetry.why",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'monarch_telemetry' has no attribute {name!r}")
    return getattr(import_module(module), name)


__all__ = ["TABLES", "VIEWS", "Column", "TableSpec", "ViewSpec", "all_specs", "reference_markdown",
           "Recorder", "hash_id", *_LAZY]
