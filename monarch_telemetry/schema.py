"""Every telemetry table and column, documented in this one place.

``monarch query --tables`` prints this, and README's telemetry section lists the same
(a test keeps the two in step).  Monarch's own event tables (``meshes``, ``actors``,
``actor_status_events``, ``messages``, ``sent_messages``, ``message_status_events``) have
exactly PyTorch Monarch's columns, in its order; the same rows with the columns we add after
theirs (host, pid, latency...) are ``<name>_ext`` (``actors_ext``...).  Ids are 64-bit and the
same on every host (names are hashed), so tables recorded on different hosts join.

Three kinds of table:

- *event* tables are appended to while the job runs (a bounded ring, oldest rows dropped first);
  Monarch's six are read from ours (``actors`` is ``actors_ext``'s rows with only Monarch's columns);
- *snapshot* tables are built by each host agent when asked (what is true now);
- *views* are SQL over the others, run after the rows of every host are merged.

What this module does not do: record or query anything (see ``table.py``, ``engine.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

# Column types by name: importing pyarrow costs ~0.2 s, which a client or proc that only
# records rows never pays (the host agent turns rows into Arrow).
TIME, I64, F64, STR, BOOL = "timestamp", "int64", "float64", "string", "bool"

EVENT = "event"
SNAPSHOT = "snapshot"
VIEW = "view"


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str
    doc: str
    nullable: bool = False

    @property
    def arrow_type(self) -> "pa.DataType":
        import pyarrow as pa

        return {TIME: pa.timestamp("us", tz="UTC"), I64: pa.int64(), F64: pa.float64(), STR: pa.string(),
                BOOL: pa.bool_()}[self.type]


@dataclass(frozen=True, slots=True)
class TableSpec:
    """A table's name, kind, columns and what one row means."""

    name: str
    kind: str
    doc: str
    columns: tuple[Column, ...]
    recorded_by: str = ""
    #: For Monarch's six event tables: the table of ours whose rows they are (its first columns are
    #: theirs).  Only that one is stored; this one is those rows with only Monarch's columns.
    source: str = ""

    @property
    def schema(self) -> "pa.Schema":
        cached = _SCHEMAS.get(self.name)
        if cached is None:
            import pyarrow as pa

            cached = _SCHEMAS[self.name] = pa.schema(
                [pa.field(c.name, c.arrow_type, nullable=c.nullable) for c in self.columns])
        return cached

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]


_SCHEMAS: dict[str, "pa.Schema"] = {}


@dataclass(frozen=True, slots=True)
class ViewSpec:
    """A view: SQL over the tables, with its columns documented."""

    name: str
    doc: str
    sql: str
    columns: tuple[Column, ...]
    kind: str = VIEW


def _c(name: str, type_: str, doc: str, nullable: bool = False) -> Column:
    return Column(name, type_, doc, nullable)


_HOST = _c("host", STR, "host (agent) where the row was recorded")

# --- Monarch's event tables ------------------------------------------------------------------
#
# Each is stored once, as ours (``<name>_ext``: Monarch's columns, in Monarch's order, then where
# the row was recorded and what else we measure), and read under Monarch's name with exactly
# Monarch's columns: a program (or Meta's tests) comparing ``SELECT *`` or ``information_schema``
# with Monarch's schema sees the same table, and ``JOIN actors_ext`` gives our extra facts.

MESHES_EXT = TableSpec("meshes_ext", EVENT, "One row per mesh made: host meshes, proc meshes and actor meshes.", (
    _c("id", I64, "mesh id (a hash of its full name)"),
    _c("timestamp_us", I64, "when it was made, microseconds since the epoch"),
    _c("class", STR, "'Host', 'Proc', or 'Python<ActorClass>' for an actor mesh"),
    _c("given_name", STR, "the name the program gave it (spawn's name)"),
    _c("full_name", STR, "the unique name (given name plus a suffix)"),
    _c("shape_json", STR, 'its extent as Monarch serializes one: {"inner": {"labels": [...], "sizes": [...]}}'),
    _c("parent_mesh_id", I64, "the mesh it was spawned on (procs on hosts, actors on procs)", True),
    _c("parent_view_json", STR, 'the region of the parent it was spawned on: {"labels": [...], "slice": {"offset", "sizes", "strides"}}', True),
    _HOST,
), "client")

