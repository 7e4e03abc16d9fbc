"""The SQL engine: a query over every host's rows (scans pushed to each host, the rest merged)
gives the same answer as the same query over one table holding everything."""

from __future__ import annotations

import random
import time

import pyarrow as pa
import pytest
from datafusion import SessionConfig, SessionContext

from monarch_telemetry.engine import QueryError, QueryTimeout, finish, plan, query_tables, run_scan, scan_table
from monarch_telemetry.schema import TABLES, VIEWS

HOSTS = 4
T0 = 1_700_000_000_000_000


def _host_tables(seed: int = 7) -> dict[str, list[pa.Table]]:
    rnd = random.Random(seed)
    out: dict[str, list[pa.Table]] = {n: [] for n in ("messages_ext", "actors_ext", "meshes_ext", "logs", "run_ranks")}
    endpoints = ["step", "incr", "load", None]
    mesh_rows = [dict(id=m, timestamp_us=T0, **{"class": "Python<W>"}, given_name=f"m{m}", full_name=f"m{m}-x",
                      shape_json="{}", parent_mesh_id=None, parent_view_json=None, host="h0") for m in range(3)]
    for h in range(HOSTS):
        host = f"h{h}"
        actors = [dict(id=h * 100 + a, timestamp_us=T0 + a, mesh_id=a % 3, rank=a, full_name=f"m[{a}]",
                       display_name=None if a == 2 else f"w[{a}]", host=host, pid=1000 + a) for a in range(6)]
        msgs = [dict(id=h * 10_000 + i, timestamp_us=T0 + rnd.randrange(10**6), from_actor_id=7,
                     to_actor_id=h * 100 + rnd.randrange(6), endpoint=rnd.choice(endpoints),
                     port_index=rnd.choice([None, 1, 2]), host=host, status=rnd.choice(["complete", "failed"]),
                     latency_us=rnd.randrange(1, 5000), queue_us=rnd.randrange(0, 50)) for i in range(500 + 100 * h)]
        logs = [dict(time=T0 + i, host=host, run_id="r1", rank=h, proc=None, stream=rnd.choice(["stdout", "stderr"]),
                     line=f"{host} line {i}") for i in range(50)]
        ranks = [dict(run_id=f"r{r}", rank=h, host=host, argv="python train.py", cwd="/w", pid=10 + h,
                      started=T0 + r * 10**6, ended=None if (r == 2 and h == 1) else T0 + r * 10**6 + h * 1000,
                      exit_code=None if (r == 2 and h == 1) else (1 if (r == 1 and h == 2) else 0),
                      signal=None, reason="exited") for r in range(3)]
        for name, rows in (("messages_ext", msgs), ("actors_ext", actors), ("logs", logs), ("run_ranks", ranks),
                           ("meshes_ext", mesh_rows if h == 0 else [])):
            out[name].append(pa.Table.from_pylist(rows, schema=TABLES[name].schema))
    return out


def _one_table(sql: str, tables: dict[str, list[pa.Table]]) -> pa.Table:
    ctx = SessionContext(SessionConfig().with_information_schema(True))
    for spec in TABLES.values():
        parts = tables.get(spec.name)
        whole = pa.concat_tables(parts) if parts else pa.Table.from_pylist([], schema=spec.schema)
        ctx.register_record_batches(spec.name, [whole.to_batches() or [pa.RecordBatch.from_pylist([], schema=spec.schema)]])
    for v in VIEWS.values():
        ctx.register_view(v.name, ctx.sql(v.sql))
    return ctx.sql(sql).to_arrow_table()


def _rows(t: pa.Table, ordered: bool) -> list:
    rows = [tuple(r.values()) for r in t.to_pylist()]
    return rows if ordered else sorted(rows, key=repr)


