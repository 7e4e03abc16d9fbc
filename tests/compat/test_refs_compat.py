"""References that travel (issue #26): ports, ids, and meshes pickled into messages or with plain
``pickle``, the job's controllers, and Monarch's debugger actor, each a program of ours in Monarch's API with its expected
output.  Each also runs on torchmonarch 0.7.0 when one is at hand (``TORCHMONARCH_PYTHON`` or a
``.tm-venv`` at the root), and both must print the same."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.compat.test_api_compat import _torchmonarch_python
from tests.compat.test_compat import HERE, run_program

OUT: dict[str, str] = {}

OUT["port_handoff.py"] = """\
courier posts, no client made: True
streamer posts, no client made: True
letters: ['from a courier', 'from a stream', 'from the client']
returned to the courier itself: [True]
returned to the streamer itself: [True]
boxes opened: 3
done
"""

OUT["actor_addresses.py"] = """\
printed: trainer.worker@inproc://3
names: trainer trainer trainer worker trainer worker
proc id: worker@inproc://3 root: True address: local:3
read back: True True local:3
another actor differs: True
port: trainer.worker:12@inproc://3 12 True
printed: trainer.worker@tcp://127.0.0.1:29500
names: trainer trainer trainer worker trainer worker
proc id: worker@tcp://127.0.0.1:29500 root: True address: tcp:127.0.0.1:29500
read back: True True tcp:127.0.0.1:29500
another actor differs: True
port: trainer.worker:12@tcp://127.0.0.1:29500 12 True
done
"""

OUT["mesh_refs.py"] = """\
fresh actor mesh as an argument: [1, 1]
fresh proc mesh as an argument: 101
fresh actor mesh returned: 11
fresh actor mesh in a value mesh: 0 11
fresh proc mesh returned: [6, 6]
plain pickle, fresh actor mesh: 21
plain pickle, same actors: 22
plain pickle, fresh proc mesh: 31
plain pickle, proc mesh in use: 41
done
"""

OUT["actor_ids.py"] = """\
names: ('worker', 'worker') uid name<v>: True pid is uid: True root: False proc names: (True, True) stable: True
names: ('worker', 'worker') uid name<v>: True pid is uid: True root: False proc names: (True, True) stable: True
ranks differ: True
same again: True
client: client client client
done
"""

OUT["debugger_actor.py"] = """\
stopped: [(True, 0, True, 0), (True, 1, True, 0), (True, 2, True, 0)]
printed by ranks 0 and 1: ['1', '11']
after stepping: [(0, 1), (1, 1), (2, 0)]
post-mortem: [(2, True, 3)]
post-mortem printed: ['23']
caller sees: ActorError True
done
"""
OUT["controller_first_from_actor.py"] = """\
counts as each worker reported: [1, 2, 3]
the client's tally saw: [10, 11, 12]
done
"""

#: Monarch's current behaviour where torchmonarch 0.7.0 is older (each program says how).
OURS_ONLY: dict[str, str] = {}

OURS_ONLY["debugger_source.py"] = """\
stopped in: True 4
stop line shown: True
listed: ['def triple_plus(x):', '    y = x * 3', '    breakpoint()', '    z = y + 1', '    return double(z)']
p y: ['12']
breakpoint set: True
stopped at it: 9 True
p x: ['13']
answer: 26
done
"""


@pytest.mark.parametrize("program", sorted(OUT) + sorted(OURS_ONLY))
def test_program_prints_what_monarch_prints(program, tmp_path, no_leaked_processes):
    r = run_program(program, tmp_path)
    assert r.stdout == {**OUT, **OURS_ONLY}[program]


@pytest.mark.parametrize("program", sorted(OUT))
def test_program_prints_the_same_on_torchmonarch(program, tmp_path):
    py = _torchmonarch_python()
    if py is None:
        pytest.skip("torchmonarch 0.7.0 is not installed here: set TORCHMONARCH_PYTHON")
    e = {k: v for k, v in os.environ.items() if not k.startswith(("MONARCH", "PYTHONPATH"))}
    r = subprocess.run([py, os.path.join(HERE, program)], cwd=tmp_path, env=e, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == OUT[program]
