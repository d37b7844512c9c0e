"""The public face of a package, and the names that moved away from an old path.

A parallelism package ``distcheck.parallel.<name>`` is its own API: its ``__init__`` names the
public names in ``__all__`` and serves each from the internal module that defines it, on first
access (:func:`face`). Importing the package imports nothing more, so the role modules that
discovery imports (``forms``, ``strategies`` ...) stay as cheap as before, and a closed form
never pulls in the numpy references it is checked against. Every module inside a parallelism
package is internal (``reference``, ``forms``, ``heads`` ...), as ``hypothesis.internal`` is to
``hypothesis.strategies``: import the package, not its modules.

Each public name has this one path: the old top-level modules (``distcheck.tp``, ``distcheck.forms.tp``,
``distcheck.props.tp`` ...) are gone (``tests/test_one_path.py``).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["face", "faces"]

#: the package whose sub-packages are the parallelism packages (each a face)
PARALLEL = "distcheck.parallel"


def face(package: str, public: Sequence[str], sources: Sequence[str]) -> tuple[Callable[[str], Any],
                                                                             Callable[[], list[str]]]:
    """A package's ``(__getattr__, __dir__)``: each name of ``public`` (its ``__all__``) is taken, on
    first access, from the first of its internal modules ``sources`` (names relative to ``package``)
    whose ``__all__`` lists it, and kept on the package. Any other name raises AttributeError, as a
    module does (so ``from package import submodule`` still imports the submodule)."""
    names = frozenset(public)

    def __getattr__(name: str) -> Any:
        if name in names:
            for source in sources:
                module = importlib.import_module(f"{package}.{source}")
                if name in getattr(module, "__all__", ()):
                    value = getattr(module, name)
                    setattr(sys.modules[package], name, value)
                    return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | names)

    return __getattr__, __dir__


def faces() -> dict[str, Any]:
    """Every parallelism package (``distcheck.parallel.<name>``), imported, by name, sorted (found by
    walking :data:`PARALLEL`, as discovery does)."""
    spec = importlib.util.find_spec(PARALLEL)
    if spec is None or spec.submodule_search_locations is None:  # pragma: no cover - a broken install
        return {}
    found = sorted(i.name for i in pkgutil.iter_modules(spec.submodule_search_locations) if i.ispkg)
    return {name: importlib.import_module(f"{PARALLEL}.{name}") for name in found}
