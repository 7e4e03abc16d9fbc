"""The mesh admin API's routes beyond the tree walk (issue #26): ``/v1/openapi.json``, ``/SKILL.md``,
``/v1/config/{proc}``, ``POST /v1/pyspy_dump/{proc}`` and ``POST /v1/pyspy_profile_svg/{proc}``, in a
real job over real HTTP, with the status codes and error codes torchmonarch 0.7.0 answers."""

from __future__ import annotations

from tests.compat.test_compat import run_program

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
    assert r.stdout == MESH_ADMIN_OUT
