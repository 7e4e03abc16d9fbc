"""Monarch's API beyond meshes and endpoints (issue #26), each a program of ours in Monarch's API with
its expected output: identities, returns_future, tracing, the job's telemetry and admin services,
worker bootstrap.  ``api_names.py`` also runs on torchmonarch 0.7.0 when one is at hand
(``TORCHMONARCH_PYTHON``, a python with ``torchmonarch==0.7.0`` installed), and both must print
the same."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.compat.test_compat import HERE, run_program, without_admin_banner
from tests.helpers import ROOT

API_NAMES_OUT = """\
uid trainer<2J> trainer True False 100
uid round trip True True
singleton controller True
values ['<1>', '<a>', '<Z>', '<21>', '<JPwcyDCgEup>']
proc id trainer<2J> service 42
service id True
transports True
returns_future get 42
returns_future await 8 8
as_asyncio 10
traced 3 4
forwarder is a handler True
TelemetryConfig(retention_secs=3600, include_dashboard=False, dashboard_port=8265, snapshot_interval_secs=30.0)
MeshAdminConfig(admin_addr=None)
job state services None None None
timer count 1
patched fake
unpatched real
done
"""


def _torchmonarch_python() -> str | None:
    """``TORCHMONARCH_PYTHON``, else a ``.tm-venv`` at the checkout's root (ignored by git)."""
    py = os.environ.get("TORCHMONARCH_PYTHON") or os.path.join(ROOT, ".tm-venv", "bin", "python")
    return py if os.access(py, os.X_OK) else None


SEMANTICS_OUT = """\
same thread, init loop, endpoint loop: (True, False, False)
actor name: sync_actor
client name: root
as_endpoint plain: 42
as_endpoint coroutine: TypeError: sync_actor.not_an_endpoint_coro is an async def method, but its actor's endpoints are all def, so it has no event loop to run on
shadowing: ActorMesh has an attribute that collides with an endpoint name: attribute=stop
as_asyncio: (True, True)
as_asyncio off a loop: RuntimeError
host mesh sent to an actor: cannot shut down `HostMesh` that is a reference instead of owned
unpickled host mesh: cannot shut down `HostMesh` that is a reference instead of owned
BaseException: ['SupervisionError', "Endpoint call fragile.interrupt() failed, The actor <root>.<__main__.Fragile fragile{'gpus': 0/1}> and all its descendants have failed:"]
SIGSEGV: ['SupervisionError', "Endpoint call doomed.segfault() failed, The actor <root>.<__main__.Fragile doomed{'gpus': 0/1}> and all its descendants have failed:", '  the process this actor was running on failed: Killed(sig=11)']
hook kinds: <class 'MismatchedCleanup'> has async endpoints, but a synchronous __cleanup__
batch steps: [1, 2]
after its stop: ['SupervisionError']
done
"""

STOP_OWN_PROCS_OUT = """\
both answer: 2 2
first stopped, second's procs unchanged: True
first after its stop: SupervisionError
stopping a slice: ValueError
slice's stop stopped nothing: True
done
"""

PROC_MESH_READY_OUT = """\
ready, first look: True
ready, second look: True
ready, a slice: True
spawn_procs returned a mesh
broken, first look: ActorError (names its cause: True)
broken, second look: ActorError (names its cause: True)
broken, used: ActorError (names its cause: True)
ready still works: [7, 7]
done
"""

FAILED_MESHES_OUT = """\
spawn on a failed mesh returned: ActorMesh
initialized: ActorError (names its cause: True)
call: ActorError (names its cause: True)
call_one: ActorError (names its cause: True)
stream: ActorError (names its cause: True)
broadcast: dropped
stop: ActorError (names its cause: True)
faults so far: 0
nested proc killed: the report names a proc's actor: True
nested proc killed: the report names the signal: True
abort(None): the report says why: True
abort('out of patience'): the report says why: True
done
"""

PRIVATE_PATHS_OUT = """\
private names missing: []
the client's instance is an Instance: True
buffer writes: 10 6 16
frozen: 0 16 b'yel' 13 b'low\\nsubmarine' b''
the same objects as the public ones: True True True
answers through its own port: concurrent True plain False
spawn callbacks saw: 1 True
done
"""

ACTOR_KINDS_OUT = """\
async endpoints: __init__ on a loop, a task it started ran: (True, 1)
def endpoints: __init__ on a loop: False
quiet: __init__ on a loop True
quiet: async __cleanup__ awaited True
done
"""

SUPERVISE_WHILE_WAITING_OUT = """\
supervised while the endpoint waited (names the child, names its exception): [(True, True)]
done
"""

