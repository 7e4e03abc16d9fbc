"""Where ``python -m monarch.tools.cli debug`` connects by default (PyTorch Monarch's environment
variables and defaults: ``MONARCH_DEBUG_SERVER_HOST`` localhost, ``..._PORT`` 27000,
``..._PROTOCOL`` tcp)."""

import os

_MONARCH_DEBUG_SERVER_HOST_ENV_VAR = "MONARCH_DEBUG_SERVER_HOST"
_MONARCH_DEBUG_SERVER_HOST_DEFAULT = "localhost"
_MONARCH_DEBUG_SERVER_PORT_ENV_VAR = "MONARCH_DEBUG_SERVER_PORT"
_MONARCH_DEBUG_SERVER_PORT_DEFAULT = "27000"
_MONARCH_DEBUG_SERVER_PROTOCOL_ENV_VAR = "MONARCH_DEBUG_SERVER_PROTOCOL"
_MONARCH_DEBUG_SERVER_PROTOCOL_DEFAULT = "tcp"


def _get_debug_server_host() -> str:
    return os.environ.get(_MONARCH_DEBUG_SERVER_HOST_ENV_VAR, _MONARCH_DEBUG_SERVER_HOST_DEFAULT)


def _get_debug_server_port() -> str:
    return os.environ.get(_MONARCH_DEBUG_SERVER_PORT_ENV_VAR, _MONARCH_DEBUG_SERVER_PORT_DEFAULT)


def _get_debug_server_protocol() -> str:
    return os.environ.get(_MONARCH_DEBUG_SERVER_PROTOCOL_ENV_VAR, _MONARCH_DEBUG_SERVER_PROTOCOL_DEFAULT)
