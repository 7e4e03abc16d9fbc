"""SQL over telemetry with DataFusion: the scan where the data is, the rest over everything.

A query is planned once, by the asker (:func:`plan`), against empty tables of the real
schemas: that is where a parse error, an unknown table or column is found, before any
host is asked.  DataFusion's optimised plan says, for each table, which columns are read
and which filter (and limit) applies right above the scan.  Each host agent runs only
that scan over its own rows (:func:`run_scan`: projection, filter and limit pushed down,
read-only, cancelled at its deadline).  The asker then registers every host's rows as one
partition of the table and runs the whole query over them (:func:`finish`), so joins,
aggregates, ORDER BY and LIMIT see every host's rows exactly as one table holding
everything would.

A grouped aggregate of one table (count, sum, min, max, avg; GROUP BY plain columns; a
filter, HAVING, ORDER BY and LIMIT around it) is split the way DataFusion splits it between
its own partitions: each host runs the partial aggregate (one row per group: counts, sums,
minima, maxima) and the asker merges those rows (:class:`PartialAggregate`), so a host sends
a row per group, not a row per message.

What it does not do: talk to hosts (the caller fans out; see ``monarch/_workbench/telemetry.py``).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import datafusion
import pyarrow as pa
from datafusion import RuntimeEnvBuilder, SessionConfig, SessionContext, SQLOptions
from datafusion.unparser import Dialect, Unparser

from monarch_telemetry.schema import TABLES, VIEWS

log = logging.getLogger("monarch.telemetry")

#: Rows a query returns unless asked for more (``--limit N``, ``--no-limit``).
DEFAULT_ROW_LIMIT = 1000


class QueryError(Exception):
    """SQL that does not parse or plan (unknown table or column), or a query that is refused."""


class QueryTimeout(QueryError):
    """The query ran past its deadline and was cancelled."""


def _read_only() -> SQLOptions:
    return SQLOptions().with_allow_ddl(False).with_allow_dml(False).with_allow_statements(False)


def one_line(e: BaseException) -> str:
    """DataFusion's message, on one line (it spreads some over several)."""
    text = str(e).strip()
    text = re.sub(r"^(DataFusion error: )+", "", text)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    # "caused by" chains: the last cause is the one a user can act on.
    if len(lines) > 1 and lines[0].lower().startswith(("optimizer rule", "type_coercion")):
        lines = lines[1:]
    return " ".join(ln for ln in lines if ln.lower() != "caused by")[:1000]


#: What one query may hold in memory in one process (a host agent, or the client finishing it):
#: DataFusion's sorts, joins and aggregates draw from a pool of this size and fail when it is spent
#: (nothing spills to disk), and the result a scan sends back may not be bigger.  A user's SQL
#: runs on every host agent: one ``ORDER BY`` over ``repeat()`` took an agent from 128 MB to 3 GB.
MEMORY_LIMIT_BYTES = int(os.environ.get("MONARCH_TELEMETRY_MEMORY_BYTES", 512 << 20))


def _context() -> SessionContext:
    cfg = SessionConfig().with_information_schema(True).with_target_partitions(4)
    runtime = RuntimeEnvBuilder().with_disk_manager_disabled().with_fair_spill_pool(MEMORY_LIMIT_BYTES)
    return SessionContext(cfg, runtime)


def _over_memory(what: str) -> QueryError:
    return QueryError(f"the query needs more than the {MEMORY_LIMIT_BYTES >> 20} MiB a telemetry query may use "
                      f"in one process ({what}); narrow it with WHERE / LIMIT, or raise MONARCH_TELEMETRY_MEMORY_BYTES")


def _register_views(ctx: SessionContext) -> None:
    for v in VIEWS.values():
        try:
            ctx.register_view(v.name, ctx.sql(v.sql))
        except Exception as e:
            # Only the columns a query reads are fetched: a view over others is not in this query.
            log.debug("view %s not registered: %s", v.name, e)


