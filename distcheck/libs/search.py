"""Hypothesis as a counterexample finder: run a check over drawn examples, keep the smallest failure.

:func:`falsify` applies :func:`hypothesis.given` to a plain function that returns
``None`` when an example passes and a one-line message when it fails. Hypothesis
shrinks a failure to its smallest form and replays it last, so the failure kept
is the smallest counterexample Hypothesis found. Runs are seeded (the same seed
gives the same examples and the same counterexample), use no example database,
and have no deadline (a third-party library may be slow on its first call).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

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
        run()
    except _Counterexample:
        example, message = failures[-1]  # Hypothesis replays the shrunk example last
        return Outcome(seen[0], example, message)
    return Outcome(seen[0])