ACTORS_EXT = TableSpec("actors_ext", EVENT, "One row per actor started (each rank of an actor mesh).", (
    _c("id", I64, "actor id (a hash of full_name)"),
    _c("timestamp_us", I64, "when it was created"),
    _c("mesh_id", I64, "the actor mesh it belongs to (meshes.id)"),
    _c("rank", I64, "its rank in the mesh"),
    _c("full_name", STR, "its address as Monarch's: actor.proc@location (ActorAddr.from_string reads it "
                         "back): <mesh full name>[<rank>].<host>-<pid>@<proc address>; a proc's agent is "
                         "proc_agent.<host>-<pid>@..., a host's host_agent.<host>@..., the client client.local@..."),
    _c("display_name", STR, "the name users see: <given name>[<rank>] ('<root>' for a client; NULL for an agent)",
       True),
    _HOST,
    _c("pid", I64, "the process it runs in (NULL for a host agent's row: the client records it)", True),
    _c("ref_name", STR, "our own short name, the admin API's and TUI's: <mesh full name>[<rank>] (the client's: "
                        "its address); NULL for a host or proc agent's row (a system actor, not listed there)",
       True),
), "proc agent, client")

ACTOR_STATUS_EVENTS_EXT = TableSpec("actor_status_events_ext", EVENT,
    "Actor lifecycle: Client, Created, Initializing, Idle, Stopping, Stopped, Failed.", (
    _c("id", I64, "event id"),
    _c("timestamp_us", I64, "when the actor entered the status"),
    _c("actor_id", I64, "actors.id"),
    _c("new_status", STR, "Client, Created, Initializing, Idle, Stopping, Stopped or Failed"),
    _c("reason", STR, "why (for Failed: the exception, one line)", True),
    _HOST,
), "proc agent, client")

MESSAGES_EXT = TableSpec("messages_ext", EVENT, "One row per endpoint call an actor handled (recorded where it was handled).", (
    _c("id", I64, "message id"),
    _c("timestamp_us", I64, "when the handler started (the message became active)"),
    _c("from_actor_id", I64, "the sending process's root actor (the client's '<root>' actor, or a proc's)"),
    _c("to_actor_id", I64, "actors.id of the receiver"),
    _c("endpoint", STR, "endpoint (method) name", True),
    _c("port_index", I64, "the receiving actor's port the message was delivered to: one per endpoint (a hash of its name)", True),
    _HOST,
    _c("status", STR, "'complete' or 'failed' (the endpoint raised)"),
    _c("latency_us", I64, "from arrival in the proc to the end of the handler, microseconds"),
    _c("queue_us", I64, "time spent queued behind earlier messages to the same actor"),
), "proc agent")

MESSAGE_STATUS_EVENTS_EXT = TableSpec("message_status_events_ext", EVENT,
    "Message lifecycle: queued (arrived), active (handler started), complete or failed.", (
    _c("id", I64, "event id"),
    _c("timestamp_us", I64, "when the message entered the status"),
    _c("message_id", I64, "messages.id"),
    _c("status", STR, "queued, active, complete or failed"),
    _HOST,
), "proc agent")

SENT_MESSAGES_EXT = TableSpec("sent_messages_ext", EVENT, "One row per message a sender cast to an actor mesh (or slice of it).", (
    _c("id", I64, "id of the send"),
    _c("timestamp_us", I64, "when it was sent"),
    _c("sender_actor_id", I64, "actors.id of the sender (the client's '<root>')"),
    _c("actor_mesh_id", I64, "meshes.id of the actor mesh messaged"),
    _c("view_json", STR, 'the slice messaged, as a region: {"labels": [...], "slice": {"offset", "sizes", "strides"}} (and "ranks" when they are no strided grid)'),
    _c("shape_json", STR, "the shape of the slice messaged, as Monarch's: the same JSON as view_json"),
    _HOST,
    _c("endpoint", STR, "endpoint name"),
    _c("adverb", STR, "call, call_one, choose, stream or broadcast"),
    _c("num_targets", I64, "how many actors the send reached"),
), "client")



