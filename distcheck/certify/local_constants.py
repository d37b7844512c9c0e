"""Hypothesis draws without the constants it collects from the "local" modules loaded.

Since Hypothesis 6.1xx, integer strategies sometimes draw numbers found in the source of the
"local" modules loaded at the time (the checkout, its tests, an editable install), so the same
seed could give another counterexample when other modules were loaded: under pytest, or from an
editable install rather than a wheel. A certificate, and the README's table of real libraries,
must not depend on that. :func:`without_local_constants` empties the local pool for the duration
of a run and clears the constant cache before and after, so that no other run sees a stale pool;
only Hypothesis's own global constants remain. On a Hypothesis without this machinery nothing is
changed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["without_local_constants"]


@contextmanager
def without_local_constants() -> Iterator[None]:
    """Run the body with Hypothesis's pool of local constants empty (see the module docstring)."""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants
    except ImportError:  # pragma: no cover - another Hypothesis layout
        yield
        return
    saved = getattr(providers, "_get_local_constants", None)
    cache = getattr(getattr(providers, "CONSTANTS_CACHE", None), "cache", None)
    if saved is None or cache is None:  # pragma: no cover
        yield
        return
    empty = Constants()
    providers._get_local_constants = lambda: empty
    cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = saved
        cache.clear()
