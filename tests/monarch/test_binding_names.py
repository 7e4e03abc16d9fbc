"""Every name in a ``monarch._rust_bindings`` module resolves back to itself through its
``__module__`` and ``__name__``: Monarch's tests walk those modules that way (its pickles rely on
it), and a stray imported module, ``__future__`` feature or private instance there breaks the walk."""

import importlib
import pkgutil
from types import ModuleType

import monarch._rust_bindings as bindings


def _binding_modules() -> list[ModuleType]:
    names = [bindings.__name__] + [m.name for m in pkgutil.walk_packages(bindings.__path__, bindings.__name__ + ".")]
    return [importlib.import_module(n) for n in names]


def test_every_name_of_a_binding_module_resolves_to_itself():
    bad = []
    for module in _binding_modules():
        for name, value in vars(module).items():
            if name.startswith("__"):
                continue
            if isinstance(value, ModuleType):
                if not value.__name__.startswith(bindings.__name__ + "."):
                    bad.append(f"{module.__name__}.{name}: the module {value.__name__}")
                continue
            if not hasattr(value, "__module__"):
                continue
            try:
                resolved = getattr(importlib.import_module(value.__module__), value.__name__)
            except Exception as e:
                bad.append(f"{module.__name__}.{name}: {type(e).__name__}: {e}")
                continue
            if resolved is not value:
                bad.append(f"{module.__name__}.{name}: {value.__module__}.{value.__name__} is another object")
    assert not bad, "\n".join(bad)


def test_the_shape_classes_pickle_under_monarchs_path():
    import pickle

    from monarch._rust_bindings.monarch_hyperactor.shape import Shape, Slice

    shape = Shape(["hosts", "gpus"], Slice.new_row_major([2, 3]))
    assert type(shape).__module__ == "monarch._rust_bindings.monarch_hyperactor.shape"
    assert b"monarch._rust_bindings.monarch_hyperactor.shape" in pickle.dumps(shape)
    assert pickle.loads(pickle.dumps(shape)) == shape