def _monarch(ext: TableSpec, columns: tuple[str, ...]) -> TableSpec:
    """Monarch's table over ``ext``'s rows: its first columns, which are Monarch's."""
    cols = ext.columns[:len(columns)]
    assert tuple(c.name for c in cols) == columns, (ext.name, columns)
    return TableSpec(ext.name.removesuffix("_ext"), EVENT,
                     ext.doc + f" Monarch's columns; `{ext.name}` has the same rows with ours.", cols,
                     ext.recorded_by, source=ext.name)


# Monarch's columns of each (its ``monarch_telemetry_schema`` crate's row types).
MESHES = _monarch(MESHES_EXT, ("id", "timestamp_us", "class", "given_name", "full_name", "shape_json",
                               "parent_mesh_id", "parent_view_json"))
ACTORS = _monarch(ACTORS_EXT, ("id", "timestamp_us", "mesh_id", "rank", "full_name", "display_name"))
ACTOR_STATUS_EVENTS = _monarch(ACTOR_STATUS_EVENTS_EXT, ("id", "timestamp_us", "actor_id", "new_status", "reason"))
MESSAGES = _monarch(MESSAGES_EXT, ("id", "timestamp_us", "from_actor_id", "to_actor_id", "endpoint", "port_index"))
MESSAGE_STATUS_EVENTS = _monarch(MESSAGE_STATUS_EVENTS_EXT, ("id", "timestamp_us", "message_id", "status"))
SENT_MESSAGES = _monarch(SENT_MESSAGES_EXT, ("id", "timestamp_us", "sender_actor_id", "actor_mesh_id", "view_json",
                                             "shape_json"))

# --- ours -------------------------------------------------------------------------------------

HOSTS = TableSpec("hosts", SNAPSHOT, "One row per host agent: what it is and how loaded it is now.", (
    _HOST,
    _c("host_rank", I64, "the host's rank in the reservation"),
    _c("agent_pid", I64, "the host agent's pid"),
    _c("addr", STR, "the agent's address"),
    _c("started", TIME, "when the agent started"),
    _c("uptime_s", F64, "seconds since it started"),
    _c("cpu_count", I64, "CPUs of the host"),
    _c("load_1m", F64, "1-minute load average"),
    _c("memory_total_bytes", I64, "the host's memory"),
    _c("memory_available_bytes", I64, "memory available now"),
    _c("agent_rss_bytes", I64, "the agent's resident memory (its telemetry included)"),
    _c("procs_alive", I64, "proc agents running"),
    _c("ranks_alive", I64, "commands of `monarch run` running"),
    _c("telemetry_rows", I64, "rows held in this agent's event tables"),
    _c("telemetry_bytes", I64, "bytes held in this agent's event tables"),
), "host agent")

PROCS = TableSpec("procs", SNAPSHOT, "Processes a host agent started: proc agents and `monarch run` ranks, live and exited.", (
    _HOST,
    _c("pid", I64, "process id"),
    _c("kind", STR, "'proc' (a proc agent hosting actors) or 'rank' (a command of `monarch run`)"),
    _c("mesh", STR, "the proc mesh a proc belongs to ('' for ranks)"),
    _c("run_id", STR, "the run a rank belongs to", True),
    _c("rank", I64, "the rank's index in its run (one per host)", True),
    _c("status", STR, "running, exited (code 0), failed (non-zero code) or killed (by a signal)"),
    _c("exit_code", I64, "exit code, once exited", True),
    _c("signal", I64, "the signal that ended it, if one did", True),
    _c("reason", STR, "how it ended, in words", True),
    _c("rss_bytes", I64, "resident memory now (running processes only)", True),
    _c("started", TIME, "when it started"),
    _c("ended", TIME, "when it ended", True),
), "host agent")

RUN_RANKS = TableSpec("run_ranks", SNAPSHOT, "One row per rank of each `monarch run` (the views runs and rank_exits are made from it); an actor program is rank 0 on host 'client', from the job folder.", (
    _c("run_id", STR, "the run"),
    _c("rank", I64, "the rank: the host's index in the run"),
    _HOST,
    _c("argv", STR, "the command, shell-quoted"),
    _c("cwd", STR, "its working directory", True),
    _c("pid", I64, "its process id (0 until started)"),
    _c("started", TIME, "when it started"),
    _c("ended", TIME, "when it ended", True),
    _c("exit_code", I64, "exit code (negative: killed by that signal)", True),
    _c("signal", I64, "the signal that ended it", True),
    _c("reason", STR, "how it ended, in words", True),
), "host agent")