def _empty(schema: pa.Schema) -> list[list[pa.RecordBatch]]:
    return [[pa.RecordBatch.from_pylist([], schema=schema)]]


# -- the asker's side -----------------------------------------------------------------------


@dataclass
class Plan:
    """A planned query: what each host must scan, and how to finish it."""

    sql: str
    row_limit: int | None
    scans: dict[str, str] = field(default_factory=dict)  # table -> the SQL each host runs
    #: Set when each host runs a partial aggregate (``scans`` holds it) and :func:`finish` merges.
    partial: "PartialAggregate | None" = None

    @property
    def needs_hosts(self) -> bool:
        return bool(self.scans)


#: Plans of the last queries asked, by (SQL, row limit): the agent that answers a reservation's
#: queries is asked the same ones again and again (a watch, a dashboard), and planning one is
#: ~5 ms of CPU (12 at load 25), a tenth of a query at 64 hosts.
_PLANS: dict[tuple[str, int | None], Plan] = {}
_PLANS_MAX = 64
_plans_lock = threading.Lock()
#: Functions DataFusion evaluates when it plans (``now()`` becomes a literal of that instant): a
#: query naming one is planned afresh each time.
_VOLATILE = re.compile(r"\b(now|today|current_date|current_time|current_timestamp|localtime|localtimestamp|"
                       r"random|uuid)\b", re.IGNORECASE)


def plan(sql: str, row_limit: int | None = DEFAULT_ROW_LIMIT) -> Plan:
    """Check ``sql`` and work out the scans to push to hosts; raises :class:`QueryError`.

    A query planned before (the same text and row limit) gets the same :class:`Plan` (read-only
    to its users), unless it names a function of the time or chance (:data:`_VOLATILE`)."""
    key = (sql, row_limit)
    with _plans_lock:
        found = _PLANS.pop(key, None)
        if found is not None:
            _PLANS[key] = found  # the most recently used last
            return found
    p = _plan(sql, row_limit)
    if not _VOLATILE.search(sql):
        with _plans_lock:
            _PLANS[key] = p
            while len(_PLANS) > _PLANS_MAX:
                del _PLANS[next(iter(_PLANS))]
    return p


def _plan(sql: str, row_limit: int | None) -> Plan:
    if not sql.strip():
        raise QueryError("empty query")
    ctx = _planning_context()
    try:
        df = ctx.sql_with_options(sql, _read_only())
        lp = df.optimized_logical_plan()
    except Exception as e:
        raise QueryError(one_line(e)) from None
    if _is_explain(lp):
        return Plan(sql, None)
    if row_limit is not None:
        try:
            lp = df.limit(row_limit + 1).optimized_logical_plan()
        except Exception as e:
            # A plan DataFusion cannot put a LIMIT on is planned without it; the rows are cut after the run.
            log.debug("no row limit pushed into the plan: %s", e)
    partial = PartialAggregate.split(lp, df)
    if partial is not None:
        return Plan(sql, row_limit, {partial.table: partial.host_sql}, partial)
    found: dict[str, list[_ScanInfo]] = {}
    _collect(lp, [], found)
    return Plan(sql, row_limit, {t: _combine(t, infos) for t, infos in found.items() if t in TABLES})


_planner: SessionContext | None = None
_planner_lock = threading.Lock()


def _planning_context() -> SessionContext:
    """Every table, empty, and the views: made once per process (planning only reads it)."""
    global _planner
    with _planner_lock:
        if _planner is None:
            ctx = _context()
            for spec in TABLES.values():
                ctx.register_record_batches(spec.name, _empty(spec.schema))
            _register_views(ctx)
            _planner = ctx
        return _planner


def _is_explain(lp) -> bool:
    return type(lp.to_variant()).__name__ in ("Explain", "Analyze")


@dataclass
class _ScanInfo:
    columns: list[str]
    predicate: str | None  # SQL text, None when nothing (or nothing safe) to push
    pushed_sql: str  # the whole scan (with LIMIT when there is one right above)