INSTRUMENT_VALUES_OUT = """\
Counter [(5, {'step': '3', 'phase': 'warmup'}), (10, None)]
UpDownCounter [(7, {'step': '3', 'phase': 'warmup'}), (-3, None)]
"""

PORT_FORWARD_FLOW_OUT = """\
a client that drops its connection drops the server's
two sources on one address echo: True
a bad port of one point: ActorError
the forwarder still forwards: True
done
"""

INIT_NEVER_RETURNS_OUT = """\
spawned from the blocked __init__: 42
stopping it returned
done
"""

STOP_WAITS_OUT = """\
round 0: 4 procs, any left after stop: False
round 1: 4 procs, any left after stop: False
round 2: 4 procs, any left after stop: False
done
"""

CREATOR_NAMES_OUT = """\
spawned by the client: ('root', '<root>')
spawned by an actor: ('parent', '<root>.<__main__.Parent parent>')
a function using monarch.actor.config pickles: True
"""

CONFIG_VALUES_OUT = """\
duration '45s' -> '45s'
duration '90s' -> '1m 30s'
duration '1h30m' -> '1h 30m'
duration '1h 30m' -> '1h 30m'
duration '3661s' -> '1h 1m 1s'
duration '1500ms' -> '1s 500ms'
duration '120m' -> '2h'
duration '2 weeks' -> '14days'
duration '40d' -> '1month 9days 13h 26m 24s'
duration '0s' -> '0s'
duration '7200s' -> '2h'
refused '30': TypeError True
refused 'soon': TypeError True
refused 'abc123': TypeError True
refused '': TypeError True
refused '-5s': TypeError True
refused 30: TypeError False
refused 2.5: TypeError False
refused None: TypeError False
default message_delivery_timeout '30s'
default message_ack_time_interval '500ms'
default get_proc_state_max_idle '1m'
default supervision_watchdog_timeout '2m'
default split_max_buffer_age '50ms'
default cleanup_timeout '3s'
default transport is unix: True
transport 'TcpWithLocalhost': True False tcp(Localhost)
transport 'tcp': True False tcp(Hostname)
transport 'unix': True True unix
transport 'tcp://127.0.0.1:8080': True False tcp:127.0.0.1:8080
transports print as: [('ChannelTransport.TcpWithLocalhost', 'tcp(Localhost)'), ('ChannelTransport.MetaTlsWithIpV6', 'metatls(IpV6)'), ('ChannelTransport.Quic', 'quic'), ('ChannelTransport.Unix', 'unix')]
tcp address differs from another: False
transport refused 'random_string': ValueError False
transport refused 'invalid://scheme': ValueError False
transport refused 42: TypeError False
transport refused {}: TypeError False
after: unix again True
transports pickle: True
done
"""

