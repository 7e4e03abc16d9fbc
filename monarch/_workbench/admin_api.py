"""The mesh admin API describing itself: ``GET /v1/openapi.json`` and ``GET /SKILL.md``.

The OpenAPI 3.1 document lists every route ``job_services.JobServer`` answers, with the JSON
Schemas of its bodies under ``components/schemas`` (by the names Monarch's document uses, so a
tool written against Monarch's finds them); the operation ids are Monarch's too.  Ours, written
from what our server does: a test checks that every route it lists answers, and that every
``$ref`` resolves.
"""

from __future__ import annotations

import copy
from typing import Any

_ERR = {"$ref": "#/components/schemas/ApiErrorEnvelope"}
_PROC_PARAM = {"name": "proc_reference", "in": "path", "required": True, "schema": {"type": "string"},
               "description": "a proc reference (proc:HOST/PID, a child of a host node), percent-encoded"}
_WHY = {
    "400": "Bad request (a malformed reference or body)",
    "404": "No such node, or the proc is gone",
    "500": "Internal error (the work ran and failed)",
    "503": "py-spy is not installed on the proc's host",
    "504": "The host did not answer in time",
}


def _obj(required: list[str], props: dict[str, Any], title: str, doc: str) -> dict:
    return {"title": title, "description": doc, "type": "object", "required": required, "properties": props}


def _schemas() -> dict[str, Any]:
    from monarch._workbench.job_services import _ADMIN_SCHEMA, _ERROR_SCHEMA, _NODE_SCHEMA

    def bare(schema: dict) -> dict:
        s = copy.deepcopy(schema)
        s.pop("$schema", None)  # only valid at a JSON Schema document's root, not in components
        s.pop("$id", None)
        return s

    s_str, s_int, s_bool = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}
    frame = _obj(["name", "filename", "line"], {
        "name": s_str, "filename": s_str, "line": s_int, "is_entry": s_bool,
        "module": {"type": ["string", "null"]}, "short_filename": {"type": ["string", "null"]},
        "locals": {"type": ["array", "null"]}}, "PySpyFrame", "One frame; the first of a thread is its innermost.")
    trace = _obj(["pid", "thread_id", "frames"], {
        "pid": s_int, "thread_id": s_int, "thread_name": {"type": ["string", "null"]},
        "os_thread_id": {"type": ["integer", "null"]}, "active": s_bool, "owns_gil": s_bool,
        "frames": {"type": "array", "items": {"$ref": "#/components/schemas/PySpyFrame"}}},
        "PySpyStackTrace", "One thread's stack.")
    result = {"title": "PySpyResult", "description": "A proc's Python stacks: one of Ok, BinaryNotFound, Failed.",
              "oneOf": [
                  _obj(["Ok"], {"Ok": _obj(["pid", "binary", "capture_mode", "stack_traces", "warnings"], {
                      "pid": s_int, "binary": s_str, "capture_mode": {"enum": ["python_only", "native", "native_all"]},
                      "stack_traces": {"type": "array", "items": {"$ref": "#/components/schemas/PySpyStackTrace"}},
                      "warnings": {"type": "array", "items": s_str}}, "Ok", "the stacks")}, "Ok", "py-spy read it"),
                  _obj(["BinaryNotFound"], {"BinaryNotFound": _obj(["searched"], {
                      "searched": {"type": "array", "items": s_str}}, "BinaryNotFound", "where py-spy was looked for")},
                       "BinaryNotFound", "py-spy is not installed on the proc's host"),
                  _obj(["Failed"], {"Failed": _obj(["pid", "binary", "stderr"], {
                      "pid": s_int, "binary": s_str, "exit_code": {"type": ["integer", "null"]}, "stderr": s_str},
                      "Failed", "what py-spy said")}, "Failed", "py-spy ran and could not read the proc"),
              ]}
    opts = _obj(["duration_s", "rate_hz", "native", "threads", "nonblocking"], {
        "duration_s": {"type": "integer", "minimum": 1,
                       "description": "whole seconds, at most mesh_admin_pyspy_max_profile_duration"},
        "rate_hz": {"type": "integer", "minimum": 1, "maximum": 1000}, "native": s_bool, "threads": s_bool,
        "nonblocking": s_bool}, "PySpyProfileOpts", "How to sample: py-spy record's options.")
    entry = _obj(["name", "value", "default_value", "source", "changed_from_default", "env_var"], {
        "name": s_str, "value": s_str, "default_value": {"type": ["string", "null"]},
        "source": {"enum": ["Default", "Env", "ClientOverride", "Runtime"]}, "changed_from_default": s_bool,
        "env_var": {"type": ["string", "null"]}}, "ConfigEntry", "One setting of the proc, as it applies there.")
    return {
        "NodePayload": bare(_NODE_SCHEMA),
        "ApiErrorEnvelope": bare(_ERROR_SCHEMA),
        "AdminInfo": bare(_ADMIN_SCHEMA),
        "PySpyResult": result, "PySpyStackTrace": trace, "PySpyFrame": frame, "PySpyProfileOpts": opts,
        "PyspyDumpAndStoreResponse": _obj(["dump_id"], {"dump_id": s_str}, "PyspyDumpAndStoreResponse",
                                          "The id of a stored dump: SELECT * FROM pyspy_dumps WHERE dump_id = ..."),
        "QueryRequest": _obj(["sql"], {"sql": s_str}, "QueryRequest", "SQL over the job's telemetry tables."),
        "QueryResponse": _obj(["rows"], {"rows": {"type": "array", "items": {"type": "object"}}}, "QueryResponse",
                              "The rows, one object each."),
        "ConfigEntry": entry,
        "ConfigDumpResult": _obj(["entries"], {"entries": {"type": "array",
                                                            "items": {"$ref": "#/components/schemas/ConfigEntry"}}},
                                 "ConfigDumpResult", "Every setting of the proc, sorted by name."),
    }