_unparser = Unparser(Dialect.default())


def _collect(node, parents: list, found: dict) -> None:
    v = node.to_variant()
    kind = type(v).__name__
    if kind == "TableScan":
        found.setdefault(v.table_name(), []).append(_scan_info(node, v, parents))
        return
    for child in node.inputs():
        _collect(child, [*parents, node], found)


def _scan_info(node, v, parents: list) -> _ScanInfo:
    columns = [name for _, name in v.projection()]
    scan_sql = _unparser.plan_to_sql(node)
    chain = list(reversed(parents))  # the scan's parent first
    top, predicate = node, None
    if chain and _kind(chain[0]) == "Filter":
        filter_sql = _unparser.plan_to_sql(chain[0])
        prefix = scan_sql + " WHERE "
        rest = filter_sql[len(prefix):] if filter_sql.startswith(prefix) else ""
        if rest and _pushable(rest):
            predicate, top, chain = rest, chain[0], chain[1:]
        else:
            chain = []  # a filter kept here: nothing above it may be pushed below it
    # The host must send every column the scan reads (the filter runs again here), so a projection
    # above is not pushed; a limit or an ORDER BY ... LIMIT above it is, on the same rows.
    if chain and _kind(chain[0]) == "Projection" and _plain_columns(_unparser.plan_to_sql(chain[0])):
        chain = chain[1:]
    pushed = _unparser.plan_to_sql(top)
    if re.search(r" LIMIT \d+$", pushed):
        pass  # DataFusion put the limit into the scan itself
    elif chain and _kind(chain[0]) == "Limit":
        lim = chain[0].to_variant()
        fetch = _as_int(lim.fetch())
        if _as_int(lim.skip()) in (0, None) and fetch is not None:
            pushed += f" LIMIT {fetch}"
    elif chain and _kind(chain[0]) == "Sort" and chain[0].to_variant().get_fetch_val():
        # ORDER BY ... LIMIT k: each host's top k holds the overall top k.
        sort_sql = _unparser.plan_to_sql(chain[0])
        at = sort_sql.rfind(" ORDER BY ")
        if at > 0:
            pushed += sort_sql[at:]
    return _ScanInfo(columns, predicate, pushed)


