"""Running properties without pytest: :func:`run_property` and :func:`run_suite`.

:func:`run_property` applies :func:`hypothesis.given` itself, so properties run without
pytest (``distcheck check``): the property's edge cases first, then the generated cases,
seeded from the run seed (:func:`resolve_seed`, :func:`example_seed`), so the same profile
and seed give the same row. It returns a :class:`distcheck.core.results.CheckResult` row
(backend ``"reference"``) with the examples tried, the verdict, and on failure the reason,
the shrunk counterexample and how to reproduce it (the seed, and the
``@reproduce_failure`` blob).

Also here: :func:`call_impl`, which every property uses to call the implementation under
test (a crash becomes an :class:`~distcheck.core.errors.ImplementationError`), and the
one-line failure detail of a row.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from hypothesis import Phase, given, settings
from hypothesis import seed as hypothesis_seed

from distcheck.core.errors import ImplementationError, PropertyFailure
from distcheck.core.results import FAIL, PASS, CheckResult
from distcheck.core.validate import check_nonnegative_int
from distcheck.engine.catalogue import catalogue
from distcheck.engine.profiles import get_profile
from distcheck.engine.registry import _REGISTRY, Property, get, properties, with_edge_cases

__all__ = [
    "run_property",
    "run_suite",
    "resolve_seed",
    "example_seed",
    "call_impl",
    "failure_detail",
    "failure_kind",
    "REASON_CHARS",
    "DETAIL_CHARS",
]

# Importing the engine loads the closed-form catalogue (sympy and every package's forms, about a
# second). The cost is paid once, at import (test collection), not inside the first example of a
# user's @given test, where it would exceed Hypothesis' default 200 ms deadline (DeadlineExceeded,
# then FlakyFailure when the replay is fast). After that a property evaluates its closed forms in
# about a millisecond.
catalogue()


def call_impl(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call the implementation under test; turn anything it raises into an ImplementationError.

    A crash of the implementation on a valid case fails the property (e.g. a
    mis-sharded weight whose shapes no longer line up), but as
    :class:`~distcheck.core.errors.ImplementationError` (``kind="raised"``), whose message
    says "implementation WHAT raised TYPE: message": distinct from a claim that does
    not hold (a wrong value, bound or count). Even a PropertyFailure raised inside the
    implementation is wrapped: only the property itself judges its claim.
    """
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # any crash on a valid input fails the property
        raise ImplementationError(f"implementation {what} raised {type(e).__name__}: {e}", "raised",
                                  type(e).__name__) from e


#: the longest reason a row's detail keeps whole (error type, message, max error, bound,
#: then expected and got); the counterexample gets what is left of DETAIL_CHARS
REASON_CHARS = 320
DETAIL_CHARS = 480


def _flat(text: str) -> str:
    return " ".join(text.split())


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def failure_detail(reason: str, counterexample: str) -> str:
    """One line: the reason first (kept up to REASON_CHARS), then the counterexample, cut to
    fit DETAIL_CHARS. Both are kept whole in the row's ``extra`` and printed below the table."""
    reason = _cut(_flat(reason), REASON_CHARS)
    if not counterexample:
        return reason
    head = f"{reason}; counterexample "
    return head + _cut(_flat(counterexample), max(40, DETAIL_CHARS - len(head)))


def failure_kind(error: BaseException) -> str:
    """``"claim"`` (the property's claim is false), ``"raised"`` or ``"contract"`` (the
    implementation could not be checked; :class:`~distcheck.core.errors.ImplementationError`), or
    ``"error"`` (anything else: the property's own code or Hypothesis raised)."""
    return error.kind if isinstance(error, PropertyFailure) else "error"


def resolve_seed(profile: str, seed: int | None = None) -> int:
    """The seed of a run: ``seed`` when given, else 0 under a derandomized profile (``ci``), else a
    fresh random 32-bit seed (``dev``, ``thorough``). It is reported with every property row
    (``extra["seed"]``) and in the summary line; passing it back replays the run.

    Raises ConfigError for an unknown profile, or a seed that is not an int >= 0.
    """
    base = get_profile(profile)
    if seed is not None:
        return check_nonnegative_int("seed", seed)
    return 0 if base.derandomize else random.getrandbits(32)


