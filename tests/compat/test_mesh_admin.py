"""The mesh admin API's routes beyond the tree walk (issue #26): ``/v1/openapi.json``, ``/SKILL.md``,
``/v1/config/{proc}``, ``POST /v1/pyspy_dump/{proc}`` and ``POST /v1/pyspy_profile_svg/{proc}``, in a
real job over real HTTP, with the status codes and error codes torchmonarch 0.7.0 answers."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.compat.test_api_compat import _torchmonarch_python
from tests.compat.test_compat import HERE, run_program, without_admin_banner

MESH_ADMIN_OUT = """\
listens where configured: True
openapi: 200 application/json 3.1.0 True
refs resolve: True
every route answers: 13 True
skill: text/markdown; charset=utf-8 True
config: 200 application/json True 7s ClientOverride True
default: 30s Default HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT
dump: 200 36
stored: True [{'some': True}] [{'some': True}]
profile: 200 image/svg+xml True True
tree past mesh_admin_tree_timeout: 504 gateway_timeout
bad duration: 400 bad_request
bad rate: 400 bad_request
missing field: 400 bad_request
bad reference: 400 bad_request 400 bad_request 400 bad_request
no such proc: 404 not_found 404 not_found 404 not_found
"""


def test_openapi_config_stored_dumps_and_profiles_of_the_mesh_admin_api(tmp_path, no_leaked_processes):
    r = run_program("mesh_admin_api.py", tmp_path)
    assert without_admin_banner(r.stdout) == MESH_ADMIN_OUT


SHAPES_OUT = """\
openapi: 3.1.0 ['description', 'title', 'version'] True
operations: ['getAdminInfo', 'getAdminSchema', 'getConfig', 'getErrorSchema', 'getPyspy', 'getRoot', 'getSchema', \
'getTree', 'pyspyDumpAndStore', 'pyspyProfileSvg', 'queryProxy', 'resolveReference']
schemas: True
skill: text/markdown; charset=utf-8
config: 200 application/json ['changed_from_default', 'default_value', 'env_var', 'name', 'source', 'value'] True
delivery: 30s HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT bool
pyspy: 200 application/json [True]
profile, no duration: 400 application/json bad_request
config, not a proc: 400 application/json bad_request
pyspy, not a proc: 400 application/json bad_request
missing node: 404 application/json not_found
"""


def test_mesh_admin_shapes_as_monarchs_tools_read_them(tmp_path, no_leaked_processes):
    assert without_admin_banner(run_program("mesh_admin_shapes.py", tmp_path).stdout) == SHAPES_OUT


def test_mesh_admin_shapes_on_torchmonarch(tmp_path):
    """The same program on torchmonarch 0.7.0 prints the same (less the banner its admin server
    prints on stdout, as ours does)."""
    py = _torchmonarch_python()
    if py is None:
        pytest.skip("torchmonarch 0.7.0 is not installed here: set TORCHMONARCH_PYTHON")
    e = {k: v for k, v in os.environ.items() if not k.startswith(("MONARCH", "PYTHONPATH"))}
    r = subprocess.run([py, os.path.join(HERE, "mesh_admin_shapes.py")], cwd=tmp_path, env=e, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert without_admin_banner(r.stdout) == SHAPES_OUT
