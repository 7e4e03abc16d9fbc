"""Compatibility only: Monarch's ``pytokio`` names, from ``monarch.actor._pytokio``.

Only the names themselves live here, as in Monarch's binding module (which Monarch's tests walk,
resolving each name through its ``__module__``)."""

from monarch.actor._pytokio import Handle, PythonTask, Shared, WouldBlockRuntime, is_tokio_thread  # noqa: F401