@dataclass
class PartialAggregate:
    """A grouped aggregate of one table, split in two: ``host_sql`` where the rows are, the merge here.

    Each host answers ``host_sql``: its rows grouped by the GROUP BY columns (renamed ``__g<i>``),
    with one partial column per aggregate (``__a<j>``; an average as its sum and count).  The asker
    merges them: counts and sums are summed, minima and maxima taken again, averages divided
    (``merge_sql``, over the hosts' rows as ``__partial``), which is the aggregate's own output, named
    as DataFusion named it; the plan nodes above the aggregate (HAVING, projection, ORDER BY,
    LIMIT) then run over it unchanged.  Only what merges exactly is split; anything else (DISTINCT,
    FILTER, expressions in the GROUP BY, other functions, joins, views) ships rows as before.
    """

    table: str
    relation: str
    host_sql: str
    merge_sql: str
    above: list  # the plan nodes above the aggregate, the aggregate's parent first
    host_schema: pa.Schema | None = None

    @classmethod
    def split(cls, lp, df: datafusion.DataFrame) -> "PartialAggregate | None":
        """The split of plan ``lp`` (of DataFrame ``df``), or None where it has no exact split."""
        try:
            found = cls._split(lp)
            if found is None:
                return None
            # Proved on the empty tables: the merged route must plan, and name its columns as the query does.
            ctx = _planning_context()
            found.host_schema = ctx.sql_with_options(found.host_sql, _read_only()).schema()
            got = found.finish([], None, None)
            if got.schema.names != df.schema().names:
                return None
            return found
        except Exception:
            return None

    @classmethod
    def _split(cls, lp) -> "PartialAggregate | None":
        above, node = [], lp
        while _kind(node) in ("Limit", "Sort", "Projection", "Filter"):
            above.append(node)
            node = node.inputs()[0]
        if _kind(node) != "Aggregate":
            return None
        agg = node
        below = agg.inputs()[0]
        while _kind(below) == "Projection" and all(
                type(_expr(e).to_variant()).__name__ == "Column" for e in below.to_variant().projections()):
            below = below.inputs()[0]  # only picks columns: the host's SQL reads them by name anyway
        filt = below if _kind(below) == "Filter" else None
        scan = below.inputs()[0] if filt is not None else below
        if _kind(scan) != "TableScan":
            return None
        table = scan.to_variant().table_name()
        if table not in TABLES:
            return None
        scan_sql = _unparser.plan_to_sql(scan)
        if " WHERE " in scan_sql or " LIMIT " in scan_sql:
            return None
        where = ""
        if filt is not None:
            filter_sql = _unparser.plan_to_sql(filt)
            prefix = scan_sql + " WHERE "
            predicate = filter_sql[len(prefix):] if filter_sql.startswith(prefix) else ""
            if not predicate or not _pushable(predicate):
                return None
            where = " WHERE " + predicate
        v = agg.to_variant()
        host, merge, group_by, relation = [], [], [], table
        for i, g in enumerate(v.group_by_exprs()):
            gv = g.to_variant()
            if type(gv).__name__ != "Column":
                return None
            relation = gv.relation() or table
            host.append(f"{_quote(gv.name())} AS __g{i}")
            merge.append(f"__g{i} AS {_quote(gv.name())}")
            group_by.append(f"__g{i}")
        group_cols = [h.rsplit(" AS ", 1)[0] for h in host]
        # One partial column per distinct expression: DataFusion refuses two aggregates of one name.
        partials: dict[str, str] = {}

        def part(expr: str) -> str:
            if expr not in partials:
                partials[expr] = f"__a{len(partials)}"
                host.append(f"{expr} AS {partials[expr]}")
            return partials[expr]

        for e in v.aggregate_exprs():
            ev = e.to_variant()
            text = str(e)
            if type(ev).__name__ != "AggregateFunction" or ev.is_distinct() or " FILTER " in text or "ORDER BY" in text:
                return None
            fn, args = ev.aggregate_type().lower(), ev.args()
            arg = _arg_sql(args[0]) if len(args) == 1 else None
            if arg is None or fn not in ("count", "sum", "min", "max", "avg"):
                return None
            out = _quote(e.schema_name())
            if fn == "avg":
                if arg.startswith("CAST("):
                    arg = arg[len("CAST("):-len(" AS DOUBLE)")]
                elif not _is_float_column(table, args[0]):
                    return None
                # x * 1.0: a double sum (exact for integers below 2**53), and a name of its own.
                total, n = part(f"sum({arg} * 1.0)"), part(f"count({arg})")
                merge.append(f"sum({total}) / CAST(nullif(sum({n}), 0) AS DOUBLE) AS {out}")
                continue
            if arg.startswith("CAST(") or (arg == "1" and fn != "count"):
                return None
            a = part(f"{fn}({arg})")
            merge.append(f"coalesce(sum({a}), 0) AS {out}" if fn == "count" else f"{fn}({a}) AS {out}")
        if not partials:
            return None
        groups = f" GROUP BY {', '.join(group_by)}" if group_by else ""
        host_groups = f" GROUP BY {', '.join(group_cols)}" if group_by else ""
        host_sql = f"SELECT {', '.join(host)} FROM {_quote(table)}{where}{host_groups}"
        merge_sql = f"SELECT {', '.join(merge)} FROM __partial{groups}"
        return cls(table, relation, host_sql, merge_sql, above)

    def finish(self, parts: list[pa.Table], row_limit: int | None, deadline: float | None) -> pa.Table:
        """Merge the hosts' partial rows and run what is above the aggregate over them."""
        schema = self.host_schema
        tables = [t for t in parts if t is not None]
        if tables:
            schema = tables[0].schema
        ctx = _context()
        ctx.register_record_batches("__partial", [t.cast(schema).to_batches() or _empty(schema)[0] for t in tables]
                                    or _empty(schema))

        def make() -> datafusion.DataFrame:
            merged = ctx.sql_with_options(self.merge_sql, _read_only()).to_arrow_table()
            out = SessionContext(SessionConfig().with_target_partitions(1))
            out.register_record_batches(self.relation, [merged.to_batches() or _empty(merged.schema)[0]])
            df = out.table(self.relation)
            for node in reversed(self.above):
                v, kind = node.to_variant(), _kind(node)
                if kind == "Projection":
                    df = df.select(*(_expr(e) for e in v.projections()))
                elif kind == "Filter":
                    df = df.filter(_expr(v.predicate()))
                elif kind == "Sort":
                    df = df.sort(*(_sort_expr(e) for e in v.sort_exprs()))
                    if v.get_fetch_val():
                        df = df.limit(int(v.get_fetch_val()))
                else:  # Limit
                    fetch, skip = _as_int(v.fetch()), _as_int(v.skip()) or 0
                    df = df.limit(fetch if fetch is not None else 2**62, offset=skip)
            return df

        return _run_df(make, row_limit, deadline)


