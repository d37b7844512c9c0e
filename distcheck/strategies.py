"""Hypothesis strategies for distributed-training inputs, usable in your own ``@given`` tests.

Conventions (Hypothesis' own): every argument is keyword-only, bounds are
``min_*``/``max_*`` pairs, the defaults always generate, bad arguments raise
:class:`hypothesis.errors.InvalidArgument` (a ``TypeError``) when the strategy is
built, with a message like ``Cannot have max_tp=1 < min_tp=2``, and the repr of a
strategy is the call that built it (``shard_sizes(max_shards=4)``).

Array-valued cases hold integer-valued floats bounded by
:func:`distcheck.core.exactness.max_exact_int`, so a correct sharded computation must
agree with the unsharded one bit for bit (see :mod:`distcheck.core.exactness`).

Example::

    from hypothesis import given
    from distcheck import strategies as ds

    @given(ds.parallel_configs(max_world_size=64))
    def test_my_mesh(cfg):
        assert my_world_size(cfg) == cfg.tp * cfg.cp * cfg.pp * cfg.dp

Where they live: each parallelism package defines its own, in
``distcheck/parallel/<name>/strategies.py``; the generic ones (dtypes, integer-valued
arrays) are :mod:`distcheck.engine.strategies`. This module gathers them by discovery, so
a new package's strategies appear here without an edit, and checks at import, loudly
(ImportError), that each package's ``__all__`` lists exactly what it defines and that no
two packages export the same name. Their public path is this module: each strategy and
case class reports ``__module__ == "distcheck.strategies"`` (for reprs and pickling).

Reference modules are imported when a strategy draws, so importing this module stays cheap.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from distcheck.engine import strategies as _generic
from distcheck.engine.discovery import role_modules


def _gather() -> dict[str, Any]:
    found: dict[str, Any] = {n: getattr(_generic, n) for n in _generic.GENERIC}
    origin: dict[str, str] = dict.fromkeys(found, _generic.__name__)
    modules: list[ModuleType] = role_modules("strategies")
    for module in modules:
        for name in _generic.public_names(module):
            if name in found:
                raise ImportError(f"strategy {name!r} is defined by both {origin[name]} and {module.__name__}")
            found[name], origin[name] = getattr(module, name), module.__name__
    for obj in found.values():
        obj.__module__ = __name__  # the public path (reprs, pickling, the __all__ check of the tests)
    return found


globals().update(_gather())
__all__ = sorted(name for name, value in globals().items()
                 if not name.startswith("_") and getattr(value, "__module__", None) == __name__)
