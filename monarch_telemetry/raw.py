"""A host's rows sent as they are, for the asker to scan: the small-table path of ``monarch query``.

A host holding at most :data:`RAW_MAX_ROWS` rows of a table answers a scan with the table itself,
marked raw in its schema's metadata, instead of running the pushed-down SQL (``engine.run_scan``).
The asker (``engine.finish``) runs that SQL once over every raw host's rows together and takes the
result as one more host's answer: the same rows, and the hosts need no SQL engine for small tables.
Kept apart from ``engine`` so that a host agent imports only pyarrow for it.
"""

from __future__ import annotations

import pyarrow as pa

#: A table of at most this many rows on a host is sent raw (a few hundred KiB at most).
RAW_MAX_ROWS = 2000

_KEY = b"monarch.raw"


def mark_raw(schema: pa.Schema) -> pa.Schema:
    return schema.with_metadata({**(schema.metadata or {}), _KEY: b"1"})


def is_raw(table: pa.Table) -> bool:
    return bool(table.schema.metadata and table.schema.metadata.get(_KEY) == b"1")


def unmark(table: pa.Table) -> pa.Table:
    meta = {k: v for k, v in (table.schema.metadata or {}).items() if k != _KEY}
    return table.replace_schema_metadata(meta or None)
