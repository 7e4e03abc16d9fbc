"""The Kubernetes reads every command makes, without importing the official client.

Every ``monarch`` command on a reservation first asks its scheduler whether it is alive; for
Kubernetes that is a list of pods and a read of the top object.  Importing the ``kubernetes``
package for it costs about 0.6 s of CPU (it loads every API and model class), more than the rest
of a ``monarch run``.  So the scheduler, once it has used the official client (at ``serve``),
keeps what that client resolved from the kubeconfig (server URL, CA, client certificate, bearer
token: ``Connection``, 0600 in the job's folder), and later reads go over plain HTTPS here.

Read-only, and a shortcut only: any answer it cannot use (no saved connection, 401/403 from an
expired token, a proxy it does not speak, a network error) raises :class:`Unavailable`, and the
caller asks again through the official client, which refreshes what is saved.  Objects come
back as :class:`View`, read with the official client's attribute names (``pod.status.pod_ip``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import ssl
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from monarch_agents.files import write_atomic

CONNECTION_FILE = "kube-connection.json"
_TIMEOUT_S = 10.0
#: Maps whose keys are data, not field names: kept as they are.
_DATA_KEYS = frozenset({"labels", "annotations", "data", "string_data", "node_selector", "selector",
                        "match_labels", "limits", "requests", "capacity", "allocatable"})


class Unavailable(Exception):
    """This shortcut cannot answer; ask through the official client."""


class NotFound(Exception):
    """The API answered 404."""


@dataclass
class Connection:
    """What the official client resolved from the kubeconfig, as files of the job's folder."""

    host: str
    ca: str = ""
    cert: str = ""
    key: str = ""
    token: str = ""
    verify: bool = True

    @classmethod
    def save(cls, job_dir: str, configuration: Any) -> None:
        """Keep what ``configuration`` (a ``kubernetes.client.Configuration``) uses, for later commands."""
        if getattr(configuration, "proxy", None):
            return  # a proxy: leave every read to the official client
        files = {}
        for attr, name in (("ssl_ca_cert", "kube-ca.crt"), ("cert_file", "kube-client.crt"), ("key_file", "kube-client.key")):
            src = getattr(configuration, attr, None)
            if src:
                # The client writes certificates embedded in a kubeconfig to temporary files it may remove.
                dst = os.path.join(job_dir, name)
                if os.path.abspath(src) != dst:
                    shutil.copyfile(src, dst)
                    os.chmod(dst, 0o600)
                files[attr] = dst
        # auth_settings() runs the kubeconfig's refresh hook (exec plugins) and names the header.
        auth = configuration.auth_settings().get("BearerToken") or {}
        token = auth.get("value", "") if auth.get("in") == "header" and auth.get("key", "").lower() == "authorization" else ""
        conn = cls(configuration.host, files.get("ssl_ca_cert", ""), files.get("cert_file", ""),
                   files.get("key_file", ""), token, bool(configuration.verify_ssl))
        write_atomic(os.path.join(job_dir, CONNECTION_FILE), json.dumps(asdict(conn)).encode())

    @classmethod
    def load(cls, job_dir: str | None) -> "Connection":
        if not job_dir:
            raise Unavailable("no job folder")
        try:
            with open(os.path.join(job_dir, CONNECTION_FILE)) as f:
                return cls(**json.load(f))
        except (OSError, ValueError, TypeError) as e:
            raise Unavailable(str(e)) from None


class Reader:
    """GETs on one kept-alive connection to the API server."""

    def __init__(self, conn: Connection):
        import http.client

        self.conn = conn
        u = urlsplit(conn.host)
        self._prefix = u.path.rstrip("/")
        if u.scheme == "https":
            ctx = ssl.create_default_context(cafile=conn.ca or None)
            if not conn.verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            if conn.cert:
                ctx.load_cert_chain(conn.cert, conn.key or None)
            self._http = http.client.HTTPSConnection(u.hostname, u.port or 443, context=ctx, timeout=_TIMEOUT_S)
        else:
            self._http = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=_TIMEOUT_S)

    def get(self, path: str, **query: str) -> "View":
        """``GET path`` as a :class:`View`; :class:`NotFound` on 404, :class:`Unavailable` on what the client should retry."""
        if query:
            path += "?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in query.items())
        headers = {"Accept": "application/json"}
        if self.conn.token:
            headers["Authorization"] = self.conn.token
        try:
            self._http.request("GET", self._prefix + path, headers=headers)
            r = self._http.getresponse()
            body = r.read()
        except (OSError, ssl.SSLError, ValueError) as e:
            raise Unavailable(str(e)) from None
        if r.status == 404:
            raise NotFound(path)
        if r.status != 200:
            raise Unavailable(f"{r.status} on {path}")
        try:
            return View(json.loads(body))
        except ValueError as e:
            raise Unavailable(str(e)) from None

    def close(self) -> None:
        self._http.close()


_CAMEL = re.compile(r"([a-z0-9])([A-Z])")


def _snake(key: str) -> str:
    return _CAMEL.sub(r"\1_\2", key).lower()


class View:
    """A JSON object read as the official client's models are: snake_case attributes, None when absent."""

    __slots__ = ("_fields",)

    def __init__(self, obj: dict):
        self._fields = {_snake(k): v for k, v in obj.items()}

    def __getattr__(self, name: str) -> Any:
        try:
            fields = object.__getattribute__(self, "_fields")
        except AttributeError:
            raise AttributeError(name) from None
        return _wrap(fields.get(name), name)

    def __getitem__(self, key: str) -> Any:
        return _wrap(self._fields.get(_snake(key)), _snake(key))


def _wrap(v: Any, name: str) -> Any:
    if isinstance(v, dict):
        return v if name in _DATA_KEYS else View(v)
    if isinstance(v, list):
        return [_wrap(x, "") for x in v]
    return v