LOGS = TableSpec("logs", EVENT, "Every line printed by a rank of `monarch run` or by Python code in a proc.", (
    _c("time", TIME, "when the line was read"),
    _HOST,
    _c("run_id", STR, "the run (ranks only)", True),
    _c("rank", I64, "the rank in the run (ranks only)", True),
    _c("proc", STR, "the proc mesh and pid, 'mesh/pid' (procs only)", True),
    _c("stream", STR, "stdout or stderr"),
    _c("line", STR, "the line, without its newline"),
), "host agent (ranks), proc agent (procs)")

STACKS = TableSpec("stacks", EVENT, "Python stacks taken by `monarch stack` (py-spy), one row per frame.", (
    _c("time", TIME, "when the stack was taken"),
    _HOST,
    _c("pid", I64, "the process"),
    _c("kind", STR, "'proc' or 'rank' (for a rank: every Python process of its command)"),
    _c("run_id", STR, "the run, for a rank", True),
    _c("rank", I64, "the rank, for a rank", True),
    _c("thread_id", I64, "thread id"),
    _c("thread_name", STR, "thread name", True),
    _c("depth", I64, "0 = innermost frame"),
    _c("function", STR, "function name"),
    _c("filename", STR, "source file"),
    _c("line", I64, "line number"),
    _c("error", STR, "why no stack could be taken (then the frame columns are empty)", True),
    _c("dump_id", STR, "the mesh admin's `POST /v1/pyspy_dump` that took it, or the id a dump was stored under "
                       "(`store_pyspy_dump`); empty for `monarch stack`", True),
    _c("proc_ref", STR, "the proc reference a stored dump was given (`store_pyspy_dump`); empty for dumps taken here", True),
), "host agent, client (stored dumps)")

# Monarch's fourth py-spy table: the locals a stored dump carried (monarch's own dumps take none).
PYSPY_LOCAL_VARIABLES = TableSpec("pyspy_local_variables", EVENT,
                                  "One row per local variable of a frame of a py-spy dump stored with "
                                  "`store_pyspy_dump` (monarch's own dumps take no locals).", (
    _c("dump_id", STR, "the dump"),
    _c("thread_id", I64, "thread id"),
    _c("frame_depth", I64, "0 = innermost frame"),
    _c("name", STR, "the variable's name"),
    _c("addr", I64, "its object's address", True),
    _c("arg", BOOL, "whether it is an argument of the function", True),
    _c("repr", STR, "its repr", True),
), "client (stored dumps)")

DEBUG_SESSIONS = TableSpec("debug_sessions", SNAPSHOT,
                           "Ranks and actors paused in pdb now (`breakpoint()`, `monarch run --pdb`), as `monarch debug list` shows them.", (
    _HOST,
    _c("sid", I64, "the session's number on its host"),
    _c("rank", I64, "torchrun's RANK, the host's index in the run, or the actor's rank in its mesh"),
    _c("pid", I64, "the paused process"),
    _c("kind", STR, "'breakpoint' or 'post_mortem'"),
    _c("actor", STR, "the actor mesh's name ('' for a command)"),
    _c("command", STR, "the command (or actor class) that paused"),
    _c("run_id", STR, "the run it belongs to ('' for actors)"),
    _c("file", STR, "source file where pdb stopped"),
    _c("line", I64, "line where pdb stopped"),
    _c("function", STR, "function where pdb stopped"),
    _c("waiting", BOOL, "pdb waits for a command (false while one runs)"),
    _c("held_by", STR, "the `monarch debug` attached to it ('' for none)"),
    _c("started", TIME, "when the session opened"),
), "host agent")

USER_SPANS = TableSpec("user_spans", EVENT, "Spans a program timed with the actor API's `span(name)` or `@traced`, one row per span that ended (Monarch's `spans` view shows them as Monarch's rows).", (
    _c("time", TIME, "when the span started"),
    _HOST,
    _c("pid", I64, "the process"),
    _c("actor", STR, "the actor it ran in ('<root>' for the client)"),
    _c("name", STR, "the span's name"),
    _c("duration_us", I64, "how long it lasted, microseconds"),
    _c("error", STR, "the exception that left the span, if one did", True),
    _c("id", I64, "the span's id (spans.id)"),
), "client, proc agent")