SHAPES_OUT = """\
grid Slice { offset: 2, sizes: [3, 4], strides: [8, 2] } ndim 2 len 12
ranks [2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24]
rank 12 at [1, 1] position 5 position 5 is 12
item [2, 3] 24 items 3:9:2 (8, 12, 16) item 11 24
rank 3 -> ValueError value 3 not in slice
position 12 -> ValueError index 12 out of range 12
item 12 -> IndexError index 12 out of range 12
item with one coordinate -> IndexError invalid dims: expected 2, got 1
overlapping strides -> ValueError nonunique strides
stride inside the space before -> ValueError stride 3 must be larger than size of previous space 4
strides that do not nest -> ValueError nonrectangular shape
one stride short -> ValueError invalid dims: expected 2, got 1
negative offset -> OverflowError can't convert negative int to unsigned
runs of ranks [Slice { offset: 1, sizes: [3], strides: [2] }, Slice { offset: 6, sizes: [2], strides: [1] }, Slice { offset: 9, sizes: [2], strides: [11] }]
row major Slice { offset: 0, sizes: [2, 3, 4], strides: [12, 4, 1] } is NDSlice True
row major of no dimensions Slice { offset: 0, sizes: [], strides: [] } [0] one Slice { offset: 0, sizes: [5], strides: [1] }
equal and hash alike True True False
pickles True ((), {'offset': 2, 'sizes': [3, 4], 'strides': [8, 2]})
shape {host=2,gpu=3,port=4} Shape { labels: ["host", "gpu", "port"], slice: Slice { offset: 0, sizes: [2, 3, 4], strides: [12, 4, 1] } } 24
rank 17 at {'host': 1, 'gpu': 1, 'port': 1} extent {host: 2, gpu: 3, port: 4} True
gpu 2 ['host', 'port'] Slice { offset: 8, sizes: [2, 4], strides: [12, 1] } [8, 9, 10, 11, 20, 21, 22, 23]
odd ports ['host', 'gpu', 'port'] Slice { offset: 1, sizes: [2, 3, 2], strides: [12, 4, 2] } [1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23]
host 1, gpu 0 [12, 13, 14, 15]
ext {gpu=3,port=2} Slice { offset: 4, sizes: [2, 2, 4], strides: [12, 4, 1] }
at a missing dimension -> ValueError invalid labels `["rack"]`
at gpu 3 -> ValueError out of range 3:4:1 for dimension gpu of size 3
at gpu -1 -> OverflowError can't convert negative int to unsigned
select past the end -> ValueError out of range 3:3:1 for dimension gpu of size 3
select nothing -> ValueError empty range 2:1:1
rank 24 -> ValueError value 24 not in slice
labels and sizes differ -> ValueError label slice dimension mismatch: 1 != 2
ext missing dimension -> TypeError Shape does not have dimension labeled 'rack'
ext gpu 5 -> IndexError index out of range
a shape does not hash
unity {} 1 [0]
equal True False False
pickles True
region ['host', 'gpu', 'port'] Slice { offset: 1, sizes: [2, 3, 2], strides: [12, 4, 2] } True {'host': 1, 'gpu': 0, 'port': 1}
mesh 24 {'host': 4, 'gpu': 6} 6 24 {host: 4, gpu: 6}
split Slice { offset: 0, sizes: [2, 2, 2, 3], strides: [12, 6, 3, 1] }
rename {dp=4,gpu=6} flatten Slice { offset: 0, sizes: [24], strides: [1] }
cut [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22]
flatten a sparse mesh -> ValueError cannot flatten sparse mesh: ndslice.strides=[6, 2] != dense_strides=[3, 1]
split two unknowns -> ValueError Cannot infer size of ('a', 'b') because both b and a have unknown size. Specify at least one as argument, e.g. b=4
split unevenly -> ValueError Dimension 'gpu' of size 6 is not evenly divided by ('a', 'b') with sizes ('?', 4)
split to a name in use -> ValueError Duplicate dimension name 'gpu'
unused size -> ValueError unused size constraints: ('zz',)
split into a string -> ValueError expected a sequence of dimensions, but got 'dp'
size of a missing dimension -> KeyError "Grid{host=4,gpu=6} does not have dimension 'rack'"
done
"""

PYTHON_TASKS_OUT = """\
from_coro get: 3
from_coro awaited: 4
from_coro raised: from the coroutine
accumulate: 6 [1, 2, 3] 42
task in a task: (7, 2, 3)
shared, twice: (7, 2, 3) (7, 2, 3) (7, 2, 3)
from_value: 9
select_one: (0, 1)
the loser still finishes: 2
with_timeout: TimeoutError
client context is one object: True
context through spawn: True True
done
"""

FRAME_LIMIT_OUT = """\
limit 2097152 passes: 1048576
limit 1048576
small call: 3
a 1 MiB call was refused: SupervisionError
the hook heard of it: True
default limit 10737418240
"""

MESH_GEOMETRY_OUT = """\
hosts ['hosts'] 0 [4] [1]
labels ('hosts',) stream_logs False
native region is the mesh's True True
odd hosts ['hosts'] 1 [2] [2]
odd extent ['hosts'] [2]
one host by slice() [] 2 [] []
pending True True
resolved cut ['hosts'] 3 [1] [1]
procs ['hosts', 'gpus'] 0 [2, 3] [3, 1]
proc labels ['hosts', 'gpus'] host mesh kept True
native procs ['hosts', 'gpus'] 0 [2, 3] [3, 1]
corner 1 [2, 2] [3, 1]
corner ranks [1, 2, 4, 5]
flattened HostMesh ['hosts'] [4]
a copy may not shut down: RuntimeError
a slice may not shut down: RuntimeError True
shut down lets go True
then spawn_procs: HostMesh has already been shut down
is a HostMesh True
done
"""

TASKS_AND_CONTEXT_OUT = """\
block_on 5
pending poll None
shared twice ['opened', 'opened'] poll opened
from_value 7
spawn_blocking 42
with_timeout in time
with_timeout TimeoutError
future before get []
future get 11 ['ran']
future raises from the coroutine
client context asked 20 times by 20 threads
same context True
done
"""

CLIENT_LOGS_OUT = """\
raw lines reach the redirected stdout: 2
one by one: ['0', '1']
complaint on stderr, one by one: ['0', '1']
below the level: []
aggregated: ['[6 similar log lines] grouped line']
window header and footer: True True
client record: ['[actor=<root>] from the client']
done
"""