def _expr(e):
    """A plan node's expression as the DataFrame API takes it (the nodes hand out raw ones)."""
    from datafusion.expr import Expr

    return e if isinstance(e, Expr) else Expr(e)


def _sort_expr(e):
    from datafusion.expr import SortExpr

    return e if isinstance(e, SortExpr) else SortExpr(_expr(e.expr()), e.ascending(), e.nulls_first())


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _arg_sql(arg) -> str | None:
    """SQL of an aggregate's argument when it is a column, a cast of one to a double, or a literal 1."""
    v = arg.to_variant()
    kind = type(v).__name__
    if kind == "Column":
        return _quote(v.name())
    if kind == "Cast" and type(v.expr().to_variant()).__name__ == "Column" and str(arg).endswith(" AS Float64))"):
        return f"CAST({_quote(v.expr().to_variant().name())} AS DOUBLE)"
    if kind == "Literal" and str(arg) in ("Expr(Int64(1))", "Expr(1)"):
        return "1"
    return None


def _is_float_column(table: str, arg) -> bool:
    v = arg.to_variant()
    if type(v).__name__ != "Column":
        return False
    schema = TABLES[table].schema
    return v.name() in schema.names and pa.types.is_floating(schema.field(v.name()).type)


def _kind(node) -> str:
    return type(node.to_variant()).__name__


_COLUMN = r'(?:"?\w+"?\.)?"?\w+"?'
_PLAIN_SELECT = re.compile(rf"^SELECT {_COLUMN}(?:, {_COLUMN})* FROM ")


def _plain_columns(sql: str) -> bool:
    """True for a projection that only picks columns (no expression, no alias)."""
    return bool(_PLAIN_SELECT.match(sql))


def _as_int(value) -> int | None:
    if value is None or isinstance(value, int):
        return value
    m = re.search(r"Int64\((\d+)\)", str(value)) or re.fullmatch(r"\s*(\d+)\s*", str(value))
    return int(m.group(1)) if m else None


def _pushable(predicate: str) -> bool:
    # A predicate with a subquery would run against one host's rows only; random() would be
    # drawn twice (on the host and again here).  Those stay with the asker.
    low = predicate.lower()
    return "select" not in low and "random(" not in low and "uuid(" not in low


