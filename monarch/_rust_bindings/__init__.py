"""Compatibility only: module paths of PyTorch Monarch's Rust extension that its own tests and
programs import.  Monarch has no Rust extension; the few names with a monarch counterpart are
aliases of it (``SupervisionError``, ``MeshFailure``, ``ChannelTransport``, ``Encoding``, the task API
``pytokio`` of ``monarch.actor._pytokio``, the ``shape`` types of ``monarch.actor._ndslice``), the others
are placeholders (``monarch._src._placeholder``) that raise ``NotImplementedError`` when used.
New code should import from ``monarch.actor``."""


def has_tensor_engine() -> bool:
    """Whether Monarch's Rust tensor engine is compiled in: never here.  (monarch's tensor engine is
    Python: ``monarch._tensor``; a test that asks this means the Rust one and its internals.)"""
    return False