QUERIES = [
    ("SELECT host, count(*) AS n FROM messages_ext WHERE status = 'failed' GROUP BY host", False),
    ("SELECT endpoint, count(*), sum(latency_us), min(latency_us), max(latency_us), avg(latency_us) "
     "FROM messages_ext GROUP BY endpoint", False),
    ("SELECT count(*) FROM messages_ext", False),
    ("SELECT * FROM messages_ext WHERE latency_us > 4900 AND endpoint IN ('step', 'incr')", False),
    ("SELECT m.endpoint, a.display_name, count(*) AS n FROM messages_ext m JOIN actors_ext a ON m.to_actor_id = a.id "
     "WHERE a.display_name IS NOT NULL GROUP BY m.endpoint, a.display_name", False),
    ("SELECT a.id, b.id FROM messages_ext a JOIN messages_ext b ON a.to_actor_id = b.to_actor_id AND a.id + 1 = b.id "
     "WHERE a.latency_us > 2500 AND b.status = 'failed'", False),
    ("SELECT host, line FROM logs WHERE rank = 2 ORDER BY time DESC, host LIMIT 7", True),
    ("SELECT id, latency_us FROM messages_ext ORDER BY latency_us DESC, id LIMIT 5", True),
    ("SELECT host, count(DISTINCT to_actor_id) FROM messages_ext GROUP BY host ORDER BY host", True),
    ("SELECT * FROM runs ORDER BY run_id", True),
    ("SELECT run_id, rank, host, exit_code FROM rank_exits WHERE exit_code <> 0", False),
    ("SELECT me.given_name, count(*) FROM actors_ext a JOIN meshes_ext me ON a.mesh_id = me.id GROUP BY me.given_name", False),
    ("SELECT host FROM messages_ext WHERE to_actor_id IN (SELECT id FROM actors_ext WHERE rank = 3) GROUP BY host", False),
    ("SELECT endpoint, latency_us FROM messages_ext WHERE latency_us > (SELECT avg(latency_us) FROM messages_ext) "
     "ORDER BY latency_us DESC, endpoint LIMIT 20", True),
    ("SELECT host, rank() OVER (ORDER BY count(*) DESC) FROM messages_ext GROUP BY host", False),
    ("SELECT line, host FROM logs ORDER BY time DESC, host LIMIT 6", True),
    ("SELECT count(*) FROM (SELECT * FROM messages_ext WHERE latency_us > 100 LIMIT 5)", False),
    ("SELECT upper(line) AS u FROM logs WHERE stream = 'stderr' ORDER BY u DESC LIMIT 4", True),
] + [(sql, ordered) for sql, ordered in [  # grouped aggregates: partial on each host, merged here
    ("SELECT endpoint, port_index, count(*), count(port_index), sum(port_index), min(port_index), max(port_index), "
     "avg(port_index) FROM messages_ext GROUP BY endpoint, port_index", False),
    ("SELECT endpoint, min(status), max(host), count(endpoint) FROM messages_ext GROUP BY endpoint", False),
    ("SELECT count(*), sum(latency_us), min(latency_us), max(latency_us), avg(latency_us), count(port_index) "
     "FROM messages_ext WHERE latency_us < 0", False),
    ("SELECT host, count(*) AS n, avg(queue_us) AS q FROM messages_ext WHERE status = 'failed' GROUP BY host "
     "HAVING count(*) > 100 ORDER BY n DESC LIMIT 2", True),
    ("SELECT endpoint, sum(latency_us) * 2 AS s2, max(latency_us) - min(latency_us) AS spread FROM messages_ext "
     "GROUP BY endpoint ORDER BY endpoint NULLS FIRST", True),
    ("SELECT host AS h, count(*) FROM logs GROUP BY host ORDER BY h", True),
    ("SELECT run_id, count(*) AS ranks, min(exit_code), max(exit_code), sum(exit_code) FROM run_ranks "
     "GROUP BY run_id ORDER BY run_id LIMIT 2 OFFSET 1", True),
]]

#: Queries whose aggregate is split between the hosts and the asker (the rest ship rows).
PARTIAL = [sql for sql, _ in QUERIES if "GROUP BY" in sql and "JOIN" not in sql and "DISTINCT" not in sql
           and "OVER" not in sql and "SELECT id" not in sql and "(SELECT" not in sql] + [
    "SELECT count(*) FROM messages_ext", "SELECT count(*) FROM messages_ext WHERE latency_us < 0"]


@pytest.mark.parametrize("sql,ordered", QUERIES)
def test_merged_answer_equals_one_table(sql, ordered):
    tables = _host_tables()
    merged, limited = query_tables(sql, tables, row_limit=None)
    assert not limited
    expected = _one_table(sql, tables)
    assert merged.column_names == expected.column_names
    assert _rows(merged, ordered) == _rows(expected, ordered)