METRICS = TableSpec("metrics", EVENT, "Values a program recorded through the actor API's `get_meter()`: counters, up-down counters, histograms.", (
    _c("time", TIME, "when the value was recorded"),
    _HOST,
    _c("pid", I64, "the process"),
    _c("actor", STR, "the actor it was recorded in ('<root>' for the client)"),
    _c("name", STR, "the instrument's name"),
    _c("kind", STR, "counter, up_down_counter or histogram"),
    _c("value", F64, "the amount added (counters) or the value recorded (histograms)"),
    _c("attributes", STR, "the attributes given, as JSON", True),
), "client, proc agent")

# --- Monarch's mesh-introspection snapshots ----------------------------------------------------
#
# A job with telemetry captures the mesh admin tree (root, hosts, procs, actors) every
# ``TelemetryConfig.snapshot_interval_secs`` (0: never) into these tables, by Monarch's names and
# columns; node ids are the admin API's references (opaque: not to be parsed in SQL).

_SID = _c("snapshot_id", STR, "the capture (snapshots.snapshot_id)")
_NID = _c("node_id", STR, "the node: the mesh admin API's reference (root, host:NAME, proc:HOST/PID, actor:HOST/PID,NAME)")
_SNAP = "client (periodic captures)"


def _snapshot_table(name: str, doc: str, *columns: Column) -> TableSpec:
    return TableSpec(name, EVENT, doc, columns, _SNAP)


SNAPSHOTS = _snapshot_table("snapshots", "One row per capture of the mesh admin tree.",
    _SID, _c("snapshot_ts", I64, "when it was taken, microseconds since the epoch"))
NODES = _snapshot_table("nodes", "One row per node of a capture (its kind's table has the rest).",
    _SID, _NID, _c("node_kind", STR, "root, host, proc, actor or error"),
    _c("as_of", I64, "when the node was read, microseconds since the epoch"))
CHILDREN = _snapshot_table("children", "One row per parent-to-child link of a capture.",
    _SID, _c("parent_id", STR, "the parent's node_id"), _c("child_id", STR, "the child's node_id"),
    _c("child_sort_key", I64, "its place among its parent's children"),
    _c("is_system", BOOL, "a system child of its parent (monarch's tree has none)"),
    _c("is_stopped", BOOL, "a stopped actor its proc still lists"))
ROOT_NODES = _snapshot_table("root_nodes", "The root node of a capture.",
    _SID, _NID, _c("num_hosts", I64, "its hosts"), _c("started_at", I64, "when the job's services started (us)"),
    _c("started_by", STR, "user@machine that started it"))
HOST_NODES = _snapshot_table("host_nodes", "One row per host node of a capture.",
    _SID, _NID, _c("addr", STR, "the host agent's address"), _c("host_num_procs", I64, "its procs"))
PROC_NODES = _snapshot_table("proc_nodes", "One row per proc node of a capture.",
    _SID, _NID, _c("proc_name", STR, "<proc mesh>/<pid>"), _c("num_actors", I64, "live actors on it"),
    _c("stopped_retention_cap", I64, "stopped actors kept listed at most (0: all of them)"),
    _c("is_poisoned", BOOL, "a failed actor or a failed process"), _c("failed_actor_count", I64, "failed actors on it"))
ACTOR_NODES = _snapshot_table("actor_nodes", "One row per actor node of a capture.",
    _SID, _NID, _c("actor_status", STR, "its status, lower case ('failed: why' for a failed one)"),
    _c("actor_type", STR, "its class"), _c("instance_id", STR, "actors.id"),
    _c("messages_processed", I64, "calls it handled"), _c("created_at", I64, "when it was created (us)", True),
    _c("last_message_handler", STR, "the endpoint it handled last", True),
    _c("total_processing_time_us", I64, "time its calls took, in all"),
    _c("queue_depth", I64, "calls waiting for it (not measured: 0)"),
    _c("is_system", BOOL, "a system actor (false: monarch's system work is its agents')"))
