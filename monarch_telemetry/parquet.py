"""Telemetry saved as Parquet, for a post-mortem after the reservation is gone.

``monarch stop --save DIR`` fetches every host's rows and writes ``DIR/<table>/<host>.parquet``
(one file per table and host);
``monarch query --from DIR`` reads them back, one host per partition, through the same
engine as a live query.

What it does not do: append to an earlier save (a table's file for a host is replaced).
"""

from __future__ import annotations

import os
import re

import pyarrow as pa
import pyarrow.parquet as pq

from monarch_telemetry.schema import TABLES

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
#: Our tables that older saves hold under Monarch's names (before those became Monarch's columns).
_FORMERLY = {**{f"{n}_ext": n for n in ("meshes", "actors", "actor_status_events", "messages",
                                         "message_status_events", "sent_messages")}, "user_spans": "spans"}


def save_host(store, directory: str, host: str) -> list[str]:
    """Write every table ``store`` holds rows of; returns the files written."""
    tables = {}
    for name in TABLES:
        if TABLES[name].source:
            continue  # its rows are its source's, saved once
        batches = store.batches(name)
        if batches:
            tables[name] = pa.Table.from_batches(batches, schema=TABLES[name].schema)
    return write_host(directory, host, tables)


def write_host(directory: str, host: str, tables: dict[str, pa.Table]) -> list[str]:
    """Write one host's tables (empty ones skipped) as ``directory/<table>/<host>.parquet``."""
    written = []
    for name, table in tables.items():
        if name not in TABLES or TABLES[name].source or table.num_rows == 0:
            continue
        folder = os.path.join(directory, name)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{_SAFE.sub('_', host) or 'host'}.parquet")
        tmp = f"{path}.tmp.{os.getpid()}"
        pq.write_table(table, tmp)
        os.replace(tmp, path)  # a reader never sees half a file
        written.append(path)
    return written


def load(directory: str) -> dict[str, list[pa.Table]]:
    """Every saved table: {table: one Arrow table per host}.  Raises FileNotFoundError for no save."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"no saved telemetry at {directory}")
    out: dict[str, list[pa.Table]] = {}
    found = False
    for name, spec in TABLES.items():
        if spec.source:
            continue
        folder = os.path.join(directory, name)
        if not os.path.isdir(folder) and name in _FORMERLY:
            # Saved before Monarch's tables were split from ours: ours were stored under Monarch's name.
            folder = os.path.join(directory, _FORMERLY[name])
        if not os.path.isdir(folder):
            continue
        for f in sorted(os.listdir(folder)):
            if f.endswith(".parquet"):
                found = True
                t = pq.read_table(os.path.join(folder, f))
                if name == "actors_ext" and "ref_name" not in t.column_names and "full_name" in t.column_names:
                    # Saved before full_name was Monarch's actor address: its full_name is our short name.
                    t = t.append_column("ref_name", t.column("full_name"))
                out.setdefault(name, []).append(_conform(t, spec.schema))
    if not found:
        raise FileNotFoundError(f"{directory} holds no saved telemetry (no <table>/<host>.parquet files)")
    for name, spec in TABLES.items():
        if spec.source in out:
            out[name] = [t.select(spec.column_names) for t in out[spec.source]]
    return out


def _conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
    cols = [t.column(f.name).cast(f.type) if f.name in t.column_names else pa.nulls(t.num_rows, f.type) for f in schema]
    return pa.Table.from_arrays(cols, schema=pa.schema([f.with_nullable(True) for f in schema]))