@pytest.mark.parametrize("sql", PARTIAL)
def test_grouped_aggregates_are_partial_on_the_hosts(sql):
    p = plan(sql, row_limit=None)
    assert p.partial is not None, sql
    [(table, host_sql)] = p.scans.items()
    rows = pa.concat_tables(_host_tables()[table])
    scanned = scan_table(table, rows, host_sql)
    # A host sends one row per group, not one per matching row.
    keys = [tuple(r.values()) for r in scanned.select([c for c in scanned.column_names if c.startswith("__g")]).to_pylist()]
    assert scanned.num_rows == len(set(keys)) < rows.num_rows


@pytest.mark.parametrize("sql", [
    "SELECT host, count(DISTINCT to_actor_id) FROM messages_ext GROUP BY host",
    "SELECT upper(host), count(*) FROM messages_ext GROUP BY upper(host)",
    "SELECT host, median(latency_us) FROM messages_ext GROUP BY host",
    "SELECT host, count(*) FILTER (WHERE latency_us > 10) FROM messages_ext GROUP BY host",
    "SELECT status, count(*) FROM runs GROUP BY status",
])
def test_what_does_not_merge_exactly_ships_rows(sql):
    assert plan(sql, row_limit=None).partial is None
    tables = _host_tables()
    merged, _ = query_tables(sql, tables, row_limit=None)
    assert _rows(merged, False) == _rows(_one_table(sql, tables), False)


def test_grouped_aggregate_over_hosts_some_of_them_empty_and_keys_null():
    tables = _host_tables()
    empty = pa.Table.from_pylist([], schema=TABLES["messages_ext"].schema)
    nulls = pa.Table.from_pylist([dict(id=1, timestamp_us=T0, from_actor_id=1, to_actor_id=2, endpoint=None,
                                       port_index=None, host="h9", status="complete", latency_us=7, queue_us=1)],
                                 schema=TABLES["messages_ext"].schema)
    tables["messages_ext"] = [empty, *tables["messages_ext"], nulls, empty]
    for sql in ("SELECT endpoint, port_index, count(*), sum(latency_us), avg(latency_us), min(port_index) "
                "FROM messages_ext GROUP BY endpoint, port_index",
                "SELECT count(*), max(endpoint) FROM messages_ext"):
        merged, _ = query_tables(sql, tables, row_limit=None)
        assert _rows(merged, False) == _rows(_one_table(sql, tables), False)
    merged, _ = query_tables("SELECT count(*), sum(latency_us) FROM messages_ext", {"messages_ext": [empty, empty]},
                             row_limit=None)
    assert merged.to_pylist() == [{"count(*)": 0, "sum(messages_ext.latency_us)": None}]


def test_filters_and_projections_are_pushed_to_the_hosts():
    p = plan("SELECT endpoint, median(latency_us) FROM messages_ext WHERE host = 'h1' AND latency_us > 5 GROUP BY endpoint")
    sql = p.scans["messages_ext"]
    assert "WHERE" in sql and "'h1'" in sql and "latency_us > 5" in sql
    assert "queue_us" not in sql and "from_actor_id" not in sql  # only the columns read
    scanned = scan_table("messages_ext", pa.concat_tables(_host_tables()["messages_ext"]), sql)
    assert set(scanned.column("host").to_pylist()) <= {"h1"}


def test_a_limit_right_above_the_scan_goes_to_the_hosts():
    p = plan("SELECT * FROM logs WHERE stream = 'stderr' LIMIT 3", row_limit=None)
    assert p.scans["logs"].rstrip().endswith("LIMIT 3 OFFSET 0") or "LIMIT 3" in p.scans["logs"]


def test_catalog_queries_need_no_host():
    for sql in ("SHOW TABLES", "DESCRIBE logs", "SELECT column_name FROM information_schema.columns WHERE table_name = 'messages'"):
        assert not plan(sql).needs_hosts
    got = finish(plan("SELECT column_name FROM information_schema.columns WHERE table_name = 'messages' "
                      "ORDER BY ordinal_position"), {})[0]
    # Monarch's columns first, in Monarch's order.
    assert got.column("column_name").to_pylist()[:6] == ["id", "timestamp_us", "from_actor_id", "to_actor_id",
                                                         "endpoint", "port_index"]
    names = finish(plan("SHOW TABLES"), {})[0].column("table_name").to_pylist()
    assert {"messages", "logs", "runs", "rank_exits", "stacks", "procs", "hosts"} <= set(names)


