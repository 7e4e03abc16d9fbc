"""monarch.config: the runtime settings of this process, as PyTorch Monarch's ``monarch.config``.

    from monarch.config import configure, configured, get_global_config

    configure(mesh_proc_spawn_max_idle="5m")           # procs may take 5 minutes to start
    with configured(stop_actor_timeout="30s"):         # for this block only
        ...
    get_global_config()["mesh_proc_spawn_max_idle"]   # '5m'

Layers, lowest first: defaults, environment variables, then what ``configure`` set (the
"runtime" layer).  Durations take humantime strings ("30s", "5m", "1h 30m", "250ms", "2 weeks") or
seconds, in ``configure`` and in the environment alike.  What a setting governs reads it through
:func:`seconds` when it needs it: the one path, so a setting changed later applies to what comes
after, and nothing here writes into other modules.

Every key of Monarch's ``configure`` is known here and takes Monarch's value form (a duration
string, a bool, an int, ...); a key Monarch does not know raises ``ValueError``, a value of the
wrong form raises :class:`ConfigValueError` (a ``TypeError``, as Monarch's, and a ``ValueError``),
and either changes nothing.  These settings govern something here:

==============================  =========================================  =============================
setting                         what                                       environment
==============================  =========================================  =============================
``mesh_proc_spawn_max_idle``    how long ``spawn_procs`` waits for a host  ``MONARCH_SPAWN_TIMEOUT`` (s),
                                                                           ``HYPERACTOR_MESH_PROC_SPAWN_MAX_IDLE``
``host_spawn_ready_timeout``    how long this client waits for its own     ``HYPERACTOR_HOST_SPAWN_READY_TIMEOUT``
                                host agent to come up and answer
``stop_actor_timeout``          how long stopping a proc mesh waits for    ``HYPERACTOR_STOP_ACTOR_TIMEOUT``
                                each proc, and a proc for each actor (its
                                ``__cleanup__``) and each mesh it made
``proc_stop_max_idle``          how long stopping a proc mesh waits for    ``HYPERACTOR_MESH_PROC_STOP_MAX_IDLE``
                                each host to end the mesh's procs
``mesh_terminate_timeout``      how long a host gives each proc of a        ``HYPERACTOR_MESH_TERMINATE_TIMEOUT``
                                stopping mesh after SIGTERM, then SIGKILL
``port_forward_connect_timeout`` how long a forwarded connection waits      -
                                for its destination (monarch's own)
``serve_agent_start_max_idle``   how long ``monarch serve`` waits, its job  ``MONARCH_SERVE_STALL_TIMEOUT``
                                running, with no new host agent up          (s)
                                (monarch's own)
``sync_stall_timeout``          how long a workspace sync waits with no    ``MONARCH_SYNC_STALL_S`` (s)
                                host answering before it fails
                                (monarch's own)
``message_delivery_timeout``    how long a peer may take none of what we   ``HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT``
                                sent before it counts as gone (calls to it
                                fail); on another host also its time to
                                connect and answer heartbeats, where
                                shorter than 5 s (``monarch_agents/settings``)
``mesh_orphan_timeout``         how long a client's procs outlive it once  ``HYPERACTOR_MESH_ORPHAN_TIMEOUT``
                                it is gone (None: until stopped); ours is
                                0 s: reaped at once
``mesh_attach_config_timeout``  how long ``attach_to_workers`` waits for    ``HYPERACTOR_MESH_ATTACH_CONFIG_TIMEOUT``
                                every worker to take the job
``codec_max_frame_length``     the longest message (bytes) this process   ``HYPERACTOR_CODEC_MAX_FRAME_LENGTH``
                                sends: a longer one (64 KiB and more) is
                                refused, its call failing with
                                ``SupervisionError`` (``monarch_agents/settings``)
``mesh_admin_pyspy_*``,         the admin API's waits for a proc's host     ``HYPERACTOR_MESH_ADMIN_...``
``mesh_admin_config_dump_*``,   (stacks, settings), its longest profile,
``mesh_admin_tree_timeout``,    its whole tree's, and where it listens
``mesh_admin_addr``             without ``MeshAdminConfig(admin_addr)``:
                                ours is loopback on a free port
==============================  =========================================  =============================

Monarch's other keys (the RDMA, logging, telemetry and channel tuning, ...) are accepted, checked
and shown by ``get_global_config`` with Monarch's defaults, and govern nothing here
(:func:`is_applied` says which); the README's compatibility table says why, key by key.

As in Monarch, a proc starts with the settings of the process that spawned its mesh, as they were at
``spawn_procs`` (carried in ``MONARCH_CLIENT_CONFIG``, below the proc's own ``configure``): an
actor's nested ``spawn_procs`` or ``stop`` waits as its client said.

For tests, as in Monarch: ``@parametrize_config(key={v1, v2}, ...)`` runs a test under every
combination of the values, ``@parametrize_config_pointwise(key=[v1, v2], ...)`` under the i-th
value of each; a key or value they cannot take fails when the module loads.
"""

