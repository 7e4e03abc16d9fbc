"""Names that exist only so that a module of Monarch's importing them loads (compatibility only).

Monarch's own tests and programs import internals of its Rust runtime (``PythonTask``,
``PortRef``, ...) beside the public API they test; monarch has no such objects.  A placeholder is a
class (so a module may subclass it, annotate with it or test ``isinstance`` against it) whose use
raises ``NotImplementedError`` naming what it stands for, rather than the whole module failing to
import and every test in it with it.
"""

from __future__ import annotations

from typing import Any, NoReturn


class Unavailable(NotImplementedError, AttributeError):
    """What using a placeholder raises: a ``NotImplementedError``, and an ``AttributeError`` so that
    ``hasattr`` and ``getattr(x, name, default)`` on a placeholder class answer "no" quietly."""


def _refuse(qualname: str, why: str) -> NoReturn:
    raise Unavailable(f"{qualname} is an internal of PyTorch Monarch's runtime that monarch does not have"
                              + (f": {why}" if why else ""))


class _Meta(type):
    def __getattr__(cls, attr: str) -> Any:
        # class attributes (enum members, constructors like `PortId.from_string`) are refused on use
        if attr.startswith("__"):
            raise AttributeError(attr)
        _refuse(f"{cls.__qualname__}.{attr}", cls._why)


def placeholder(module: str, name: str, why: str = "") -> type:
    """A class named ``name`` in ``module`` that refuses to be made or used."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _refuse(f"{module}.{name}", why)

    # ``Name[int]`` is the class itself, as for Monarch's generic runtime classes, so that an
    # annotation naming one loads.
    return _Meta(name, (), {"__init__": __init__, "__module__": module, "__qualname__": name, "_why": why,
                            "__class_getitem__": classmethod(lambda cls, item: cls),
                            "__doc__": f"Placeholder for Monarch's internal ``{name}``: using it raises "
                                       "NotImplementedError."})


def placeholder_function(module: str, name: str, why: str = "") -> Any:
    """A function named ``name`` in ``module`` that raises ``NotImplementedError`` when called."""

    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        _refuse(f"{module}.{name}", why)

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__module__ = module
    return refuse