ACTOR_FAILURES = _snapshot_table("actor_failures", "One row per failed actor of a capture.",
    _SID, _NID, _c("failure_error_message", STR, "why it failed"),
    _c("failure_root_cause_actor", STR, "node_id of the actor whose failure this is"),
    _c("failure_root_cause_name", STR, "its display name", True),
    _c("failure_occurred_at", I64, "when it failed (us)"), _c("failure_is_propagated", BOOL, "propagated from another actor"))
ACTOR_INBOUND_ORDERINGS = _snapshot_table(
    "actor_inbound_orderings", "Monarch's per-actor reorder buffers; monarch delivers a sender's calls in order "
    "without one, so it has no rows.",
    _SID, _NID, _c("enabled", BOOL, "buffering on"), _c("snapshot_complete", BOOL, "session state read"),
    _c("skipped_session_count", I64, "sessions not read"), _c("known_session_count", I64, "sessions"),
    _c("returned_buffered_session_count", I64, "sessions buffering"),
    _c("returned_buffered_message_count", I64, "messages buffered"),
    _c("returned_max_buffered_count", I64, "most buffered in one session"))
ORDERING_SESSIONS = _snapshot_table(
    "ordering_sessions", "Monarch's reorder-buffer sessions (no rows: see actor_inbound_orderings).",
    _SID, _NID, _c("session_id", STR, "the session"), _c("sender", STR, "its sender", True),
    _c("last_released_seq", I64, "last sequence number delivered"), _c("expected_next_seq", I64, "next expected"),
    _c("buffered_count", I64, "messages held"), _c("oldest_buffered_seq", I64, "oldest held", True),
    _c("newest_buffered_seq", I64, "newest held", True))
RESOLUTION_ERRORS = _snapshot_table("resolution_errors", "One row per node a capture could not read.",
    _SID, _NID, _c("error_code", STR, "not_found, gateway_timeout, ..."), _c("error_message", STR, "why"))

SNAPSHOT_TABLES = (SNAPSHOTS, NODES, CHILDREN, ROOT_NODES, HOST_NODES, PROC_NODES, ACTOR_NODES, ACTOR_FAILURES,
                   ACTOR_INBOUND_ORDERINGS, ORDERING_SESSIONS, RESOLUTION_ERRORS)

TABLES: dict[str, TableSpec] = {t.name: t for t in (
    MESHES, ACTORS, ACTOR_STATUS_EVENTS, MESSAGES, MESSAGE_STATUS_EVENTS, SENT_MESSAGES,
    MESHES_EXT, ACTORS_EXT, ACTOR_STATUS_EVENTS_EXT, MESSAGES_EXT, MESSAGE_STATUS_EVENTS_EXT, SENT_MESSAGES_EXT,
    HOSTS, PROCS, RUN_RANKS, LOGS, STACKS, DEBUG_SESSIONS, USER_SPANS, METRICS, PYSPY_LOCAL_VARIABLES,
    *SNAPSHOT_TABLES,
)}

# --- views (run after merging every host's rows) ---------------------------------------------

RUNS = ViewSpec("runs", "One row per `monarch run`: a command on the hosts, or an actor program (host 'client').", """
SELECT run_id,
       first_value(argv ORDER BY rank) AS argv,
       string_agg(host, ',' ORDER BY rank) AS hosts,
       count(*) AS num_ranks,
       min(started) AS started,
       CASE WHEN count(ended) = count(*) THEN max(ended) END AS ended,
       CASE WHEN count(ended) < count(*) THEN 'running'
            WHEN sum(CASE WHEN exit_code <> 0 THEN 1 ELSE 0 END) > 0 THEN 'failed'
            ELSE 'succeeded' END AS status,
       sum(CASE WHEN exit_code <> 0 THEN 1 ELSE 0 END) AS failed_ranks
FROM run_ranks GROUP BY run_id""", (
    _c("run_id", STR, "the run"),
    _c("argv", STR, "the command (rank 0's)"),
    _c("hosts", STR, "its hosts, comma-separated, in rank order"),
    _c("num_ranks", I64, "how many ranks (hosts) it ran on"),
    _c("started", TIME, "when its first rank started"),
    _c("ended", TIME, "when its last rank ended (empty while one runs)", True),
    _c("status", STR, "running, succeeded or failed"),
    _c("failed_ranks", I64, "ranks that exited non-zero"),
))