LOGIN_JOB_OUT = """\
meshes: 2 1
state tuple: [('ProcessState', True), ('ProcessState', True), ('ProcessState', True)]
trainers: ['hello you from 0', 'hello you from 1', 'hello you from 2', 'hello you from 3']
server: hello me from 0
can run the same meshes: True other meshes: False
batch mode: RuntimeError
workers ended: [-9, -9, -9]
done
"""

ATTACH_UNREACHABLE_OUT = """\
returned: HostMesh
first look: RuntimeError True True
second look: RuntimeError True True
done
"""

GIL_HOLD_OUT = """\
before: 1
returns before the hold: True
answers after the hold: True
another thread stood still for the hold: True
done
"""

SPAWN_ADMIN_OUT = """\
says where it listens: True
bound where configured: True True
MONARCH_ADMIN_URL: True
root answers: 200 has children: True
no host meshes: _spawn_admin requires at least one HostMesh
done
"""

HOST_EQUALITY_OUT = """\
a slice equals itself made again: True
two hosts differ: True
actors see their host: True
hashable: False
done
"""

BOTH = {"actor_kinds.py": ACTOR_KINDS_OUT, "creator_names.py": CREATOR_NAMES_OUT, "stop_waits.py": STOP_WAITS_OUT, "init_never_returns.py": INIT_NEVER_RETURNS_OUT, "port_forward_flow.py": PORT_FORWARD_FLOW_OUT, "instrument_values.py": INSTRUMENT_VALUES_OUT, "supervise_while_waiting.py": SUPERVISE_WHILE_WAITING_OUT, "api_names.py": API_NAMES_OUT, "semantics.py": SEMANTICS_OUT, "stop_own_procs.py": STOP_OWN_PROCS_OUT,
        "proc_mesh_ready.py": PROC_MESH_READY_OUT, "failed_meshes.py": FAILED_MESHES_OUT,
        "private_paths.py": PRIVATE_PATHS_OUT, "config_values.py": CONFIG_VALUES_OUT,
        "shapes.py": SHAPES_OUT, "python_tasks.py": PYTHON_TASKS_OUT, "frame_limit.py": FRAME_LIMIT_OUT,
        "mesh_geometry.py": MESH_GEOMETRY_OUT, "tasks_and_context.py": TASKS_AND_CONTEXT_OUT,
        "client_logs.py": CLIENT_LOGS_OUT, "login_job.py": LOGIN_JOB_OUT,
        "attach_unreachable.py": ATTACH_UNREACHABLE_OUT, "spawn_admin.py": SPAWN_ADMIN_OUT,
        "host_equality.py": HOST_EQUALITY_OUT,
        "gil_hold.py": GIL_HOLD_OUT}


PROC_DEATH_MESHES_OUT = """\
client heard: ['alpha', 'beta']
a later call: SupervisionError Endpoint call alpha.pid() failed, The actor <root>.<__main__.Victim alpha{'gpus': 1/2}> and all its descendants have failed:
owner heard: ['kids', 'pets']
client heard nothing more: True
done
"""
BOTH["proc_death_meshes.py"] = PROC_DEATH_MESHES_OUT

FLUSH_ALL_LOGS_OUT = """\
active: True
before flush: ['flushed line', 'flushed line']
after flush: ['flushed line', 'flushed line', '\\x1b[33m[2 similar log lines]\\x1b[0m [r] flushed line']
"""
BOTH["flush_all_logs.py"] = FLUSH_ALL_LOGS_OUT

CLIENT_METRIC_SUMS_OUT = """\
query_engine: None
monarch delta True {'route': 'a'} 2
monarch delta True {'route': 'b'} 3
"""
BOTH["client_metric_sums.py"] = CLIENT_METRIC_SUMS_OUT

SENT_FROM_ACTOR_OUT = """\
target mesh shape: {'inner': {'labels': ['hosts', 'gpus'], 'sizes': [1, 3]}}
sent by the caller: True
  view_json: ['hosts'] 1 [1]
  shape_json: ['hosts'] 1 [1]
"""
BOTH["sent_from_actor.py"] = SENT_FROM_ACTOR_OUT


VALUE_MESHES_OUT = """\
negative and junk items TypeError TypeError OverflowError
selection Union(All(Range(Range(0, Some(4), 2), True)), Range(Range(1, Some(2), 1), Any(True))) All(True) Any(True)
selection nests All(All(Union(Range(Range(0, Some(2), 1), True), Range(Range(6, None, 1), True)))) Intersection(Range(Range(0, Some(1), 1), True), Range(Range(1, None, 3), True))
selection refused ValueError ValueError
value mesh 3 ['a', 'b', 'c'] c ValueError True
from_indexed ['x', 'y', 'w'] ValueError
strided [2, 4] 3 ValueError {'a': 2, 'b': 2}
answers True True True [0, 1, 2, 3, 4, 5]
split {'pairs': 3, 'two': 2} [1, 3, 5] 4 3
renamed {'ranks': 6} sliced then flattened [3, 4, 5]
refused ValueError IndexError TypeError AttributeError
pickled [2, 3]
done
"""
BOTH["value_meshes.py"] = VALUE_MESHES_OUT

