"""Compatibility only: placeholders for Monarch's ``pytokio`` (see ``monarch._src._placeholder``)."""

from monarch._src._placeholder import placeholder

PythonTask = placeholder(__name__, "PythonTask")
Shared = placeholder(__name__, "Shared")
Handle = placeholder(__name__, "Handle")
WouldBlockRuntime = placeholder(__name__, "WouldBlockRuntime")


def is_tokio_thread() -> bool:
    """Whether this thread is one of Monarch's Tokio runtime threads: monarch has none."""
    return False