@pytest.mark.parametrize("sql,needle", [
    ("SELEC * FROM logs", "ParserError"),
    ("SELECT nope FROM logs", "nope"),
    ("SELECT * FROM no_such_table", "no_such_table"),
    ("SELECT count(* FROM logs", "Expected"),
])
def test_bad_sql_is_one_readable_line(sql, needle):
    with pytest.raises(QueryError) as e:
        plan(sql)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg


@pytest.mark.parametrize("sql", [
    "INSERT INTO logs VALUES (1, 'h', NULL, NULL, NULL, 'stdout', 'x')",
    "CREATE TABLE x AS SELECT 1",
    "DROP TABLE logs",
    "COPY logs TO '/tmp/monarch-telemetry-copy.csv'",
    "SET datafusion.execution.batch_size = 1",
])
def test_nothing_can_write(sql):
    with pytest.raises(QueryError):
        plan(sql)
    with pytest.raises(QueryError):
        run_scan(lambda _: [], "logs", sql)


def test_huge_results_are_limited_by_default():
    big = pa.table({"time": pa.array(range(50_000), pa.int64()).cast(pa.timestamp("us", tz="UTC"))})
    rows = [big]
    tables = {"logs": [pa.Table.from_pydict({
        "time": big.column("time"), "host": ["h"] * 50_000, "run_id": [None] * 50_000, "rank": [None] * 50_000,
        "proc": [None] * 50_000, "stream": ["stdout"] * 50_000, "line": ["x"] * 50_000}, schema=TABLES["logs"].schema)]}
    got, limited = query_tables("SELECT * FROM logs", tables, row_limit=1000)
    assert limited and got.num_rows == 1000
    # The limit reached the scan: the host sent at most limit + 1 rows.
    assert "LIMIT 1001" in plan("SELECT * FROM logs", row_limit=1000).scans["logs"]
    got, limited = query_tables("SELECT * FROM logs", tables, row_limit=None)
    assert not limited and got.num_rows == 50_000
    del rows


def test_a_slow_scan_is_cancelled_at_its_deadline():
    n = 2_000_000
    data = pa.table({"id": pa.array(range(n), pa.int64())})
    batches = data.to_batches(max_chunksize=8192)
    logs = TABLES["messages_ext"]
    cols = {c.name: (data.column("id") if c.arrow_type == pa.int64() else pa.nulls(n, c.arrow_type)) for c in logs.columns}
    table = pa.Table.from_pydict(cols, schema=pa.schema([pa.field(c.name, c.arrow_type) for c in logs.columns]))
    # Every row comes back (hundreds of batches), and 1 ms is less than planning alone takes: the
    # deadline is passed at the first batch on any machine, so the stream is cut there (an error),
    # not drained to its end (an answer).  No wall-clock bound: speed is for benchmarks/.
    with pytest.raises(QueryTimeout):
        run_scan(lambda _: table.to_batches(max_chunksize=8192), "messages_ext",
                 "SELECT id, CAST(id AS VARCHAR) AS s FROM messages_ext",
                 deadline=time.monotonic() + 0.001)
    del batches


def test_order_by_limit_sends_each_host_its_top_rows():
    p = plan("SELECT * FROM logs WHERE rank = 7 ORDER BY time DESC LIMIT 50")
    sql = p.scans["logs"]
    assert "ORDER BY" in sql and "LIMIT 50" in sql and "= 7" in sql
    p = plan("SELECT line FROM logs ORDER BY time DESC LIMIT 5")
    assert "ORDER BY" in p.scans["logs"] and "LIMIT 5" in p.scans["logs"]
    # Computed columns stay with the asker: the host sends plain columns.
    p = plan("SELECT upper(line) AS u FROM logs ORDER BY u LIMIT 5")
    assert "upper" not in p.scans["logs"].lower()