RANK_EXITS = ViewSpec("rank_exits", "One row per rank of a run that has exited, in the order they exited.", """
SELECT run_id, rank, host, exit_code, signal, reason, ended AS time
FROM run_ranks WHERE ended IS NOT NULL""", (
    _c("run_id", STR, "the run"),
    _c("rank", I64, "the rank"),
    _HOST,
    _c("exit_code", I64, "exit code (negative: the signal that killed it)"),
    _c("signal", I64, "the signal that ended it", True),
    _c("reason", STR, "how it ended, in words", True),
    _c("time", TIME, "when it exited"),
))

# Monarch's stored py-spy dumps (``POST /v1/pyspy_dump``), by its table and column names: views of
# the ``stacks`` rows a dump left, so there is one copy of every frame.
PYSPY_DUMPS = ViewSpec("pyspy_dumps", "One row per py-spy dump the mesh admin API stored (`POST /v1/pyspy_dump/{proc}`).", """
SELECT dump_id, CAST(to_unixtime(min(time)) * 1000000 AS BIGINT) AS timestamp_us, pid, 'py-spy' AS binary,
       coalesce(max(proc_ref), 'proc:' || host || '/' || CAST(pid AS VARCHAR)) AS proc_ref
FROM stacks WHERE dump_id IS NOT NULL GROUP BY dump_id, host, pid""", (
    _c("dump_id", STR, "the dump's id, as the API answered it"),
    _c("timestamp_us", I64, "when it was taken (microseconds since the epoch)"),
    _c("pid", I64, "the process"),
    _c("binary", STR, "the profiler that took it"),
    _c("proc_ref", STR, "the proc's mesh admin reference (a stored dump's: the one it was stored with)"),
))

PYSPY_STACK_TRACES = ViewSpec("pyspy_stack_traces", "One row per thread of a stored py-spy dump.", """
SELECT DISTINCT dump_id, pid, thread_id, thread_name FROM stacks WHERE dump_id IS NOT NULL AND error IS NULL""", (
    _c("dump_id", STR, "the dump"),
    _c("pid", I64, "the process"),
    _c("thread_id", I64, "thread id"),
    _c("thread_name", STR, "thread name", True),
))

PYSPY_FRAMES = ViewSpec("pyspy_frames", "One row per frame of a stored py-spy dump.", """
SELECT dump_id, thread_id, depth AS frame_depth, function AS name, filename, line
FROM stacks WHERE dump_id IS NOT NULL AND error IS NULL""", (
    _c("dump_id", STR, "the dump"),
    _c("thread_id", I64, "thread id"),
    _c("frame_depth", I64, "0 = innermost frame"),
    _c("name", STR, "function name"),
    _c("filename", STR, "source file"),
    _c("line", I64, "line number"),
))


# Monarch's counter table, over ``metrics``: each add is one delta point (Monarch's OTel exporter sums the
# adds of an export interval into one); its one meter's scope is 'monarch'.
METRIC_SUMS = ViewSpec("metric_sums", "Counter and up-down-counter points, as Monarch's table: one delta point per add.", """
SELECT name,
       CAST(to_unixtime(time) * 1000000 AS BIGINT) AS timestamp_us,
       CAST(to_unixtime(time) * 1000000 AS BIGINT) AS start_timestamp_us,
       'monarch' AS scope_name,
       '' AS unit,
       'delta' AS temporality,
       kind = 'counter' AS is_monotonic,
       coalesce(attributes, '{}') AS attributes_json,
       '{"service.name": "monarch", "host.name": "' || host || '", "process.pid": ' || CAST(pid AS VARCHAR) || '}'
         AS resource_attributes_json,
       value AS sum_f64,
       CASE WHEN value = trunc(value) THEN CAST(value AS BIGINT) END AS sum_i64,
       CASE WHEN value = trunc(value) AND value >= 0 THEN CAST(value AS BIGINT) END AS sum_u64
FROM metrics WHERE kind IN ('counter', 'up_down_counter')""", (
    _c("name", STR, "the instrument's name"),
    _c("timestamp_us", I64, "when the value was added, microseconds since the epoch"),
    _c("start_timestamp_us", I64, "the start of the point's interval (the add itself)"),
    _c("scope_name", STR, "the meter's scope: 'monarch'"),
    _c("unit", STR, "the instrument's unit (none recorded: '')"),
    _c("temporality", STR, "'delta': each row is the amount added"),
    _c("is_monotonic", BOOL, "true for a counter, false for an up-down counter"),
    _c("attributes_json", STR, "the attributes given, as JSON ('{}' for none)"),
    _c("resource_attributes_json", STR, "where it was recorded, as JSON: service.name, host.name, process.pid"),
    _c("sum_f64", F64, "the amount added"),
    _c("sum_i64", I64, "the amount added, when a whole number", True),
    _c("sum_u64", I64, "the amount added, when a whole number not below 0", True),
))

