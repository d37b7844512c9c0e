"""A hang fails the target once: the verdicts of a certification whose world step timed out, and the
timeout its shrinking runs under.

A world step that outlives its timeout is a failure like any other: Hypothesis shrinks it
(:mod:`distcheck.certify.engine`), an example being interesting when its step times out too, so that the
case reported is the smallest that hangs. Each step that hangs while shrinking waits out a timeout and
restarts the world, so the steps after the first hang run under a shorter one, :func:`shrink_timeout`:
``min(timeout, max(SHRINK_TIMEOUT_MIN_S, SHRINK_TIMEOUT_FACTOR x the slowest step that finished on that
world))`` (its first step left out, :class:`StepClock`), and the world restarted after a hang is first
warmed, under its own timeout, with the run's first cases that finished (not counted as examples). A
smaller case that outlives the shorter timeout counts as hanging, and the verdict names both timeouts.
At most :data:`MAX_SHRINK_HANGS` steps may time out while one failure is shrunk; past them the smallest
case found so far is reported, saying so. Hypothesis itself stops shrinking one failure after
:func:`hypothesis_shrink_limit_s` (5 minutes): a hang still shrinking by then is reported with the smallest
case found, saying that a smaller one may hang too.

The property being certified FAILs with the smallest case's stuck ranks' Python stacks
(:attr:`distcheck.core.errors.WorldTimeout.stacks`, faulthandler's dump); every property left, at that dtype
and at every dtype and world size still to run, is a skip with :data:`HUNG_REASON`, and the worlds
still to run are never started.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from distcheck.certify.certificate import PropertyVerdict
from distcheck.engine.contracts.contract import Contract
from distcheck.report import FAIL, SKIP

__all__ = ["HUNG_REASON", "Hung", "HangState", "StepClock", "hung_verdicts", "skipped_after_hang", "shrink_timeout",
           "SHRINK_TIMEOUT_MIN_S", "SHRINK_TIMEOUT_FACTOR", "MAX_SHRINK_HANGS", "hypothesis_shrink_limit_s",
           "takes_timeout", "on_hang", "hung_run"]

#: the reason of every property skipped after a step of the same target timed out
HUNG_REASON = "a previous property hung"

#: seconds a step may take while a hang is shrunk, at least (never more than the full timeout)
SHRINK_TIMEOUT_MIN_S = 10.0
#: ... and at least this many times the slowest step that finished on the same world
SHRINK_TIMEOUT_FACTOR = 4.0
#: steps that may time out while one failure is shrunk; past them the smallest case so far is reported
MAX_SHRINK_HANGS = 32


def hypothesis_shrink_limit_s() -> float:
    """Seconds Hypothesis spends shrinking one failure before it stops (its engine's
    ``MAX_SHRINKING_SECONDS``, 300 in Hypothesis 6; 300 where the name is gone)."""
    try:
        from hypothesis.internal.conjecture import engine
    except ImportError:  # pragma: no cover - Hypothesis moved its engine
        return 300.0
    return float(getattr(engine, "MAX_SHRINKING_SECONDS", 300))


class Hung(BaseException):  # not an error: it stops Hypothesis, which catches Exception
    """Raised when the steps that timed out while shrinking exceed :data:`MAX_SHRINK_HANGS`, so that
    Hypothesis stops."""


def shrink_timeout(full_s: float, slowest_s: float) -> float:
    """The timeout of a step while a hang is shrunk, seconds: ``min(full_s, max(SHRINK_TIMEOUT_MIN_S,
    SHRINK_TIMEOUT_FACTOR * slowest_s))`` (``full_s``: the timeout the first hang outlived; ``slowest_s``:
    the slowest step that finished on that world)."""
    return min(full_s, max(SHRINK_TIMEOUT_MIN_S, SHRINK_TIMEOUT_FACTOR * slowest_s))


@dataclass
class StepClock:
    """The slowest world step that finished on one world, seconds (every dtype's run adds to it), but its
    first: a new world's first step imports and initialises what the later ones reuse."""

    slowest_s: float = 0.0
    steps: int = 0

    def finished(self, seconds: float) -> None:
        self.steps += 1
        if self.steps > 1:
            self.slowest_s = max(self.slowest_s, seconds)


def takes_timeout(world: Any) -> bool:
    """True if ``world.run`` takes ``timeout_s`` (the World protocol's; a bare object with ``run`` may not)."""
    try:
        params = inspect.signature(world.run).parameters.values()
    except (TypeError, ValueError):  # no signature to read
        return False
    return any(p.name == "timeout_s" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


@dataclass
class HangState:
    """The steps of one certification run that timed out (module doc).

    ``hung``: (case, crash) of the last that counted, the smallest so far; ``first``: (case, crash) of the
    first, at ``first_at`` (``time.perf_counter()``); ``hangs``: how many; ``step_timeout``: the shorter
    timeout of the steps after the first; ``cut``: more than :data:`MAX_SHRINK_HANGS` timed out;
    ``warm``: the cases of the run's first step that finished, which warm a world restarted after a hang;
    ``cold``: a step hung, so the world is to be warmed before the next timed step."""

    hung: tuple | None = None
    first: tuple | None = None
    first_at: float = 0.0
    hangs: int = 0
    step_timeout: float | None = None
    cut: bool = False
    warm: list | None = None
    cold: bool = False

    def count(self, shown: Any, crash: Any, shrink_s: float | None) -> bool:
        """Count a step of ``shown`` that timed out (``crash``; ``shrink_s``: the timeout of the steps after the
        first); True when the steps that timed out are past :data:`MAX_SHRINK_HANGS` (``cut``)."""
        self.hangs, self.cold = self.hangs + 1, True
        self.step_timeout = shrink_s if self.step_timeout is None else self.step_timeout
        if self.first is None:
            self.first, self.first_at = (shown, crash), time.perf_counter()
        self.cut = self.hangs > MAX_SHRINK_HANGS
        return self.cut

    def step(self, run_cases: Callable[[list, float | None], Any], cases: list, clock: StepClock,
             finished: Callable[[Any], bool]) -> Any:
        """One world step, ``run_cases(cases, timeout_s)``, under ``step_timeout`` (None: the world's own). After
        a hang the world is first warmed with ``warm`` under its own timeout, the outcome ignored: a new world's
        first step imports and initialises what the later ones reuse, and must not be taken for a hang. A step
        whose outcome ``finished`` times the ``clock`` and, the run's first, becomes ``warm``."""
        if self.cold and self.warm is not None:
            self.cold = False
            run_cases(self.warm, None)
        started = time.perf_counter()
        outcomes = run_cases(cases, self.step_timeout)
        if finished(outcomes):
            clock.finished(time.perf_counter() - started)
            self.warm = self.warm or cases
        return outcomes

    def message(self, message: str, shrunk: bool) -> str:
        """The verdict's ``message`` with how the hang was shrunk (``shrunk``: the hang was the run's target):
        the first case and its timeout, the shorter one, and where shrinking may have stopped short."""
        if not shrunk or self.first is None or self.hung is None:
            return message
        (first_case, first), (case, _) = self.first, self.hung
        if self.hangs > 1 and repr(first_case) != repr(case):
            shorter = (f"; the smaller cases ran under timeout_s={self.step_timeout:g}"
                       if self.step_timeout is not None and self.step_timeout != first.timeout_s else "")
            message += f" (shrunk from {first_case!r}, which outlived timeout_s={first.timeout_s:g}{shorter})"
        if self.cut:
            message += f" (shrinking stopped after {self.hangs} steps that timed out: a smaller case may hang too)"
        elif time.perf_counter() - self.first_at >= hypothesis_shrink_limit_s():
            message += (f" (Hypothesis stops shrinking one failure after {hypothesis_shrink_limit_s():g} s, reached "
                        "here: a smaller case may hang too)")
        return message


def on_hang(run: Any, shown: Any, crash: Any, clock: StepClock | None) -> None:
    """A step of ``shown`` that timed out (``crash``, the engine's ``_Crash``) in the engine's ``run``; the steps
    after it run under :func:`shrink_timeout` of ``clock``'s slowest (None: a world whose ``run`` takes no
    timeout). The run's target, it raises AssertionError (Hypothesis shrinks it); while another failure is
    shrunk, it is noted and not interesting (returns). Past :data:`MAX_SHRINK_HANGS` steps that timed out,
    raises :class:`Hung`, which stops Hypothesis."""
    shrink_s = None if clock is None or crash.timeout_s is None else shrink_timeout(crash.timeout_s, clock.slowest_s)
    cut = run.hang.count(shown, crash, shrink_s)
    if run.target is None:
        run.target, run.first_failure = ("hang",), run.calls
    elif run.target != ("hang",):  # another failure: not the one being shrunk
        run.other = run.other or (shown, crash.message)
        if not cut:
            return
    run.hang.hung = (shown, crash)
    if cut:
        raise Hung()
    raise AssertionError(crash.message)


def hung_run(run: Any, contract: Contract, dtype: str, options: dict, ws: int, backend: str, replay: str,
             seconds: float, exc: BaseException) -> dict[str, PropertyVerdict]:
    """The verdicts of the engine's ``run`` whose step timed out (``exc``: what ended Hypothesis): the property
    being shrunk (else the first left) FAILs with the smallest case that hung, the others left skip."""
    case, crash = run.hang.hung
    message = run.hang.message(crash.message, run.target == ("hang",))
    if not isinstance(exc, (AssertionError, Hung)):  # e.g. Hypothesis' Flaky: the hang did not replay
        message += f" ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    if run.last is not None:  # the run had failed before, and hung replaying or shrinking that failure
        message += f" (before that, it had failed on {run.last[0]!r}: {run.last[1]})"
    name = run.target[1] if run.target is not None and run.target[0] == "property" else run.remaining[0]
    return hung_verdicts(contract, dtype, options, ws, backend, name=name, remaining=run.remaining, case=case,
                         message=message, ranks=list(crash.ranks), stacks=crash.stacks, calls=run.calls,
                         replay=replay, seconds=seconds, first_failure=run.first_failure)


def _reason(contract: Contract, hung_property: str, dtype: str, world_size: int) -> str:
    return f"{HUNG_REASON} ({contract.name}.{hung_property}[{dtype}] at world size {world_size})"


def hung_verdicts(contract: Contract, dtype: str, options: dict, ws: int, backend: str, *, name: str,
                  remaining: list[str], case: object, message: str, ranks: list[int], stacks: dict[int, str],
                  calls: int, replay: str, seconds: float, first_failure: int | None = None
                  ) -> dict[str, PropertyVerdict]:
    """Property ``name`` FAILs with the stuck ranks' ``stacks`` (``case``: the smallest case that hung;
    ``calls``: examples run, shrinking included; ``first_failure``: the example that hung first); every
    other property of ``remaining`` is a skip (:data:`HUNG_REASON`)."""
    specs = {p.name: p for p in contract.properties}
    out = {name: PropertyVerdict(
        name, contract.statement(name, dtype, options), specs[name].regime, dtype, ws, backend, FAIL,
        examples=calls, counterexample=repr(case), failure=message, ranks=list(ranks), reproduce=replay,
        examples_until_failure=calls if first_failure is None else first_failure, seconds=seconds, hung=True,
        stacks=dict(sorted(stacks.items())))}
    for p in remaining:
        if p != name:
            out[p] = PropertyVerdict(p, contract.statement(p, dtype, options), specs[p].regime, dtype, ws, backend,
                                     SKIP, failure=_reason(contract, name, dtype, ws))
    return out


def skipped_after_hang(contract: Contract, dtype: str, options: dict, ws: int, backend: str,
                       hung: PropertyVerdict) -> list[PropertyVerdict]:
    """Every property at ``dtype`` and world size ``ws``, skipped because ``hung`` timed out before."""
    reason = _reason(contract, hung.property, hung.dtype, hung.world_size)
    return [PropertyVerdict(p.name, contract.statement(p.name, dtype, options), p.regime, dtype, ws, backend, SKIP,
                            failure=reason) for p in contract.properties]