@pytest.mark.parametrize("sql,ordered", QUERIES)
def test_hosts_that_send_their_few_rows_raw_give_the_same_answer(sql, ordered):
    """A host with a small table sends it as it is (monarch_telemetry.raw); the asker scans those
    hosts' rows together and merges them with the answers of hosts that scanned their own."""
    from monarch_telemetry.raw import mark_raw

    tables = _host_tables()
    p = plan(sql, row_limit=None)
    parts = {}
    for name, host_sql in p.scans.items():
        parts[name] = [t.replace_schema_metadata(mark_raw(t.schema).metadata) if h % 2 == 0
                       else scan_table(name, t, host_sql) for h, t in enumerate(tables.get(name, []))]
    merged, _ = finish(p, parts)
    expected = _one_table(sql, tables)
    assert merged.column_names == expected.column_names
    assert _rows(merged, ordered) == _rows(expected, ordered)


def test_a_query_asked_again_is_not_planned_again():
    sql = "SELECT host, count(*) AS n, max(exit_code) AS hi FROM run_ranks GROUP BY host"
    first = plan(sql, 1000)
    assert plan(sql, 1000) is first
    assert plan(sql, 5) is not first and plan(sql, 5).row_limit == 5  # the limit is part of the plan
    with pytest.raises(QueryError):  # an error is said again each time, not kept
        plan("SELECT nope FROM run_ranks", 1000)
    with pytest.raises(QueryError):
        plan("SELECT nope FROM run_ranks", 1000)


def test_a_query_of_the_time_is_planned_each_time():
    # DataFusion turns now() into the instant it plans: a kept plan would ask for the past.
    sql = "SELECT host, count(*) FROM logs WHERE time > now() - interval '5 minutes' GROUP BY host"
    first = plan(sql, 1000)
    time.sleep(0.01)
    again = plan(sql, 1000)
    assert again is not first and again.scans != first.scans


def test_pyspy_local_variables_has_monarchs_columns_and_is_held_by_the_hosts():
    """Monarch's fourth py-spy table: listed, typed as Monarch's, its rows (a stored dump's locals) on the hosts."""
    p = plan("SELECT * FROM pyspy_local_variables")
    assert set(p.scans) == {"pyspy_local_variables"}
    result, _ = finish(p, {})
    assert result.num_rows == 0
    assert [(f.name, str(f.type)) for f in result.schema] == [
        ("dump_id", "string"), ("thread_id", "int64"), ("frame_depth", "int64"), ("name", "string"),
        ("addr", "int64"), ("arg", "bool"), ("repr", "string")]
    listed = finish(plan("SELECT table_name FROM information_schema.tables WHERE table_name LIKE 'pyspy%'"), {})[0]
    assert "pyspy_local_variables" in listed.column("table_name").to_pylist()


def test_metric_sums_is_one_delta_point_per_counter_add():
    t = pa.table({"time": pa.array([1_000_000, 2_000_000, 3_000_000], pa.timestamp("us", "UTC")),
                  "host": ["h0", "h0", "h1"], "pid": [7, 7, 8], "actor": ["<root>"] * 3,
                  "name": ["c", "u", "h"], "kind": ["counter", "up_down_counter", "histogram"],
                  "value": [2.0, -1.5, 4.0], "attributes": ['{"k": 1}', None, None]})
    p = plan("SELECT name, timestamp_us, scope_name, temporality, is_monotonic, attributes_json, "
             "resource_attributes_json, sum_f64, sum_i64, sum_u64 FROM metric_sums ORDER BY name")
    rows = finish(p, {"metrics": [t]})[0].to_pylist()
    assert rows == [
        {"name": "c", "timestamp_us": 1_000_000, "scope_name": "monarch", "temporality": "delta", "is_monotonic": True,
         "attributes_json": '{"k": 1}', "resource_attributes_json":
         '{"service.name": "monarch", "host.name": "h0", "process.pid": 7}', "sum_f64": 2.0, "sum_i64": 2, "sum_u64": 2},
        {"name": "u", "timestamp_us": 2_000_000, "scope_name": "monarch", "temporality": "delta", "is_monotonic": False,
         "attributes_json": "{}", "resource_attributes_json":
         '{"service.name": "monarch", "host.name": "h0", "process.pid": 7}', "sum_f64": -1.5, "sum_i64": None,
         "sum_u64": None},
    ]
