"""Bounded Arrow tables: appends, sealing, the row and byte bounds, and moving rows between processes."""

from __future__ import annotations

import pickle
import threading

import pyarrow as pa
import pytest

from monarch_telemetry.recorder import Recorder, hash_id
from monarch_telemetry.schema import TABLES
from monarch_telemetry.table import Store, Table, from_ipc, to_ipc


def _log_row(i: int) -> tuple:
    return (1_700_000_000_000_000 + i, "h0", "run-1", i % 3, None, "stdout", f"line {i}")


def test_append_seals_batches_and_keeps_order():
    t = Table(TABLES["logs"], batch_rows=10)
    for i in range(25):
        t.append(*_log_row(i))
    batches = t.batches()
    assert [b.num_rows for b in batches] == [10, 10, 5]
    table = t.to_arrow()
    assert table.schema == TABLES["logs"].schema
    assert table.column("line").to_pylist() == [f"line {i}" for i in range(25)]
    assert table.column("proc").null_count == 25
    assert table.column("time")[0].as_py().year == 2023


def test_row_bound_drops_oldest_first():
    t = Table(TABLES["logs"], max_rows=100, batch_rows=10)
    for i in range(1000):
        t.append(*_log_row(i))
    table = t.to_arrow()
    assert table.num_rows <= 100
    assert table.column("line").to_pylist()[-1] == "line 999"
    assert t.dropped_rows == 1000 - table.num_rows


def test_byte_bound_holds():
    t = Table(TABLES["logs"], max_bytes=64 << 10, batch_rows=256)
    for i in range(20_000):
        t.append(1, "h0", None, None, "p/1", "stderr", "x" * 100 + str(i))
    t.batches()
    assert 0 < t.nbytes <= 64 << 10
    assert t.to_arrow().column("line").to_pylist()[-1].endswith("19999")


def test_one_batch_over_the_bound_is_trimmed_to_its_newest_rows():
    t = Table(TABLES["logs"], max_rows=50)
    b = pa.RecordBatch.from_pylist([dict(zip(TABLES["logs"].column_names, _log_row(i))) for i in range(200)],
                                   schema=TABLES["logs"].schema)
    t.append_batch(b)
    got = t.to_arrow().column("line").to_pylist()
    assert got == [f"line {i}" for i in range(150, 200)]


def test_concurrent_appends_keep_columns_aligned():
    t = Table(TABLES["logs"], batch_rows=64)

    def writer(k: int) -> None:
        for i in range(2000):
            t.append(i, f"h{k}", None, k, None, "stdout", f"{k}:{i}")

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    rows = t.to_arrow().to_pylist()
    assert len(rows) == 8000
    assert all(r["line"].startswith(f"{r['rank']}:") and r["host"] == f"h{r['rank']}" for r in rows)


def test_recorder_rows_cross_a_process_boundary_and_become_both_message_tables():
    rec = Recorder("hostA")
    to = hash_id("counters-1[0]")
    for i in range(5):
        mid = rec.new_id()
        rec.message(mid, 100 + i, 110 + i, 150 + i, hash_id("<root>"), to, "incr", 7, ok=(i != 3))
    rec.actor(to, hash_id("counters-1"), 0, "counters-1[0]", "counters[0]")
    rec.actor_status(to, "Idle")
    taken = pickle.loads(pickle.dumps(rec.take()))  # what a proc sends its host agent
    assert rec.take() == {}
    store = Store()
    store.absorb(taken)
    msgs = pa.Table.from_batches(store.batches("messages_ext")).to_pylist()
    assert [m["status"] for m in msgs] == ["complete", "complete", "complete", "failed", "complete"]
    assert msgs[0]["latency_us"] == 50 and msgs[0]["queue_us"] == 10 and msgs[0]["timestamp_us"] == 110
    events = pa.Table.from_batches(store.batches("message_status_events_ext")).to_pylist()
    assert len(events) == 15 and len({e["id"] for e in events}) == 15
    by_msg = {}
    for e in events:
        by_msg.setdefault(e["message_id"], []).append(e["status"])
    assert sorted(by_msg[msgs[3]["id"]]) == ["active", "failed", "queued"]
    assert store.batches("actors")[0].column("display_name").to_pylist() == ["counters[0]"]


def test_recording_off_records_nothing():
    rec = Recorder("h", enabled=False)
    rec.actor_status(1, "Idle")
    rec.log_line("stdout", "x")
    assert rec.take() == {}


def test_ipc_round_trip():
    t = Table(TABLES["logs"])
    t.append(*_log_row(1))
    data = to_ipc(t.batches(), t.schema)
    assert from_ipc(data).equals(t.to_arrow())


def test_snapshot_tables_are_built_when_read():
    store = Store()
    calls = []
    store.provide("hosts", lambda: calls.append(1) or [{"host": "h0", "host_rank": 0}])
    b = store.batches("hosts")
    assert calls == [1] and b[0].column("host").to_pylist() == ["h0"]
    assert b[0].column("cpu_count").to_pylist() == [None] or b[0].schema == TABLES["hosts"].schema


def test_unknown_tables_in_a_push_are_ignored():
    store = Store()
    store.absorb({"no_such_table": (1, [[1]])})
    assert store.num_rows == 0


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_table_has_a_schema(name):
    assert len(TABLES[name].schema) == len(TABLES[name].columns)