TOOLS_HELPERS_OUT = """\
ipv4 literal 127.0.0.1:8080 127.0.0.1
ipv6 literal [::1]:8080 ::1
ipv4 asked of an ipv6 literal RuntimeError
link-local skipped RuntimeError RuntimeError
this host resolves True
types ['Default', 'IPv4', 'IPv6']
MONARCH_HOME home home/conda-pack/out True True
no conda None None AssertionError
conda train-py3 /opt/conda/envs/train-py3 /x
equal True False False
done
"""
BOTH["tools_helpers.py"] = TOOLS_HELPERS_OUT

TOOLS_CLI_OUT = """\
exec hosts=1 ['A=1', 'B=2'] ['--', 'echo', 'hi'] False None False None False None None
exec -m pkg.mod ['x']
shell trainers None [] None False
apply None
kill other
query SELECT 1 jsonl 1.5 None
profile None None 120.0 None
debug 123
context rm x
refused exec 2
refused profile 2
refused tui 2
refused query 2
(0, 'No contexts.\\n')
(0, "Created context 'scratch'\\n")
scratch is a folder True
(0, "Switched to context 'work'\\n")
link True work/state.pkl b'placeholder'
(0, '  default\\n  scratch\\n* work\\n')
(0, "Removed context 'work'\\n")
link default/state.pkl False
(0, "Removed context 'scratch'\\n")
(0, "Removed context 'default'\\n")
(0, 'Job is ready (Ns)\\n')
spec onejob.job
(0, 'from of\\n')
(3, '')
(0, "Killed context 'default'\\n")
state left False
done
"""
BOTH["tools_cli.py"] = TOOLS_CLI_OUT

AUTO_RELOAD_OUT = """\
nothing changed: []
changed: ['early_mod', 'late_mod'] reload called for ['early_mod', 'late_mod']
values: early 2 late 2 steady
again, nothing: []
closed hook, untracked: [] after 1
done
"""
BOTH["auto_reload.py"] = AUTO_RELOAD_OUT

PROC_BOOTSTRAP_OUT = """\
one command: ['red', 'red']
next spawn without it: ''
one per proc: ['shade0', 'shade1', 'shade2']
wrapped: True inner wrapped again: True
this_host in actors: [([], 0, []), ([], 1, []), ([], 2, [])]
cut to its own: [(['hosts'], 0, ''), (['hosts'], 1, ''), (['hosts'], 2, '')]
done
"""
BOTH["proc_bootstrap.py"] = PROC_BOOTSTRAP_OUT

ADMIN_FAILURES_OUT = """\
admin url is http(s): True
work [1, 1]
crash reported: SupervisionError
fault hook ran: True
poisoned proc counts it: True and lists it: True
status says failed: True
failure_info: True True False
done
"""
BOTH["admin_failures.py"] = ADMIN_FAILURES_OUT

ADMIN_OWN_PROCS_OUT = """\
neighbour ready: ['ready'] 2
own procs answer: 2
nested proc answers: True
procs listed: 3
done
"""
BOTH["admin_own_procs.py"] = ADMIN_OWN_PROCS_OUT

MPSC_WAKER_OUT = """\
Receiver[int] is Receiver: True
woken before any wait: True
wait sees it: True
still set: True
woken from a thread: True
a wake is not lost to a clear: True
other loop: RuntimeError
empty: None
in order: [1, 2, 3]
from a thread: [10, 11, 12, 13, 14]
done
"""
BOTH["mpsc_waker.py"] = MPSC_WAKER_OUT

MOCK_REGISTRY_OUT = """\
empty: 0 {}
while patched: True True True
after: 0 True copy kept: True True
state put back: True 1
spawned after the state is put back: fake
an empty state adds nothing, removes nothing: True 1
done
"""
BOTH["mock_registry.py"] = MOCK_REGISTRY_OUT

