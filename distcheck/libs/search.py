"""Hypothesis as a counterexample finder: run a check over drawn examples, keep the smallest failure.

:func:`falsify` applies :func:`hypothesis.given` to a plain function that returns
``None`` when an example passes and a one-line message when it fails. Hypothesis
shrinks a failure to its smallest form and replays it last, so the failure kept
is the smallest counterexample Hypothesis found. Runs are seeded (the same seed
gives the same examples and the same counterexample), use no example database,
and have no deadline (a third-party library may be slow on its first call).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.strategies import SearchStrategy

from distcheck.errors import check_nonnegative_int, check_positive_int
from distcheck.validate import check_callable, check_type

__all__ = ["Outcome", "falsify", "DEFAULT_EXAMPLES"]

#: examples per contract check (each third-party call is cheap; the layout checks build meshes)
DEFAULT_EXAMPLES = 60


@dataclass(frozen=True)
class Outcome:
    """What :func:`falsify` found: the examples tried and, on failure, the smallest
    counterexample (the drawn value) with its message."""

    examples: int
    counterexample: Any = None
    message: str | None = None

    @property
    def failed(self) -> bool:
        return self.message is not None


class _Counterexample(Exception):
    pass


def falsify(check: Callable[[Any], str | None], strategy: SearchStrategy, *,
            max_examples: int = DEFAULT_EXAMPLES, seed: int = 0) -> Outcome:
    """Run ``check`` on examples drawn from ``strategy``; return the smallest failure, if any.

    ``check(example)`` returns None (the example passes) or a message. An exception
    raised by ``check`` propagates (it is a bug in the check or an unexpected error of
    the target, which the caller reports as FAIL). Raises ConfigError for bad arguments.
    """
    check_callable("check", check)
    check_type("strategy", strategy, SearchStrategy, "must be a Hypothesis strategy")
    check_positive_int("max_examples", max_examples)
    check_nonnegative_int("seed", seed)
    seen = [0]
    failures: list[tuple[Any, str]] = []

    @hypothesis_seed(seed)
    @settings(max_examples=max_examples, database=None, deadline=None, derandomize=False, print_blob=False,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(example):
        seen[0] += 1
        message = check(example)
        if message is not None:
            failures.append((example, message))
            raise _Counterexample(message)

    try:
        with _without_local_constants():
            run()
    except _Counterexample:
        example, message = failures[-1]  # Hypothesis replays the shrunk example last
        return Outcome(seen[0], example, message)
    return Outcome(seen[0])


@contextmanager
def _without_local_constants() -> Iterator[None]:
    """Draw without the constants Hypothesis collects from "local" modules (the checkout, tests).

    Since Hypothesis 6.1xx, integer strategies sometimes draw numbers found in the source of
    the local modules loaded at the time, so the same seed gave another counterexample when
    other modules were loaded (under pytest, or from an editable install). The README's table
    must not depend on that: during a :func:`falsify` run the local pool is empty, and the
    constant cache is cleared before and after so that no other run sees a stale pool. Only
    Hypothesis's own global constants remain. On a Hypothesis without this machinery nothing
    is changed.
    """
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
