"""Monarch's six event tables have exactly Monarch's columns; ours (host, pid, latencies) are the same rows
under ``<name>_ext``, stored once."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq

from monarch_telemetry import parquet
from monarch_telemetry.engine import finish, plan, query_tables
from monarch_telemetry.recorder import Recorder, hash_id
from monarch_telemetry.schema import TABLES
from monarch_telemetry.table import Store

#: The columns of PyTorch Monarch's row types (its ``monarch_telemetry_schema`` crate), in order.
MONARCH_COLUMNS = {
    "meshes": ["id", "timestamp_us", "class", "given_name", "full_name", "shape_json", "parent_mesh_id",
               "parent_view_json"],
    "actors": ["id", "timestamp_us", "mesh_id", "rank", "full_name", "display_name"],
    "actor_status_events": ["id", "timestamp_us", "actor_id", "new_status", "reason"],
    "sent_messages": ["id", "timestamp_us", "sender_actor_id", "actor_mesh_id", "view_json", "shape_json"],
    "messages": ["id", "timestamp_us", "from_actor_id", "to_actor_id", "endpoint", "port_index"],
    "message_status_events": ["id", "timestamp_us", "message_id", "status"],
}


def _recorded_store() -> Store:
    rec = Recorder("h7", enabled=True)
    mesh, actor = hash_id("w-1"), hash_id("w-1[0]")
    rec.mesh(mesh, "Python<W>", "w", "w-1", ("workers",), (1,), None)
    rec.actor(actor, mesh, 0, "w-1[0]", "w[0]")
    rec.actor_status(actor, "Idle")
    rec.message(rec.new_id(), 100, 110, 150, hash_id("<root>"), actor, "step", 3, ok=True)
    rec.sent(hash_id("<root>"), mesh, "{}", "{}", "step", "call", 1)
    store = Store()
    store.absorb(rec.take())
    return store


def test_monarchs_tables_answer_information_schema_with_monarchs_columns_only():
    for name, columns in MONARCH_COLUMNS.items():
        assert TABLES[name].column_names == columns
        got, _ = finish(plan("SELECT column_name FROM information_schema.columns "
                             f"WHERE table_name = '{name}' ORDER BY ordinal_position"), {})
        assert got.column("column_name").to_pylist() == columns
        ext = TABLES[f"{name}_ext"]
        assert ext.column_names[:len(columns)] == columns and "host" in ext.column_names


def test_only_ours_are_stored_and_monarchs_read_the_same_rows():
    store = _recorded_store()
    assert not set(MONARCH_COLUMNS) & set(store.tables)  # stored once, as ours
    for name, columns in MONARCH_COLUMNS.items():
        narrow = pa.Table.from_batches(store.batches(name))
        wide = pa.Table.from_batches(store.batches(f"{name}_ext"))
        assert narrow.num_rows == wide.num_rows >= 1, name
        assert narrow.column_names == columns
        assert narrow.to_pylist() == wide.select(columns).to_pylist()
    assert pa.Table.from_batches(store.batches("actors_ext")).column("pid").to_pylist() == [os.getpid()]


def test_select_star_of_a_monarch_table_has_no_column_of_ours():
    store = _recorded_store()
    hosts = {n: [pa.Table.from_batches(store.batches(n), schema=TABLES[n].schema)] for n in store.tables}
    got, _ = query_tables("SELECT * FROM actors a JOIN meshes m ON a.mesh_id = m.id", hosts, row_limit=None)
    assert "host" not in got.column_names and "pid" not in got.column_names
    assert got.num_rows == 1
    joined, _ = query_tables("SELECT a.display_name, x.host, x.pid FROM actors a JOIN actors_ext x ON a.id = x.id",
                             hosts, row_limit=None)
    assert joined.to_pylist() == [{"display_name": "w[0]", "host": "h7", "pid": os.getpid()}]


def test_a_save_holds_ours_once_and_loads_both(tmp_path):
    store = _recorded_store()
    written = parquet.save_host(store, str(tmp_path), "h7")
    folders = {os.path.basename(os.path.dirname(f)) for f in written}
    assert "actors_ext" in folders and not folders & set(MONARCH_COLUMNS)
    loaded = parquet.load(str(tmp_path))
    assert loaded["actors"][0].column_names == MONARCH_COLUMNS["actors"]
    assert loaded["actors_ext"][0].column("host").to_pylist() == ["h7"]


def test_a_save_made_before_the_split_loads_as_ours(tmp_path):
    # Saves made before had our columns under Monarch's names (``actors/<host>.parquet``).
    wide = pa.Table.from_batches(_recorded_store().batches("actors_ext"))
    os.makedirs(tmp_path / "actors")
    pq.write_table(wide, tmp_path / "actors" / "h7.parquet")
    loaded = parquet.load(str(tmp_path))
    assert loaded["actors_ext"][0].column("host").to_pylist() == ["h7"]
    assert loaded["actors"][0].column_names == MONARCH_COLUMNS["actors"]


def test_spans_shows_a_users_span_as_monarchs_python_user_span_row():
    import json

    rec = Recorder("h7", enabled=True)
    rec.span(1_700_000_000_000_000, "w[0]", 'load "shard"\n7', 250)
    rec.span(1_700_000_000_000_100, "<root>", "save", 10, error="OSError: disk full")
    store = Store()
    store.absorb(rec.take())
    hosts = {"user_spans": [pa.Table.from_batches(store.batches("user_spans"), schema=TABLES["user_spans"].schema)]}
    got, _ = query_tables("SELECT * FROM spans ORDER BY timestamp_us", hosts, row_limit=None)
    assert got.column_names == ["id", "name", "target", "level", "fields_json", "timestamp_us", "parent_id",
                                "thread_name", "file", "line"]  # Monarch's spans columns
    rows = got.to_pylist()
    assert [r["name"] for r in rows] == ["python_user_span"] * 2
    assert [r["level"] for r in rows] == ["INFO", "ERROR"]
    assert json.loads(rows[0]["fields_json"]) == {"name": 'load "shard"\n7', "actor": "w[0]", "duration_us": 250}
    assert json.loads(rows[1]["fields_json"])["error"] == "OSError: disk full"
    assert rows[0]["timestamp_us"] == 1_700_000_000_000_000 and len({r["id"] for r in rows}) == 2


def test_a_save_made_before_actor_addresses_keeps_its_names_as_ours(tmp_path):
    # Saves made before full_name was Monarch's address held our short name there, and no ref_name.
    ext = pa.Table.from_batches(_recorded_store().batches("actors_ext"))
    old = ext.drop_columns(["ref_name"]).set_column(4, "full_name", pa.array(["w-1[0]"]))
    os.makedirs(tmp_path / "actors_ext")
    pq.write_table(old, tmp_path / "actors_ext" / "h7.parquet")
    loaded = parquet.load(str(tmp_path))
    assert loaded["actors_ext"][0].column("ref_name").to_pylist() == ["w-1[0]"]