from __future__ import annotations

import contextlib
import difflib
import enum
import functools
import inspect
import itertools
import json
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator


@dataclass(frozen=True)
class _Setting:
    default: Any
    env: tuple[str, ...]
    doc: str
    kind: str = "duration"
    applied: bool = True


class Encoding(enum.Enum):
    """The message encodings Monarch's ``default_encoding`` names (accepted; monarch has one wire format)."""

    Bincode = "bincode"
    Json = "json"
    Multipart = "multipart"

    def __repr__(self) -> str:
        return f"Encoding.{self.name}"


class ConfigValueError(TypeError, ValueError):
    """A value of the wrong form for its key: a ``TypeError`` as Monarch raises, and a ``ValueError``."""


_SETTINGS: dict[str, _Setting] = {
    "mesh_proc_spawn_max_idle": _Setting("120s", ("MONARCH_SPAWN_TIMEOUT", "HYPERACTOR_MESH_PROC_SPAWN_MAX_IDLE"),
                                         "how long spawn_procs waits for a host to start its procs"),
    "host_spawn_ready_timeout": _Setting("60s", ("HYPERACTOR_HOST_SPAWN_READY_TIMEOUT",),
                                         "how long the client waits for its own host agent to answer"),
    "stop_actor_timeout": _Setting("5s", ("HYPERACTOR_STOP_ACTOR_TIMEOUT",),
                                   "how long stopping a proc mesh waits for each proc"),
    "proc_stop_max_idle": _Setting("5s", ("HYPERACTOR_MESH_PROC_STOP_MAX_IDLE",),
                                   "how long stopping a proc mesh waits for each host to end its procs"),
    "mesh_terminate_timeout": _Setting("1s", ("HYPERACTOR_MESH_TERMINATE_TIMEOUT",),
                                       "how long a host gives each proc of a stopping mesh after SIGTERM"),
    "port_forward_connect_timeout": _Setting("10s", (), "how long a forwarded connection waits for its destination"),
    "serve_agent_start_max_idle": _Setting("300s", ("MONARCH_SERVE_STALL_TIMEOUT",),
                                          "how long serve waits, its job running, with no new host agent up"),
    "message_delivery_timeout": _Setting("30s", ("HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT",),
                                         "how long a peer may take none of our messages before it counts as gone"),
    "mesh_orphan_timeout": _Setting("0s", ("HYPERACTOR_MESH_ORPHAN_TIMEOUT",),
                                    "how long procs outlive the client that spawned them (None: until stopped)",
                                    "duration?"),
    "mesh_attach_config_timeout": _Setting("1m", ("HYPERACTOR_MESH_ATTACH_CONFIG_TIMEOUT",),
                                           "how long attach_to_workers waits for every worker to take the job"),
    "mesh_admin_addr": _Setting("127.0.0.1:0", ("HYPERACTOR_MESH_ADMIN_ADDR",),
                                "where the admin API listens when MeshAdminConfig names no address", "str"),
    "mesh_admin_tree_timeout": _Setting("10s", ("HYPERACTOR_MESH_ADMIN_TREE_TIMEOUT",),
                                        "how long the admin API's GET /v1/tree may take"),
    "mesh_admin_pyspy_bridge_timeout": _Setting("13s", ("HYPERACTOR_MESH_ADMIN_PYSPY_BRIDGE_TIMEOUT",),
                                                "how long the admin API waits for a proc's host to dump its stacks"),
    "mesh_admin_config_dump_bridge_timeout": _Setting(
        "5s", ("HYPERACTOR_MESH_ADMIN_CONFIG_DUMP_BRIDGE_TIMEOUT",),
        "how long the admin API waits for a proc to tell its settings"),
    "mesh_admin_pyspy_max_profile_duration": _Setting(
        "5m", ("HYPERACTOR_MESH_ADMIN_PYSPY_MAX_PROFILE_DURATION",),
        "the longest profile the admin API takes (POST /v1/pyspy_profile_svg)"),
    "sync_stall_timeout": _Setting("60s", ("MONARCH_SYNC_STALL_S",),
                                   "how long a workspace sync waits with no host answering before it fails"),
    "codec_max_frame_length": _Setting(10 << 30, ("HYPERACTOR_CODEC_MAX_FRAME_LENGTH",),
                                       "the longest message (bytes) a client, proc or host agent sends", "int"),
}

