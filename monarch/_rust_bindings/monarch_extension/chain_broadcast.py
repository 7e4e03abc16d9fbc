"""Compatibility only: PyTorch Monarch's ``monarch._rust_bindings.monarch_extension.chain_broadcast``
(the chain that brings ``monarch.remotemount``'s blocks).  Here each hop is a port of the job's own
transport: :mod:`monarch.remotemount._chain`."""

from monarch.remotemount._chain import (  # noqa: F401
    ChainCtx,
    ChainServer,
    ChainSession,
    connect,
    ctx_close,
    ctx_wait_into,
    forward,
    new_ctx,
    send_block,
    send_block_to_port,
    serve,
    serve_port,
    validate_port_addr,
)