def _combine(table: str, infos: list[_ScanInfo]) -> str:
    if len(infos) == 1:
        return infos[0].pushed_sql
    # The same table scanned more than once (a self-join): one scan with every column any of
    # them reads, and rows that pass any of their filters.
    order = TABLES[table].column_names
    wanted = {c for i in infos for c in i.columns}
    cols = [c for c in order if c in wanted] or None
    select = ", ".join(f'"{c}"' for c in cols) if cols else "1"
    sql = f'SELECT {select} FROM "{table}"'
    if all(i.predicate for i in infos):
        sql += " WHERE " + " OR ".join(f"({i.predicate})" for i in infos)
    return sql


def finish(p: Plan, parts: dict[str, list[pa.Table]], *, deadline: float | None = None) -> tuple[pa.Table, bool]:
    """Run the whole query over every host's scanned rows; returns (result, limited).

    ``parts`` maps each scanned table to one Arrow table per host that answered.
    """
    parts = {name: _scan_raw(name, p.scans[name], tables, deadline) if name in p.scans else tables
             for name, tables in parts.items()}
    if p.partial is not None:
        result = p.partial.finish(parts.get(p.partial.table, []), p.row_limit, deadline)
        limited = p.row_limit is not None and result.num_rows > p.row_limit
        return (result.slice(0, p.row_limit) if limited else result), limited
    if not p.scans:
        # Nothing from the hosts (SHOW TABLES, DESCRIBE, information_schema): the planning context answers.
        result = _run(_planning_context(), p.sql, p.row_limit, deadline)
        limited = p.row_limit is not None and result.num_rows > p.row_limit
        return (result.slice(0, p.row_limit) if limited else result), limited
    ctx = _context()
    words = set(re.findall(r"\w+", p.sql.lower()))
    catalog = bool(words & {"information_schema", "show", "describe"})
    for spec in TABLES.values():
        if spec.name not in p.scans and not catalog and spec.name not in words:
            continue  # not in this query (registering costs a little per table)
        tables = [t for t in parts.get(spec.name, []) if t is not None]
        if spec.name in p.scans and tables:
            if spec.name in _VIEW_BASES and words & set(VIEWS):
                # A view is planned over all its columns, though only some were fetched.
                tables = [_pad(t, spec.schema) for t in tables]
            schema = tables[0].schema
            partitions = [t.cast(schema).to_batches() or _empty(schema)[0] for t in tables]
            ctx.register_record_batches(spec.name, partitions)
        else:
            ctx.register_record_batches(spec.name, _empty(spec.schema))
    if catalog or words & set(VIEWS):
        _register_views(ctx)
    result = _run(ctx, p.sql, p.row_limit, deadline)
    limited = p.row_limit is not None and result.num_rows > p.row_limit
    return (result.slice(0, p.row_limit) if limited else result), limited


def _scan_raw(table: str, sql: str, tables: list, deadline: float | None) -> list:
    """The hosts' answers with those sent raw (``monarch_telemetry.raw``) scanned here, all at once."""
    from monarch_telemetry.raw import is_raw, unmark

    raw = [unmark(t) for t in tables if t is not None and is_raw(t)]
    if not raw:
        return tables
    schema = raw[0].schema
    whole = pa.concat_tables([t.cast(schema) if t.schema != schema else t for t in raw])
    return [t for t in tables if t is not None and not is_raw(t)] + [scan_table(table, whole, sql, deadline=deadline)]


#: Tables views are made from: when a query names a view, their columns it did not fetch are nulls.
_VIEW_BASES = {"run_ranks", "stacks", "metrics", "user_spans"}


def _pad(t: pa.Table, schema: pa.Schema) -> pa.Table:
    cols = [t.column(f.name) if f.name in t.column_names else pa.nulls(t.num_rows, f.type) for f in schema]
    return pa.Table.from_arrays(cols, schema=pa.schema([f.with_nullable(True) for f in schema]))


def _run(ctx: SessionContext, sql: str, row_limit: int | None, deadline: float | None) -> pa.Table:
    """Execute in a worker thread so a deadline can end the wait (DataFusion cannot be interrupted)."""
    return _run_df(lambda: ctx.sql_with_options(sql, _read_only()), row_limit, deadline)


