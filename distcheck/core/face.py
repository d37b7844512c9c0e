"""The public face of a package, and the names that moved away from an old path.

A parallelism package ``distcheck.parallel.<name>`` is its own API: its ``__init__`` names the
public names in ``__all__`` and serves each from the internal module that defines it, on first
access (:func:`face`). Importing the package imports nothing more, so the role modules that
discovery imports (``forms``, ``strategies`` ...) stay as cheap as before, and a closed form
never pulls in the numpy references it is checked against. Every module inside a parallelism
package is internal (``reference``, ``forms``, ``heads`` ...), as ``hypothesis.internal`` is to
``hypothesis.strategies``: import the package, not its modules.

The old paths that the README and the docs taught (``distcheck.tp``, ``distcheck.forms.tp``,
``distcheck.props.tp`` ...) are kept for one release by :func:`moved`: each name still resolves,
with a :class:`DeprecationWarning` naming its new path.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["face", "faces", "moved", "to_face"]

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


def to_face(package: str) -> Callable[[str], tuple[str, Any] | None]:
    """The new home of a name of an old module that re-exported the package ``package``: the package's own
    face when its ``__all__`` names it, else the face of the package that defines it (``distcheck.tp.gamma``
    -> ``distcheck.parallel.dp.gamma``); None when no face has it."""

    def where(name: str) -> tuple[str, Any] | None:
        home = importlib.import_module(package)
        candidates = [(package, home), *((f"{PARALLEL}.{n}", m) for n, m in faces().items())]
        for path, module in candidates:
            if name in getattr(module, "__all__", ()):
                return f"{path}.{name}", getattr(module, name)
        return None

    return where


def moved(old: str, where: Callable[[str], tuple[str, Any] | None], new: str) -> Callable[[str], Any]:
    """The ``__getattr__`` of a deprecated module ``old`` (kept for one release): a name that ``where``
    finds a new path for is returned, with a DeprecationWarning naming that path; any other name raises
    AttributeError. ``new`` names the module's replacement in the error message."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        found = where(name)
        if found is None:
            raise AttributeError(f"module {old!r} has no attribute {name!r} (deprecated module: use {new})")
        path, value = found
        warnings.warn(f"{old}.{name} is deprecated and will be removed in the next release; use {path}",
                      DeprecationWarning, stacklevel=2)
        return value

    return __getattr__