# Monarch's other keys: (value form, Monarch's default).  Accepted and checked so a program written
# for Monarch runs unchanged, and a typo still raises; nothing here reads them.
_ACCEPTED: dict[str, tuple[str, Any]] = {
    "actor_spawn_max_idle": ("duration", "30s"),
    "channel_net_rx_buffer_full_check_interval": ("duration", "5s"),
    "channel_reconnect_timeout": ("duration", "1m"),
    "channel_tcp_congestion": ("str", ""),
    "channel_tcp_keepalive_idle": ("duration", "1m"),
    "cleanup_timeout": ("duration", "3s"),
    "default_encoding": ("encoding", None),  # Encoding.Multipart, set below
    "default_transport": ("transport", "unix"),
    "enable_dest_actor_reordering_buffer": ("bool", True),
    "enable_file_capture": ("bool", False),
    "enable_log_forwarding": ("bool", False),
    "enable_otel_metrics": ("bool", True),
    "enable_otel_tracing": ("bool", True),
    "enable_recorder_tracing": ("bool", True),
    "enable_sqlite_tracing": ("bool", False),
    "enable_unawaited_python_task_traceback": ("bool", False),
    "file_log_level": ("str", ""),
    "force_file_log": ("bool", False),
    "forwarder_flush_timeout": ("duration", "5s"),
    "get_actor_state_max_idle": ("duration", "30s"),
    "get_proc_state_max_idle": ("duration", "1m"),
    "max_cast_dimension_size": ("int", 16),
    "max_cast_fanout": ("int", 16),
    "mesh_admin_max_concurrent_resolves": ("int", 2),
    "mesh_admin_pyspy_client_timeout": ("duration", "20s"),
    "mesh_admin_pyspy_timeout": ("duration", "10s"),
    "mesh_admin_query_child_timeout": ("duration", "100ms"),
    "mesh_admin_resolve_actor_timeout": ("duration", "200ms"),
    "mesh_admin_single_host_timeout": ("duration", "3s"),
    "mesh_bootstrap_enable_pdeathsig": ("bool", True),
    "mesh_terminate_concurrency": ("int", 16),
    "message_ack_every_n_messages": ("int", 1000),
    "message_ack_time_interval": ("duration", "500ms"),
    "message_latency_sampling_rate": ("float", 0.01),
    "message_ttl_default": ("int", 64),
    "monarch_log_suffix": ("str", ""),
    "otel_metric_export_interval": ("duration", "1s"),
    "pending_actor_delivery_timeout": ("duration", "30s"),
    "prefix_with_rank": ("bool", True),
    "proc_launcher_kind": ("str", ""),
    "process_exit_timeout": ("duration", "10s"),
    "process_memory_metric_interval": ("duration", "5m"),
    "pyspy_bin": ("str", ""),
    "rdma_allow_tcp_fallback": ("bool", True),
    "rdma_cq_poller_per_device": ("bool", True),
    "rdma_disable_ibverbs": ("bool", False),
    "rdma_host_odp": ("bool", False),
    "rdma_ibverbs_target": ("str", ""),
    "rdma_max_chunk_size_mb": ("int", 64),
    "rdma_max_nics_per_buffer": ("int?", None),
    "rdma_min_stripe_size_kb": ("int", 512),
    "rdma_peer_device_affinity": ("str", ""),
    "rdma_qp_init_timeout": ("duration", "30s"),
    "rdma_qps_per_cq": ("int", 64),
    "rdma_qps_per_peer": ("int", 4),
    "rdma_runtime_worker_threads": ("int", 4),
    "rdma_tcp_fallback_parallelism": ("int", 1),
    "read_log_buffer": ("int", 100),
    "scuba_log_enter_exit": ("bool", False),
    "sequencer_max_locked_keys": ("int", 128),
    "server_heartbeat_interval": ("duration", "1s"),
    "small_write_threshold": ("int", 256),
    "split_max_buffer_age": ("duration", "50ms"),
    "split_max_buffer_size": ("int", 5),
    "stop_grace_period": ("duration", "10s"),
    "supervision_watchdog_timeout": ("duration", "2m"),
    "tail_log_lines": ("int", 0),
    "terminated_snapshot_retention": ("int", 100),
    "tokio_worker_threads": ("int?", None),
    "use_direct_spawn": ("bool", False),
}
for _key, (_kind, _default) in _ACCEPTED.items():
    _SETTINGS[_key] = _Setting(_default, (), "Monarch's; accepted, governs nothing here", _kind, applied=False)