REMOTE_MOUNT_OUT = """\
paths ['/', '/main.py', '/pkg', '/pkg/model.py', '/train.py', '/weights.bin']
root ['main.py', 'pkg', 'train.py', 'weights.bin'] True
link train.py False
small files first True True
code blocks [0]
unchanged index is equal True
moved ['/pkg/model.py'] True
stale block True True ['/pkg/model.py']
past the end ValueError
waiting read faulted [0] True
woken read {'a': b'hello'}
stale file EIO
modes 0o100444 ['a.txt', 'b.txt']
unmounted True
listing ['config.json', 'weights.bin']
big file read on demand True
before b'{"lr": 0.1}'
open file after refresh b'{"lr": 0.01}'
listing ['config.json', 'new.txt', 'weights.bin']
closed, mounted: False
done
"""
BOTH["remote_mount.py"] = REMOTE_MOUNT_OUT
PROC_POISONING_OUT = """\
before: returned [1, 1]
fragile[0] dies: SupervisionError (RuntimeError: True, spawn error: False, poisoned: False)
faults: 1
echo still answers: returned [2, 2]
spawn on both procs, initialized: RuntimeError (RuntimeError: True, spawn error: True, poisoned: True)
spawn on both procs, call: RuntimeError (RuntimeError: True, spawn error: True, poisoned: True)
spawn on the poisoned proc: RuntimeError (RuntimeError: True, spawn error: True, poisoned: True)
spawn on the healthy proc: returned None
its call: returned [4]
after a failed __init__: RuntimeError (RuntimeError: True, spawn error: True, poisoned: True)
local dies: SupervisionError (RuntimeError: True, spawn error: False, poisoned: False)
spawn on the client's proc: RuntimeError (RuntimeError: True, spawn error: True, poisoned: True)
faults: 3
stop: returned None returned None
done
"""
BOTH["proc_poisoning.py"] = PROC_POISONING_OUT

UNDELIVERABLE_OUT = """\
careful: sent
envelope: sender, destination, reason: (True, True, True)
careful goes on: sent
faults: 0
done
"""
BOTH["undeliverable.py"] = UNDELIVERABLE_OUT

ADMIN_BANNER_OUT = """\
says where it listens: True
answers there: 200
done
"""
BOTH["admin_banner.py"] = ADMIN_BANNER_OUT

LATE_ANSWER_OUT = """\
ready: [1, 1]
calls out: 3
tracebacks at the stop: 0
done
"""
BOTH["late_answer.py"] = LATE_ANSWER_OUT

ADMIN_ACTOR_NAMES_OUT = """\
answers: [1, 1]
procs found by their actors' names: 2
each one's page: True
done
"""
BOTH["admin_actor_names.py"] = ADMIN_ACTOR_NAMES_OUT

INSTANCE_PROC_OUT = """\
proc_id is a str: True as its actor_id says: True a sibling's is the same: True
proc_id is a str: True as its actor_id says: True a sibling's is the same: True
ranks' procs differ: True
done
"""
BOTH["instance_proc.py"] = INSTANCE_PROC_OUT

FETCH_MODULE_OUT = """\
same as monarch's: True True
shard of gpus=1: [1.0, 2.0, 3.0, 4.0]
inspect gpus=0: [1.0, 2.0, 3.0, 4.0]
done
"""
BOTH["fetch_module.py"] = FETCH_MODULE_OUT

ENGINE_EXIT_OUT = """\
engine 0 [1.0, 1.0]
engine 1 [2.0, 2.0]
engine 2 [3.0, 3.0]
procs still answer: [1, 1]
done
"""
BOTH["engine_exit.py"] = ENGINE_EXIT_OUT

GET_ON_LOOP_OUT = """\
get on a running loop: 1 True
await: 2 False
spawn_procs on a running loop warns: False
get with no loop: 3 False
done
"""
BOTH["get_on_loop.py"] = GET_ON_LOOP_OUT


@pytest.mark.parametrize("program", sorted(BOTH))
def test_program_prints_what_monarch_prints(program, tmp_path, no_leaked_processes):
    r = run_program(program, tmp_path)
    assert r.stdout == BOTH[program]