def example_seed(seed: int, key: str) -> int:
    """The Hypothesis seed of one row: a hash (SHA-256) of the run seed and the row's key (a
    property name, or ``mutant:<name>``). Every row gets its own stream, which does not depend
    on the order of the run or on which other rows ran, so one row replays alone."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


_BLOB = re.compile(r"@reproduce_failure\([^)]*\)")
# Hypothesis says "Falsifying example:" (before 6.16x) or "Failing test case:" (after)
_FALSIFYING = re.compile(r"(?:Falsifying example|Failing test case): .*", re.S)


@dataclass
class _Calls:
    """What the test body saw: calls so far, the last failing case (in a 1-tuple), the first failing call."""

    calls: int = 0
    failing: tuple = ()
    first_failure: int | None = None


def run_property(
    prop: Property | str,
    profile: str = "ci",
    *,
    impl: Callable | None = None,
    seed: int | None = None,
    max_examples: int | None = None,
    label: str | None = None,
    options: dict | None = None,
    shrink: bool = True,
    edge_cases: bool = True,
) -> CheckResult:
    """Run one property under a settings profile, without pytest.

    Args:
        prop: a :class:`Property` or its name.
        profile: ``"dev"``, ``"ci"`` or ``"thorough"`` (:mod:`distcheck.engine.profiles`).
        impl: implementation under test (None: the reference).
        seed: the run seed (:func:`resolve_seed`: None means 0 under ``ci``, a random seed
            under ``dev`` and ``thorough``). Hypothesis is seeded with
            ``example_seed(seed, label or prop.name)``, so the same call gives the same row:
            the same examples, counts, counterexample and shrinking.
        max_examples: overrides the profile's example count.
        label: the ``check`` column of the row (default: the property name).
        options: keyword arguments of the property function, e.g. ``{"require_log": False}``
            for a TP layer that cannot record its collectives.
        shrink: False stops at the first failing example (no shrinking), e.g. to scan many
            seeds; the counterexample is then the first one found.
        edge_cases: True (default) tries the property's edge cases (:attr:`Property.edge_cases`)
            first; False runs only what the strategy generates (to show that the random
            search alone reaches a mistake).

    Returns a CheckResult: ``verdict`` pass/FAIL, ``examples`` = the number of
    times Hypothesis actually called the property (counted inside the test body, not
    the profile's ``max_examples``: fewer when the strategy's space is exhausted; on
    failure, the examples up to the first failure plus the shrinking replays),
    ``max_error`` and ``bound`` from the PropertyFailure, ``detail`` = the reason, then the
    shrunk counterexample (:func:`failure_detail`); ``extra`` = ``{"seed", "hypothesis_seed", "profile",
    "property", "max_examples", "edge_cases"}`` and, on failure, ``{"counterexample",
    "error", "error_type", "failure_kind", "found_by", "reproduce_failure", "reproduce",
    "examples_until_failure", "shrink_calls"}`` plus, for a registered property run on its
    reference, ``"replay"`` (the ``distcheck check`` command that replays the run).
    Raises ConfigError for an unknown profile; UnknownQuantityError for an unknown name.
    """
    if isinstance(prop, str):
        prop = get(prop)
    base = get_profile(profile)
    # no example database (runs are reproduced by seed or blob); one bug per run; the
    # "explain" phase is skipped: it re-runs the failing example many times to annotate lines
    skipped = (Phase.explain,) if shrink else (Phase.explain, Phase.shrink)
    overrides: dict[str, Any] = {"database": None, "report_multiple_bugs": False,
                                 "phases": tuple(ph for ph in base.phases if ph not in skipped)}
    if max_examples is not None:
        overrides["max_examples"] = max_examples
    run_settings = settings(base, **overrides)
    seed = resolve_seed(profile, seed)
    check = label or prop.name
    hyp_seed = example_seed(seed, check)

    opts = dict(options or {})
    state = _Calls()

    def test(case: Any) -> None:
        state.calls += 1
        try:
            prop.check(case, impl, **opts)
        except BaseException:
            state.failing = (case,)
            if state.first_failure is None:
                state.first_failure = state.calls
            raise

    test.__name__ = prop.name.replace(".", "_")
    edges = tuple(prop.edge_cases()) if edge_cases else ()
    runner = given(prop.strategy())(test)
    if edges:
        runner = with_edge_cases(prop)(runner)
    runner = run_settings(runner)
    runner = hypothesis_seed(hyp_seed)(runner)

    extra = {"seed": seed, "hypothesis_seed": hyp_seed, "profile": profile, "property": prop.name,
             "max_examples": run_settings.max_examples, "edge_cases": len(edges)}
    try:
        runner()
    except Exception as e:  # noqa: BLE001 - every failure becomes a FAIL row
        notes = "\n".join(getattr(e, "__notes__", []) or [])
        blob = _BLOB.search(notes)
        counter = repr(state.failing[0]) if state.failing else ""
        if not counter:
            m = _FALSIFYING.search(notes)
            counter = m.group(0).split("\n\n")[0] if m else ""
        impl_text = ("" if impl is None
                     else f", impl={getattr(impl, '__module__', '?')}.{getattr(impl, '__qualname__', impl)}")
        reproduce = (f"run_property({prop.name!r}, profile={profile!r}, seed={seed}" + impl_text
                     + (f", label={label!r}" if label else "") + (f", options={opts!r}" if opts else "") + ")")
        if impl is None and not opts and label is None and _REGISTRY.get(prop.name) is prop:
            extra["replay"] = f"distcheck check --only properties --profile {profile} --seed {seed}"
        first = state.first_failure or state.calls
        extra.update(
            found_by=f"edge case {first} of {len(edges)}" if 0 < first <= len(edges) else "generated example",
            examples_until_failure=first,
            shrink_calls=state.calls - first,
            counterexample=counter,
            error=str(e),
            error_type=type(e).__name__,
            failure_kind=failure_kind(e),
            reproduce_failure=blob.group(0) if blob else None,
            reproduce=reproduce,
        )
        max_error = getattr(e, "max_error", None)
        bound = getattr(e, "bound", None)
        return CheckResult(
            check=check, backend="reference", verdict=FAIL, world_size=1, examples=state.calls,
            max_error=float(max_error) if max_error is not None else None,
            bound=float(bound) if bound is not None else None,
            detail=failure_detail(str(e) if isinstance(e, ImplementationError) else f"{type(e).__name__}: {e}",
                                  counter),
            extra=extra,
        )
    return CheckResult(check=check, backend="reference", verdict=PASS, world_size=1, examples=state.calls,
                       detail=prop.description, extra=extra)


def run_suite(suite: str | None = None, profile: str = "ci", *, names: Iterable[str] | None = None,
              seed: int | None = None) -> list[CheckResult]:
    """Run every property (of ``suite``, or the listed ``names``) and return one row each.

    ``seed``: the run seed, one for every row (:func:`resolve_seed`)."""
    props = [get(n) for n in names] if names is not None else properties(suite)
    seed = resolve_seed(profile, seed)
    return [run_property(p, profile, seed=seed) for p in props]