def _json_text(column: str) -> str:
    """SQL: ``column`` as a JSON string literal (quotes and backslashes escaped)."""
    escaped = f"""replace(replace({column}, '\\', '\\\\'), '"', '\\"')"""
    for code, esc in ((10, "n"), (13, "r"), (9, "t")):
        escaped = f"replace({escaped}, chr({code}), '\\{esc}')"
    return f"""'"' || {escaped} || '"'"""


# Monarch's spans table (its Rust tracing's span rows): a user's ``span(name)`` is a span named
# 'python_user_span' whose fields hold the name.  Over ``user_spans``.
SPANS = ViewSpec("spans", "Spans as Monarch's table has them: one row per span a program timed (`span(name)`, `@traced`), named 'python_user_span', its name in `fields_json`.", f"""
SELECT id, 'python_user_span' AS name, 'monarch.actor' AS target, CASE WHEN error IS NULL THEN 'INFO' ELSE 'ERROR' END AS level,
       '{{"name": ' || {_json_text("name")} || ', "actor": ' || {_json_text("actor")} ||
       ', "duration_us": ' || CAST(duration_us AS VARCHAR) ||
       CASE WHEN error IS NULL THEN '' ELSE ', "error": ' || {_json_text("error")} END || '}}' AS fields_json,
       CAST(to_unixtime(time) * 1000000 AS BIGINT) AS timestamp_us, CAST(NULL AS BIGINT) AS parent_id,
       '' AS thread_name, arrow_cast(NULL, 'Utf8') AS file, CAST(NULL AS BIGINT) AS line
FROM user_spans""", (
    _c("id", I64, "the span's id"),
    _c("name", STR, "'python_user_span'"),
    _c("target", STR, "'monarch.actor'"),
    _c("level", STR, "INFO, or ERROR for a span an exception left"),
    _c("fields_json", STR, 'its fields as JSON: {"name": ..., "actor": ..., "duration_us": ..., "error": ...}'),
    _c("timestamp_us", I64, "when it started, microseconds since the epoch"),
    _c("parent_id", I64, "the enclosing span (not recorded: empty)", True),
    _c("thread_name", STR, "the thread (not recorded: '')"),
    _c("file", STR, "source file (not recorded)", True),
    _c("line", I64, "source line (not recorded)", True),
))

VIEWS: dict[str, ViewSpec] = {v.name: v for v in (RUNS, RANK_EXITS, PYSPY_DUMPS, PYSPY_STACK_TRACES, PYSPY_FRAMES,
                                                  METRIC_SUMS, SPANS)}


def all_specs() -> list[TableSpec | ViewSpec]:
    """Tables then views, in documentation order."""
    return [*TABLES.values(), *VIEWS.values()]


def reference_markdown() -> str:
    """Every table and column as Markdown (README's telemetry reference is this text)."""
    out = []
    for spec in all_specs():
        out.append(f"#### `{spec.name}` ({spec.kind})\n\n{spec.doc}" + (
            f" Recorded by: {spec.recorded_by}." if getattr(spec, "recorded_by", "") else "") + "\n")
        out.append("| column | type | meaning |\n|---|---|---|")
        for c in spec.columns:
            out.append(f"| `{c.name}` | {c.type}{' (nullable)' if c.nullable else ''} | {c.doc} |")
        out.append("")
    return "\n".join(out)
