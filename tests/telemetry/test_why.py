"""`monarch why` from the tables: the earliest failure is the root, later ones are its consequences."""

from __future__ import annotations

import pyarrow as pa

from monarch_telemetry.engine import query_tables
from monarch_telemetry.recorder import hash_id
from monarch_telemetry.schema import TABLES
from monarch_telemetry.why import explain

T0 = 1_700_000_000_000_000


def _t(name, rows):
    return pa.Table.from_pylist(rows, schema=TABLES[name].schema)


def _ranks(run_id, start, exits):
    rows = []
    for rank, (host, code, at) in enumerate(exits):
        rows.append(dict(run_id=run_id, rank=rank, host=host, argv="python train.py", cwd=None, pid=100 + rank,
                         started=start, ended=None if at is None else start + at, exit_code=code,
                         signal=-code if code is not None and code < 0 else None,
                         reason=None if code is None else ("killed by SIGTERM" if code < 0 else f"exited with code {code}")))
    return rows


def _ask(tables):
    return lambda sql: query_tables(sql, tables, row_limit=None)[0]


def test_root_is_the_first_rank_to_fail_with_its_exception_and_consequences():
    old = _ranks("r-old", T0, [("h0", 3, 10), ("h1", 0, 20)])
    new = _ranks("r-new", T0 + 10**9, [("h0", -15, 900), ("h1", 1, 500), ("h2", -15, 950)])
    logs = [dict(time=T0 + 10**9 + 100 + i, host="h1", run_id="r-new", rank=1, proc=None, stream=s, line=line)
            for i, (s, line) in enumerate([("stdout", "loading"), ("stderr", "Traceback (most recent call last):"),
                                           ("stderr", '  File "train.py", line 3'),
                                           ("stderr", "torch.OutOfMemoryError: CUDA out of memory")])]
    tables = {"run_ranks": [_t("run_ranks", old + new[:1]), _t("run_ranks", new[1:])], "logs": [_t("logs", logs)]}
    w = explain(_ask(tables))
    assert (w.run_id, w.status) == ("r-new", "failed")
    assert (w.root.kind, w.root.rank, w.root.host, w.root.exit_code) == ("rank", 1, "h1", 1)
    assert w.root.exception == "torch.OutOfMemoryError: CUDA out of memory"
    assert w.root.log_tail[0] == "loading"
    assert [(c.rank, c.signal) for c in w.consequences] == [(0, 15), (2, 15)]
    assert w.to_dict()["root"]["time"].startswith("2023-")


def test_an_actor_that_failed_first_is_the_root():
    start = T0 + 10**9
    ranks = _ranks("r1", start, [("h0", 1, 800)])
    aid = hash_id("workers-1[0]")
    actors = [dict(id=aid, timestamp_us=start, mesh_id=hash_id("workers-1"), rank=0, full_name="workers-1[0]",
                   display_name="workers[0]", host="h3", pid=9)]
    events = [dict(id=1, timestamp_us=start + 100, actor_id=aid, new_status="Failed",
                   reason="Traceback ...\nValueError: bad shard 7", host="h3"),
              dict(id=2, timestamp_us=T0, actor_id=aid, new_status="Failed", reason="before the run", host="h3")]
    tables = {"run_ranks": [_t("run_ranks", ranks)], "actors_ext": [_t("actors_ext", actors)],
              "actor_status_events_ext": [_t("actor_status_events_ext", events)]}
    w = explain(_ask(tables))
    assert (w.root.kind, w.root.actor, w.root.host) == ("actor", "workers[0]", "h3")
    assert w.root.exception == "ValueError: bad shard 7"
    assert [c.kind for c in w.consequences] == ["rank"]  # the earlier failure before the run is not counted


def test_nothing_failed():
    ok = _ranks("r1", T0, [("h0", 0, 5)])
    w = explain(_ask({"run_ranks": [_t("run_ranks", ok)]}))
    assert (w.run_id, w.status, w.root) == ("r1", "succeeded", None)
    w = explain(_ask({}))
    assert (w.run_id, w.root, w.status) == (None, None, "no runs")