del _key, _kind, _default
_SETTINGS["default_encoding"] = _Setting(Encoding.Multipart, (), "Monarch's; accepted, governs nothing here",
                                         "encoding", applied=False)

_runtime: dict[str, Any] = {}
#: In a proc: the settings of the process that spawned it, as they were then (Monarch hands a
#: client's configuration down to the procs it spawns).  Below this process's own ``configure``.
_inherited: dict[str, Any] = {}
#: The environment variable that carries them to a proc (a JSON object; not secret).
INHERIT_ENV = "MONARCH_CLIENT_CONFIG"
_inherited_from = ""
_lock = threading.RLock()
_UNITS = {
    "ns": 1e-9, "nsec": 1e-9, "us": 1e-6, "usec": 1e-6, "µs": 1e-6, "ms": 0.001, "msec": 0.001, "millis": 0.001,
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0, "w": 604800.0, "week": 604800.0, "weeks": 604800.0,
    "month": 2630016.0, "months": 2630016.0, "y": 31557600.0, "year": 31557600.0, "years": 31557600.0,
}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-zµ]+)")
_FORMS = "use e.g. '30s', '5m', '1h 30m' or '250ms'"
#: How a duration is shown (as Monarch shows one: humantime's units, largest first, a month being
#: 30.44 days and a year 365.25 days, so "90s" reads "1m 30s"): (nanoseconds, singular, plural).
_SHOWN_UNITS = [(31_557_600 * 10**9, "year", "years"), (2_630_016 * 10**9, "month", "months"),
                (86_400 * 10**9, "day", "days"), (3_600 * 10**9, "h", "h"), (60 * 10**9, "m", "m"),
                (10**9, "s", "s"), (10**6, "ms", "ms"), (10**3, "us", "us"), (1, "ns", "ns")]


def _bad_duration(value: Any, why: str) -> ConfigValueError:
    # "Invalid duration format" is the phrase Monarch's error carries (its tests match on it).
    return ConfigValueError(f"Invalid duration format {value!r}: {why}; {_FORMS}")