def _json(ref: str, doc: str) -> dict:
    return {"description": doc, "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}}


def _op(op_id: str, summary: str, ok: dict, errors: tuple[str, ...], *, params: list | None = None,
        body: str | None = None) -> dict:
    out: dict[str, Any] = {"operationId": op_id, "summary": summary, "responses": {"200": ok}}
    for code in errors:
        out["responses"][code] = {"description": _WHY[code], "content": {"application/json": {"schema": _ERR}}}
    if params:
        out["parameters"] = params
    if body:
        out["requestBody"] = {"required": True,
                              "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{body}"}}}}
    return out


def openapi() -> dict:
    """The OpenAPI 3.1 document of the mesh admin API this job serves."""
    text = {"description": "text", "content": {"text/plain": {"schema": {"type": "string"}}}}
    schema = {"description": "a JSON Schema", "content": {"application/json": {"schema": {"type": "object"}}}}
    ref_param = {"name": "reference", "in": "path", "required": True, "schema": {"type": "string"},
                 "description": "a reference from /v1/root or a node's children, percent-encoded"}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Monarch Mesh Admin API", "version": "1.0.0",
                 "description": "A walk of the job's hosts, procs and actors from /v1/root, read from its "
                                "telemetry tables; py-spy stacks, profiles and settings of a proc."},
        "paths": {
            "/v1/root": {"get": _op("getRoot", "The root node: the job's hosts", _json("NodePayload", "root"),
                                    ("500", "504"))},
            "/v1/{reference}": {"get": _op("resolveReference", "Any node by its reference",
                                           _json("NodePayload", "the node"), ("400", "404", "500", "504"),
                                           params=[ref_param])},
            "/v1/admin": {"get": _op("getAdminInfo", "Where this admin server runs", _json("AdminInfo", "itself"),
                                     ())},
            "/v1/schema": {"get": _op("getSchema", "JSON Schema of NodePayload", schema, ())},
            "/v1/schema/admin": {"get": _op("getAdminSchema", "JSON Schema of AdminInfo", schema, ())},
            "/v1/schema/error": {"get": _op("getErrorSchema", "JSON Schema of ApiErrorEnvelope", schema, ())},
            "/v1/openapi.json": {"get": _op("getOpenApi", "This document", schema, ())},
            "/v1/tree": {"get": _op("getTree", "The topology as an ASCII tree", text, ("500", "504"))},
            "/v1/query": {"post": _op("queryProxy", "SQL over the job's telemetry", _json("QueryResponse", "rows"),
                                      ("400",), body="QueryRequest")},
            "/v1/pyspy/{proc_reference}": {"get": _op(
                "getPyspy", "A proc's Python stacks (py-spy dump)", _json("PySpyResult", "the result"),
                ("400", "404", "500", "504"), params=[_PROC_PARAM])},
            "/v1/pyspy_dump/{proc_reference}": {"post": _op(
                "pyspyDumpAndStore", "Take a proc's stacks and keep them in the telemetry tables",
                _json("PyspyDumpAndStoreResponse", "stored"), ("400", "404", "500", "503", "504"),
                params=[_PROC_PARAM])},
            "/v1/pyspy_profile_svg/{proc_reference}": {"post": _op(
                "pyspyProfileSvg", "Sample a proc for a while: an SVG flamegraph",
                {"description": "SVG flamegraph", "content": {"image/svg+xml": {}}},
                ("400", "404", "500", "503", "504"), params=[_PROC_PARAM], body="PySpyProfileOpts")},
            "/v1/config/{proc_reference}": {"get": _op(
                "getConfig", "A proc's settings (monarch.config) and where each comes from",
                _json("ConfigDumpResult", "sorted by name"), ("400", "404", "500", "504"), params=[_PROC_PARAM])},
        },
        "components": {"schemas": _schemas()},
    }


def skill_md(base: str) -> str:
    """A short guide to the API for people and agents, with ``base`` in its examples."""
    return f"""# Mesh admin API of a monarch job

Base URL: `{base}` (plain HTTP on loopback unless `MeshAdminConfig(admin_addr=...)` says otherwise).
The contract is `GET {base}/v1/openapi.json`; node bodies follow `GET {base}/v1/schema`.

Walk the job: `GET {base}/v1/root`, then `GET {base}/v1/<percent-encoded child>` for each
reference in `children` (root -> hosts -> procs -> actors). References are opaque: send them back
as you got them, percent-encoded. Errors are `{{"error": {{"code": ..., "message": ...}}}}`; act on
`code` (`not_found`, `bad_request`, `gateway_timeout`, `service_unavailable`, `internal_error`).

A proc (`proc:HOST/PID`):
- `GET {base}/v1/pyspy/<proc>`: its Python stacks now.
- `POST {base}/v1/pyspy_dump/<proc>`: the same, kept in the telemetry tables; answers `{{"dump_id": ...}}`,
  then `POST {base}/v1/query` `{{"sql": "SELECT * FROM pyspy_frames WHERE dump_id = '...'"}}`.
- `POST {base}/v1/pyspy_profile_svg/<proc>` with
  `{{"duration_s": 5, "rate_hz": 100, "native": false, "threads": false, "nonblocking": false}}`:
  an SVG flamegraph of those seconds.
- `GET {base}/v1/config/<proc>`: its settings and where each comes from.

`GET {base}/v1/tree` prints the whole job as a tree.
"""