@pytest.mark.parametrize("program", sorted(BOTH))
def test_program_prints_the_same_on_torchmonarch(program, tmp_path):
    py = _torchmonarch_python()
    if py is None:
        pytest.skip("torchmonarch 0.7.0 is not installed here: set TORCHMONARCH_PYTHON to a python with "
                    "torchmonarch==0.7.0 (python3 -m venv tm && tm/bin/pip install torchmonarch==0.7.0)")
    e = {k: v for k, v in os.environ.items() if not k.startswith(("MONARCH", "PYTHONPATH"))}
    r = subprocess.run([py, os.path.join(HERE, program)], cwd=tmp_path, env=e, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == BOTH[program]


UNHANDLED_FAULT_OUT = "hook saw: MeshFailure\nmain thread interrupted\natexit handler ran\n"


def _check_interrupted_exit(r: subprocess.CompletedProcess, stdout: str, error: str) -> None:
    """The client ended through a KeyboardInterrupt in its main thread, after printing ``stdout``;
    its stderr has the failure's ``error``."""
    # Python ends with the KeyboardInterrupt's status (SIGINT: -2 from subprocess, 130 from a shell).
    assert r.returncode in (-2, 130), (r.returncode, r.stderr[-3000:])
    assert r.stdout == stdout, r.stderr[-3000:]
    assert "KeyboardInterrupt" in r.stderr and error in r.stderr


@pytest.mark.parametrize("which", ["monarch", "torchmonarch"])
def test_a_hook_that_raises_ends_the_client_through_its_main_thread(which, tmp_path, no_leaked_processes):
    py, e = _shell_python(which)
    r = subprocess.run([py, os.path.join(HERE, "unhandled_fault.py")], cwd=tmp_path, env=e, capture_output=True,
                       text=True, timeout=300)
    _check_interrupted_exit(r, UNHANDLED_FAULT_OUT, "no caller waits for this")


DEFAULT_HOOK_OUT = "spawned\nmain thread interrupted\natexit handler ran\n"


@pytest.mark.parametrize("which", ["monarch", "torchmonarch"])
def test_the_default_hook_ends_the_client_through_its_main_thread(which, tmp_path, no_leaked_processes):
    py, e = _shell_python(which)
    r = subprocess.run([py, os.path.join(HERE, "default_fault_hook.py")], cwd=tmp_path, env=e,
                       capture_output=True, text=True, timeout=300)
    # Monarch's default hook exits, which leaves the failure unhandled: a KeyboardInterrupt in the main thread.
    _check_interrupted_exit(r, DEFAULT_HOOK_OUT, "a broadcast nobody waits on")
    if which == "monarch":  # our own line (Monarch's words differ)
        assert "the unhandled_fault_hook raised SystemExit(1)" in r.stderr, r.stderr[-3000:]


def _shell_python(which: str) -> tuple[str, dict]:
    if which == "monarch":
        e = {**os.environ, "PYTHONPATH": ROOT}
        e.pop("MONARCH_JOB", None)
        return sys.executable, e
    py = _torchmonarch_python()
    if py is None:
        pytest.skip("torchmonarch 0.7.0 is not installed here: set TORCHMONARCH_PYTHON")
    return py, {k: v for k, v in os.environ.items() if not k.startswith(("MONARCH", "PYTHONPATH"))}


@pytest.mark.parametrize("which", ["monarch", "torchmonarch"])
def test_shell_eof_stops_the_shell_and_its_foreground_command(which, tmp_path, no_leaked_processes):
    py, e = _shell_python(which)
    # Without the hang-up, `sleep 300` would outlive the 180 s this waits, and the test fails.
    r = subprocess.run([py, os.path.join(HERE, "shell_eof.py")], cwd=tmp_path, env=e, input="sleep 300\n",
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.endswith("\nshell returned 129\n"), r.stdout[-2000:]


@pytest.mark.parametrize("which", ["monarch", "torchmonarch"])
def test_shell_raises_when_its_terminal_copy_breaks(which, tmp_path, no_leaked_processes):
    py, e = _shell_python(which)
    # stdin stays open (no EOF): only the broken output can end the shell.  Output goes to files:
    # a host agent the program starts may hold a pipe open long after the program ends.
    out_path, err_path = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out_path, "w") as out_f, open(err_path, "w") as err_f, \
            subprocess.Popen([py, os.path.join(HERE, "shell_broken_terminal.py")], cwd=tmp_path, env=e,
                             stdin=subprocess.PIPE, stdout=out_f, stderr=err_f) as p:
        try:
            p.wait(timeout=180)
        finally:
            p.kill()
    out, err = out_path.read_text(), err_path.read_text()
    assert p.returncode == 0, err[-3000:]
    assert out == "broken terminal: raised a ConnectionError: True\n"


JOB_SERVICES_OUT = """\
not enabled: None None None None
enabled: True True
calls: [6, 6, 6, 6]
actors: [{'n': 4}]
spans: [{'name': 'inner', 'n': 4}]
metrics: [{'name': 'units', 'v': 12.0, 'a': '{"kind": "test"}'}]
query_engine: None {'rows': [{'n': 2}]}
query client: {'rows': [{'n': 2}]}
root: ['Root'] 2 ['host:host0', 'host:host1'] None
host: ['Host'] 2 root
proc: ['Proc'] 1 True
actor: idle Worker 1 work
missing: 404 not_found
pyspy: ['Ok'] True
schema: True True
tree: 4
admin closed with the job
"""


def test_a_jobs_telemetry_and_mesh_admin_api(tmp_path, no_leaked_processes):
    r = run_program("job_services.py", tmp_path)
    assert without_admin_banner(r.stdout) == JOB_SERVICES_OUT


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_workers_started_by_hand_are_attached_used_and_shut_down(tmp_path, no_leaked_processes):
    e = {**os.environ, "PYTHONPATH": ROOT}
    r = subprocess.run([sys.executable, os.path.join(HERE, "workers.py"), *map(str, _free_ports(2))], cwd=tmp_path,
                       env=e, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == "{hosts: 2}\n['0/0 0', '0/1 0', '1/0 1', '1/1 1']\nworkers exited [0, 0]\n"


def test_hosts_from_config_starts_workers_and_shutdown_ends_them(tmp_path, no_leaked_processes):
    r = run_program("config_hosts.py", tmp_path)
    assert r.stdout == "same function: True\n{hosts: 2} ['0', '1']\nshut down\n"


@pytest.mark.parametrize("which", ["monarch", "torchmonarch"])
def test_attach_waits_for_workers_that_are_still_starting(which, tmp_path, no_leaked_processes):
    py, e = _shell_python(which)
    r = subprocess.run([py, os.path.join(HERE, "workers_starting.py"), *map(str, _free_ports(2))], cwd=tmp_path,
                       env=e, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == "ranks: [0, 1]\nshut down\n"


@pytest.mark.parametrize("which", ["monarch", "torchmonarch"])
def test_workers_at_ipc_addresses(which, tmp_path, no_leaked_processes):
    py, e = _shell_python(which)
    r = subprocess.run([py, os.path.join(HERE, "ipc_workers.py"), str(tmp_path)], cwd=tmp_path, env=e,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == "['hello from host 0', 'hello from host 1']\nshut down\n"


ATTACH_GATEWAY_OUT = """\
another address: True
remote: ['hello', 'hello']
local: from the client
remote to local: through the worker
done
"""


@pytest.mark.parametrize("which", ["monarch", "torchmonarch"])
def test_a_client_attached_through_a_workers_address(which, tmp_path, no_leaked_processes):
    py, e = _shell_python(which)
    r = subprocess.run([py, os.path.join(HERE, "attach_gateway.py"), str(tmp_path)], cwd=tmp_path, env=e,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == ATTACH_GATEWAY_OUT


@pytest.mark.parametrize("which", ["monarch", "torchmonarch"])
def test_a_process_job_whose_subclass_starts_its_workers(which, tmp_path, no_leaked_processes):
    py, e = _shell_python(which)
    r = subprocess.run([py, os.path.join(HERE, "own_workers_job.py"), str(tmp_path)], cwd=tmp_path, env=e,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == ("workers: ['trainers_0', 'trainers_1']\nranks: [(0, True), (1, True)]\n"
                        "worker ended: True\nworker ended: True\n")
    assert "unhandled failure" not in r.stderr  # its procs were stopped, not lost


@pytest.mark.parametrize("which", ["monarch", "torchmonarch"])
def test_workers_on_inherited_sockets(which, tmp_path, no_leaked_processes):
    py, e = _shell_python(which)
    r = subprocess.run([py, os.path.join(HERE, "fd_workers.py")], cwd=tmp_path, env=e, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == "['hello', 'hello']\nshut down\nworker exits: [0, 0]\n"


GATHER_CHANGES_OUT = """\
first reads: 'one\\n' 'version one, long\\n'
stat size: 4
appended line shows: True size 8
shorter replacement shows: True size 3
new file shows: True ['log.txt', 'new.txt', 'state.txt']
writing is refused: OSError
unmounted: True
"""


def _need_fuse() -> None:
    from monarch_rdmafs.mount import fuse_unavailable_reason

    why = fuse_unavailable_reason()
    if why:
        pytest.skip(f"gather_mount needs FUSE: {why}")


@pytest.mark.parametrize("which", ["monarch", "monarch, every change read at once", "torchmonarch"])
def test_gather_mount_shows_a_hosts_changes(which, tmp_path, no_leaked_processes):
    """A file its host appends to or replaces, and a new one, read as the host has them now.
    Monarch's hosts send change notices (within 50 ms); ours answers every stat and open afresh,
    so even a read right after the change sees it."""
    _need_fuse()
    args = ["at_once"] if "at once" in which else []
    if which == "torchmonarch":
        py = _torchmonarch_python()
        if py is None:
            pytest.skip("torchmonarch 0.7.0 is not installed here: set TORCHMONARCH_PYTHON")
        e = {k: v for k, v in os.environ.items() if not k.startswith(("MONARCH", "PYTHONPATH"))}
    else:
        py = sys.executable
        e = {**os.environ, "PYTHONPATH": ROOT}
        e.pop("MONARCH_JOB", None)
    r = subprocess.run([py, os.path.join(HERE, "gather_changes.py"), *args], cwd=tmp_path, env=e,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == GATHER_CHANGES_OUT