def _run_df(make: Callable[[], datafusion.DataFrame], row_limit: int | None, deadline: float | None) -> pa.Table:
    """Collect the DataFrame ``make()`` gives (at most ``row_limit`` + 1 rows) before ``deadline``."""
    out: dict = {}

    def work() -> None:
        try:
            df = make()
            if row_limit is not None and not _is_explain(df.logical_plan()):
                df = df.limit(row_limit + 1)
            out["table"] = _collect_stream(df, deadline)
        except BaseException as e:  # handed to the waiting thread
            out["error"] = e

    if deadline is None:
        work()
    else:
        t = threading.Thread(target=work, name="telemetry-query", daemon=True)
        t.start()
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            raise QueryTimeout("the query did not finish in time (raise --timeout, or narrow it with WHERE / LIMIT)")
    if "error" in out:
        e = out["error"]
        if isinstance(e, QueryError):
            raise e
        if "Resources exhausted" in str(e):
            raise _over_memory(one_line(e).split(": ")[-1]) from None
        raise QueryError(one_line(e)) from None
    return out["table"]


def _collect_stream(df: datafusion.DataFrame, deadline: float | None) -> pa.Table:
    schema = df.schema()
    batches = []
    held = 0
    for b in df.execute_stream():
        batches.append(b.to_pyarrow())
        held += batches[-1].nbytes
        if held > MEMORY_LIMIT_BYTES:
            raise _over_memory("its result")
        if deadline is not None and time.monotonic() > deadline:
            raise QueryTimeout("the query did not finish in time and was cancelled")
    # A selective filter can yield its only batch (or none) at the very end, past the deadline: the
    # asker has given up by then, so a late answer is a timeout too, whatever the batches did.
    if deadline is not None and time.monotonic() > deadline:
        raise QueryTimeout("the query did not finish in time and was cancelled")
    return pa.Table.from_batches(batches, schema=schema)


def query_tables(sql: str, tables: dict[str, list[pa.Table]], *, row_limit: int | None = DEFAULT_ROW_LIMIT,
                 deadline: float | None = None) -> tuple[pa.Table, bool]:
    """The whole path in one process: plan, scan each 'host' (one Arrow table each), finish.

    Used for saved Parquet (``--from DIR``) and by tests, which compare it with one table
    holding every row.
    """
    p = plan(sql, row_limit)
    parts = {}
    for name in p.scans:
        held = tables.get(name)
        if held is None and TABLES[name].source:  # Monarch's table: its columns of ours
            held = [t.select(TABLES[name].column_names) for t in tables.get(TABLES[name].source, [])]
        parts[name] = [scan_table(name, t, p.scans[name], deadline=deadline) for t in held or []]
    return finish(p, parts, deadline=deadline)


# -- the host's side ------------------------------------------------------------------------


def run_scan(batches_of: Callable[[str], list[pa.RecordBatch]], table: str, sql: str, *,
             deadline: float | None = None) -> pa.Table:
    """Run one pushed-down scan over this host's rows (read-only; cancelled at ``deadline``)."""
    if table not in TABLES:
        raise QueryError(f"no table {table!r}")
    ctx = _context()
    spec = TABLES[table]
    batches = batches_of(table)
    ctx.register_record_batches(table, [batches] if batches else _empty(spec.schema))
    try:
        df = ctx.sql_with_options(sql, _read_only())
    except Exception as e:
        raise QueryError(one_line(e)) from None
    try:
        return _collect_stream(df, deadline)
    except QueryError:
        raise
    except Exception as e:
        raise QueryError(one_line(e)) from None


def scan_table(table: str, data: pa.Table, sql: str, *, deadline: float | None = None) -> pa.Table:
    """:func:`run_scan` over one Arrow table (a saved host, or a test's)."""
    return run_scan(lambda _: data.to_batches(), table, sql, deadline=deadline)