def parse_duration(value: Any) -> float:
    """Seconds in ``value``: a number, or a humantime string such as "30s", "5m", "1h 30m", "250ms"."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip().lower()
        try:
            seconds = float(text)
        except ValueError:
            parts = _PART.findall(text)
            if not parts or _PART.sub("", text).strip() or any(u not in _UNITS for _, u in parts):
                raise _bad_duration(value, "not a number with a unit") from None
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        raise _bad_duration(value, "empty" if isinstance(value, str) else "not a duration")
    if seconds < 0 or seconds != seconds:
        raise ConfigValueError(f"a duration cannot be negative: {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """``seconds`` as Monarch shows a duration: "1m 30s", "1s 500ms", "14days", "0s"."""
    left = round(seconds * 1e9)
    parts = []
    for size, one, many in _SHOWN_UNITS:
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count}{one if count == 1 else many}")
    return " ".join(parts) or "0s"


def _strict_duration(key: str, value: Any) -> str:
    """A duration ``configure`` takes, as Monarch's does: a string with a unit (a bare number is
    refused, so "30" is not silently 30 seconds); stored as Monarch shows it."""
    if not isinstance(value, str):
        raise ConfigValueError(f"{key} takes a duration string such as '30s', not {value!r}")
    text = value.strip()
    try:
        float(text)
        raise _bad_duration(value, "a unit is needed, e.g. '30s' or '30ms'")
    except ValueError as e:
        if isinstance(e, ConfigValueError):
            raise
    return format_duration(parse_duration(value))


class BindSpec:
    """Where a channel binds, as Monarch's ``BindSpec``: any address of a transport
    (``BindSpec(ChannelTransport.Unix)``, ``BindSpec("tcp")``) or one explicit address
    (``BindSpec("tcp://127.0.0.1:8080")``).  ``default_transport`` shows one; monarch's own wire
    does not read it (see :func:`is_applied`)."""

    #: The transport names a bare string may give, and the address schemes an explicit one may use.
    _NAMES = {"tcp": "TcpWithHostname", "unix": "Unix", "tls": "Tls", "local": "Local", "quic": "Quic"}
    _SCHEMES = {"tcp": "tcp", "unix": "unix", "ipc": "unix", "tls": "tls", "metatls": "metatls", "quic": "quic"}

    __slots__ = ("transport", "address")

    def __init__(self, spec: Any) -> None:
        from monarch.actor._ids import ChannelTransport

        self.transport: Any = None
        self.address: tuple[str, str] | None = None
        if isinstance(spec, BindSpec):
            self.transport, self.address = spec.transport, spec.address
        elif isinstance(spec, ChannelTransport):
            self.transport = spec
        elif isinstance(spec, str):
            scheme, sep, rest = spec.partition("://")
            if spec in self._NAMES:
                self.transport = ChannelTransport[self._NAMES[spec]]
            elif spec.startswith("enum:") and spec[5:] in ChannelTransport.__members__:
                self.transport = ChannelTransport[spec[5:]]  # how a proc inherits one (for_procs_of)
            elif sep and scheme in self._SCHEMES and rest:
                self.address = (self._SCHEMES[scheme], rest)
            else:
                raise ValueError(f"not a bind spec: {spec!r} (a ChannelTransport, 'tcp', 'unix', or an "
                                 f"address such as 'tcp://127.0.0.1:8080')")
        else:
            raise TypeError(f"a BindSpec is made from a ChannelTransport, a BindSpec or a string, not {spec!r}")

    def _spec(self) -> str:
        """A string :class:`BindSpec` parses back to this one."""
        if self.address is not None:
            return f"{self.address[0]}://{self.address[1]}"
        return f"enum:{self.transport.name}"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BindSpec):
            return NotImplemented
        return (self.transport, self.address) == (other.transport, other.address)

    def __hash__(self) -> int:
        return hash((self.transport, self.address))

    #: How Monarch prints a transport (its runtime's text for one).
    _TEXT = {"TcpWithLocalhost": "tcp(Localhost)", "TcpWithHostname": "tcp(Hostname)",
             "MetaTlsWithHostname": "metatls(Hostname)", "MetaTlsWithIpV6": "metatls(IpV6)",
             "MetaQuicWithHostname": "metaquic(Hostname)", "MetaQuicWithIpV6": "metaquic(IpV6)",
             "Quic": "quic", "Tls": "tls", "Local": "local", "Unix": "unix"}

    def __str__(self) -> str:
        if self.address:
            return f"{self.address[0]}:{self.address[1]}"
        return self._TEXT.get(self.transport.name, self.transport.name.lower())

    def __repr__(self) -> str:
        return f"BindSpec({self._spec()!r})" if self.address else f"BindSpec(ChannelTransport.{self.transport.name})"

    def __reduce__(self) -> tuple:
        return BindSpec, (self._spec(),)


def _check(key: str) -> _Setting:
    setting = _SETTINGS.get(key)
    if setting is None:
        near = difflib.get_close_matches(key, _SETTINGS, n=3)
        hint = f"; did you mean {' or '.join(near)}?" if near else ""
        raise ValueError(f"invalid configuration key: {key!r}{hint} (get_global_config() lists them)")
    return setting


def _normal(key: str, setting: _Setting, value: Any) -> Any:
    """``value`` as stored for ``key``, or ConfigValueError naming the form it takes."""
    kind = setting.kind
    if kind == "duration?" and value is None:
        return None  # Monarch's "no such limit"
    if kind in ("duration", "duration?"):
        return _strict_duration(key, value)
    if kind == "bool":
        if isinstance(value, bool):
            return value
        raise ConfigValueError(f"{key} takes True or False, not {value!r}")
    if kind in ("int", "int?"):
        if value is None and kind == "int?":
            return None
        if isinstance(value, int):
            return int(value)
        raise ConfigValueError(f"{key} takes an integer{' or None' if kind == 'int?' else ''}, not {value!r}")
    if kind == "float":
        if isinstance(value, (int, float)):
            return float(value)
        raise ConfigValueError(f"{key} takes a number, not {value!r}")
    if kind == "str":
        if isinstance(value, str):
            return value
        raise ConfigValueError(f"{key} takes a string, not {value!r}")
    if kind == "transport":
        # Monarch's ChannelTransport enum, a BindSpec, a transport's name or an explicit address.
        try:
            return BindSpec(value)
        except TypeError:
            raise ConfigValueError(f"{key} takes a ChannelTransport, a BindSpec or a string, not {value!r}") from None
    if isinstance(value, Encoding):
        return value
    raise ConfigValueError(f"{key} takes a monarch.config.Encoding, not {value!r}")


def _effective(key: str) -> Any:
    return _effective_from(key)[0]


def _effective_from(key: str) -> tuple[Any, str]:
    """The value of ``key`` now, and the environment variable it came from ('' if from none)."""
    if key in _runtime:
        return _runtime[key], ""
    inherited = _load_inherited()
    if key in inherited:
        return inherited[key], ""
    setting = _SETTINGS[key]
    for name in setting.env:
        env = os.environ.get(name)
        if env:
            if setting.kind in ("int", "int?"):
                return (int(env) if env.strip().isdigit() else env), name
            return (env if not _is_number(env) else f"{env}s"), name
    return setting.default, ""


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def seconds(key: str) -> float:
    """The duration setting ``key`` as it applies now, in seconds (what the code a setting governs reads).

    A bad value in the environment (``MONARCH_SPAWN_TIMEOUT=soon``) raises ``ValueError`` here, when
    it is used, naming the forms a duration takes; it never breaks an import."""
    if _check(key).kind != "duration":
        raise ValueError(f"{key} is not a duration")
    with _lock:
        value, env = _effective_from(key)
    try:
        return parse_duration(value)
    except ConfigValueError as e:
        if not env:
            raise
        # Name the variable: the user set it, perhaps long ago, in another shell's profile.
        raise ConfigValueError(f"{env}={os.environ.get(env)!r} ({key}): {e}") from None


def limit(key: str) -> float | None:
    """Like :func:`seconds`, for a setting that also takes None (no limit): seconds, or None."""
    setting = _check(key)
    if setting.kind not in ("duration", "duration?"):
        raise ValueError(f"{key} is not a duration")
    with _lock:
        value = _effective(key)
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "")):
        return None
    return parse_duration(value)


def integer(key: str) -> int:
    """The integer setting ``key`` as it applies now; a bad value in the environment raises
    ``ValueError`` naming the variable when it is used."""
    if _check(key).kind != "int":
        raise ValueError(f"{key} is not an integer setting")
    with _lock:
        value, env = _effective_from(key)
    if isinstance(value, int):
        return value
    raise ConfigValueError(f"{env}={os.environ.get(env)!r} ({key}): takes an integer")


def is_applied(key: str) -> bool:
    """Whether ``key`` governs something in monarch (False: accepted for Monarch's sake, read by nothing)."""
    return _check(key).applied


def configure(**kwargs: Any) -> None:
    """Set runtime settings for this process (see the module docstring for the names).  An unknown
    key raises ``ValueError``, a value of the wrong form :class:`ConfigValueError`; either sets nothing."""
    with _lock:
        checked = {key: _normal(key, _check(key), value) for key, value in kwargs.items()}
        _runtime.update(checked)


def for_procs() -> str:
    """What a proc this process spawns inherits (the value of :data:`INHERIT_ENV`): the settings
    this process was given and those it set, so an actor sees its client's configuration."""
    with _lock:
        merged = {**_load_inherited(), **_runtime}
    return for_procs_of(merged)


def _load_inherited() -> dict[str, Any]:
    """The settings :data:`INHERIT_ENV` carries, read when it changes (a proc forked from a zygote
    gets its environment after this module was imported).  What this version does not know or
    cannot take is left out (a client of another version), never an error."""
    global _inherited_from
    text = os.environ.get(INHERIT_ENV) or ""
    if text == _inherited_from:
        return _inherited
    try:
        data = json.loads(text or "{}")
    except ValueError:
        data = {}
    fresh: dict[str, Any] = {}
    for key, value in (data.items() if isinstance(data, dict) else ()):
        setting = _SETTINGS.get(key)
        if setting is None:
            continue
        if setting.kind == "encoding" and isinstance(value, str) and value in Encoding.__members__:
            value = Encoding[value]
        try:
            fresh[key] = _normal(key, setting, value)
        except ValueError:
            continue
    _inherited.clear()
    _inherited.update(fresh)
    _inherited_from = text
    return _inherited


def _shown(value: Any) -> str:
    """A value as Monarch's config dump shows it (bools as 1/0, no value as '')."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, Encoding):
        return f"serde_{value.value}" if value is Encoding.Multipart else value.value
    return str(value)


def config_entries(env: dict[str, str], runtime: dict[str, Any]) -> list[dict[str, Any]]:
    """Every setting of a process whose environment (of :func:`env_names`) is ``env`` and whose own
    ``configure`` set ``runtime``, as the mesh admin API's ``GET /v1/config/{proc}`` shows them:
    ``name``, ``value``, ``default_value``, ``source`` (Default, Env, ClientOverride: its spawner's,
    Runtime), ``changed_from_default`` and ``env_var``, sorted by name."""
    from monarch._config_names import NAMES

    try:
        inherited = json.loads(env.get(INHERIT_ENV) or "{}")
    except ValueError:
        inherited = {}
    out = []
    for key, setting in _SETTINGS.items():
        name, _, monarch_env = NAMES.get(key, f"monarch::config::{key} ").partition(" ")
        envs = [*setting.env, *([monarch_env] if monarch_env and monarch_env not in setting.env else [])]
        if key in runtime:
            value, source = runtime[key], "Runtime"
        elif isinstance(inherited, dict) and key in inherited:
            value, source = inherited[key], "ClientOverride"
        elif any(env.get(n) for n in envs):
            value, source = next(env[n] for n in envs if env.get(n)), "Env"
        else:
            value, source = setting.default, "Default"
        out.append({"name": name, "value": _shown(value), "default_value": _shown(setting.default),
                    "source": source, "changed_from_default": _shown(value) != _shown(setting.default),
                    "env_var": envs[0] if envs else None})
    return sorted(out, key=lambda e: e["name"])


def env_names() -> list[str]:
    """The environment variables a process's settings come from (what :func:`config_entries` reads)."""
    from monarch._config_names import NAMES

    names = {INHERIT_ENV}
    for key, setting in _SETTINGS.items():
        names.update(setting.env)
        monarch_env = NAMES.get(key, "").partition(" ")[2]
        if monarch_env:
            names.add(monarch_env)
    return sorted(names)


def _runtime_plain() -> dict[str, Any]:
    """What ``configure`` set in this process, as plain values (a proc's answer to the admin API)."""
    with _lock:
        return json.loads(for_procs_of(_runtime))


def for_procs_of(values: dict[str, Any]) -> str:
    """``values`` as the JSON object :data:`INHERIT_ENV` carries (plain values only)."""
    plain = (str, int, float, bool, type(None))
    return json.dumps({k: v.name if isinstance(v, Encoding) else v._spec() if isinstance(v, BindSpec)
                       else v if isinstance(v, plain) else str(v)
                       for k, v in values.items()})


def _display(key: str, value: Any) -> Any:
    """``value`` of ``key`` as Monarch's get_global_config shows it: a duration in humantime's
    form ("1m 30s"), a transport as a :class:`BindSpec`.  A value that does not parse (a bad
    environment variable) is shown as given: :func:`seconds` names it when it is used."""
    kind = _SETTINGS[key].kind
    try:
        if kind in ("duration", "duration?") and value is not None:
            return format_duration(parse_duration(value))
        if kind == "transport":
            return BindSpec(value)
    except (TypeError, ValueError):
        pass
    return value


def get_global_config() -> dict[str, Any]:
    """Every setting as it applies now: defaults, then the environment, then ``configure``."""
    with _lock:
        return {key: _display(key, _effective(key)) for key in _SETTINGS}


def get_runtime_config() -> dict[str, Any]:
    """Only what ``configure`` set."""
    with _lock:
        return dict(_runtime)


def clear_runtime_config() -> None:
    """Forget what ``configure`` set (the environment and defaults apply again)."""
    with _lock:
        _runtime.clear()


@contextlib.contextmanager
def configured(**overrides: Any) -> Iterator[dict[str, Any]]:
    """Apply ``overrides`` for the block and yield the merged settings; the previous runtime
    settings come back afterwards (for the whole process: other threads see them too)."""
    with _lock:
        previous = get_runtime_config()
        configure(**overrides)
    try:
        yield get_global_config()
    finally:
        with _lock:
            clear_runtime_config()
            configure(**previous)


def parametrize_config(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """A pytest decorator: run the test once for every combination of the values given per key
    (``parametrize_config(stop_actor_timeout={"1s", "5s"}, enable_log_forwarding={True, False})``
    runs it four times), each run inside ``configured(...)`` with that combination."""
    keys = list(options)
    return _parametrize(keys, list(itertools.product(*(list(options[k]) for k in keys))))


def parametrize_config_pointwise(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """Like :func:`parametrize_config`, but the i-th run takes the i-th value of every key (the
    sequences are walked together, so they must be equally long)."""
    keys = list(options)
    lengths = {k: len(list(options[k])) for k in keys}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"parametrize_config_pointwise needs as many values for every key; got {lengths}")
    return _parametrize(keys, list(zip(*(list(options[k]) for k in keys))))


def _parametrize(keys: list[str], rows: list[tuple]) -> Callable[[Callable[..., Any]], Any]:
    import pytest

    if not keys:
        raise ValueError("name at least one setting to parametrize over")
    for row in rows:  # a typo'd key or a bad value fails when the test module loads, not in the run
        for key, value in zip(keys, row):
            _normal(key, _check(key), value)
    runs = [dict(zip(keys, row)) for row in rows]
    ids = ["-".join(f"{k}={v}" for k, v in run.items()) for run in runs]

    def decorate(fn: Callable[..., Any]) -> Any:
        sig = inspect.signature(fn)
        # pytest passes each run's settings as one more argument, which the test itself never sees.
        param = inspect.Parameter("_monarch_config", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def run(_monarch_config: dict, *args: Any, **kwargs: Any) -> Any:
                with configured(**_monarch_config):
                    return await fn(*args, **kwargs)
        else:
            @functools.wraps(fn)
            def run(_monarch_config: dict, *args: Any, **kwargs: Any) -> Any:
                with configured(**_monarch_config):
                    return fn(*args, **kwargs)
        run.__signature__ = sig.replace(parameters=[param, *sig.parameters.values()])  # type: ignore[attr-defined]
        return pytest.mark.parametrize("_monarch_config", runs, ids=ids)(run)
    return decorate


def _answer_admin() -> None:
    """Let the agents' layer (which cannot import this module) read these settings through its hooks:
    a proc agent's answer to the admin API's config question, and the settings the transport applies."""
    from monarch_agents import context, settings

    context.config_source = _runtime_plain
    settings.source = limit
    settings.int_source = integer


_answer_admin()

__all__ = ["BindSpec", "ConfigValueError", "Encoding", "parametrize_config", "parametrize_config_pointwise", "clear_runtime_config", "configure", "configured", "get_global_config",
           "get_runtime_config", "is_applied", "format_duration", "parse_duration", "seconds"]
