"""distcheck's properties: plain functions of generated inputs, a registry, and a runner.

A property is a function ``fn(case, *, impl=None)`` that raises
:class:`distcheck.errors.PropertyFailure` when it does not hold. ``impl`` is the
implementation under test; ``None`` means the reference (``distcheck.dp``,
``distcheck.tp``, ...). Passing another function with the same signature is how a
mutant (:mod:`distcheck.mutants`) or a third-party layer is checked.

Each property is registered with the strategy that feeds it and its edge cases as
a :class:`Property`. :func:`run_property` applies :func:`hypothesis.given` itself,
so properties run without pytest (``distcheck check``): the edge cases first, then
the generated cases, seeded from the run seed (:func:`resolve_seed`,
:func:`example_seed`), so the same profile and seed give the same row. It returns a
:class:`distcheck.report.CheckResult` row (backend ``"reference"``) with the
examples tried, the verdict, and on failure the reason, the shrunk counterexample
and how to reproduce it (the seed, and the ``@reproduce_failure`` blob).

Suites (one module each): dp, accumulation, tp, pipeline, zero, params, layout, comm.

Importing this package loads the closed-form catalogue (sympy and every module of
:mod:`distcheck.forms`, about a second). The cost is paid once, at import (test
collection), not inside the first example of a user's ``@given`` test, where it
would exceed Hypothesis' default 200 ms deadline (DeadlineExceeded, then
FlakyFailure when the replay is fast). After that a property evaluates its closed
forms in about a millisecond.
"""

from __future__ import annotations

import hashlib
import importlib
import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from hypothesis import Phase, example, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.strategies import SearchStrategy

from distcheck.closed_form import catalogue as _catalogue
from distcheck.core.errors import ConfigError, ImplementationError, PropertyFailure, UnknownQuantityError
from distcheck.core.validate import check_nonnegative_int
from distcheck.report import FAIL, PASS, CheckResult

__all__ = [
    "SUITES",
    "Property",
    "register",
    "properties",
    "get",
    "run_property",
    "run_suite",
    "with_edge_cases",
    "resolve_seed",
    "example_seed",
    "run_all",
    "mutant_summary",
    "call_impl",
    "failure_detail",
    "failure_kind",
    "form_value",
]

#: property suites, one module of distcheck.props each
SUITES = ("dp", "accumulation", "tp", "pipeline", "zero", "params", "layout", "comm")

_REGISTRY: dict[str, "Property"] = {}
_loaded = False

_catalogue()  # warm the closed forms now (see the module docstring): no lazy sympy import inside an example


@dataclass(frozen=True)
class Property:
    """One registered property.

    Attributes:
        name: dotted name, e.g. ``"dp.unequal_shards.weighted"`` (suite first).
        strategy: a zero-argument callable returning the Hypothesis strategy of the
            cases (built lazily, so reference modules load only when needed).
        function: ``function(case, *, impl=None)``; raises PropertyFailure.
        description: one line: what must hold, and its exactness regime.
        reference: the default implementation (``impl=None``), for documentation.
        impl_signature: the signature an ``impl`` must have.
        edge_cases: a zero-argument callable returning the cases that are part of the
            property's definition: the boundaries of its domain where a wrong
            implementation shows (a tp that does not divide a width, m < p, dp that does
            not divide the parameters, a bias, GQA, tied embeddings ...). Every run tries
            them first, in order, before any generated case (as Hypothesis ``@example``s;
            :func:`with_edge_cases` adds them to your own ``@given`` test).
    """

    name: str
    strategy: Callable[[], SearchStrategy]
    function: Callable
    description: str
    reference: Callable | None = field(default=None, repr=False)
    impl_signature: str = ""
    edge_cases: Callable[[], Sequence] = field(default=lambda: (), repr=False)

    @property
    def suite(self) -> str:
        return self.name.split(".", 1)[0]

    def check(self, case, impl=None, **options) -> None:
        """Run the property on one case (raises PropertyFailure); ``options`` are keyword
        arguments of the property function (e.g. ``require_log=False``)."""
        if impl is None:
            self.function(case, **options)
        else:
            self.function(case, impl=impl, **options)


def register(prop: Property) -> Property:
    """Add ``prop`` to the registry; a second property of the same name is an error."""
    if prop.name in _REGISTRY and _REGISTRY[prop.name] is not prop:
        raise ValueError(f"property {prop.name!r} registered twice")
    _REGISTRY[prop.name] = prop
    return prop


def _load() -> None:
    global _loaded
    if not _loaded:
        for suite in SUITES:
            importlib.import_module(f"distcheck.props.{suite}")
        _import_package()
        _loaded = True


def _import_package() -> None:
    """Import every module of distcheck (none imports torch at module level).

    Hypothesis mixes into its draws the literal constants of the "local" (non-installed,
    non-test) modules loaded at the time, and picks up newly loaded ones as it goes. A
    reference or mutant imported lazily in the middle of a run would change the draws
    of every later property, so the same seed could give different rows. Loading the
    whole package first makes distcheck's part of that pool the same in every run.
    """
    import pkgutil

    import distcheck

    for info in pkgutil.walk_packages(distcheck.__path__, "distcheck."):
        if info.name != "distcheck.__main__":
            importlib.import_module(info.name)


def properties(suite: str | None = None) -> list[Property]:
    """Registered properties, sorted by name; only those of ``suite`` when given.

    Raises ConfigError for an unknown suite.
    """
    _load()
    if suite is not None and suite not in SUITES:
        raise ConfigError("suite", suite, f"must be one of {', '.join(map(repr, SUITES))}")
    return [p for n, p in sorted(_REGISTRY.items()) if suite is None or p.suite == suite]


def get(name: str) -> Property:
    """The property called ``name``; raises UnknownQuantityError (a KeyError) with suggestions."""
    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownQuantityError(name, sorted(_REGISTRY), kind="property") from None


def with_edge_cases(prop: Property | str) -> Callable:
    """Decorator: the property's edge cases as Hypothesis ``@example``s of a ``@given`` test.

    Use it above or below ``@given``::

        @with_edge_cases("tp.row.exact")
        @given(ds.linear_cases(max_tp=8))
        def test_my_row_parallel_layer(case):
            tp_props.row_exact(case, impl=my_row_parallel)

    The cases run first, in the order the property declares them.
    """
    if isinstance(prop, str):
        prop = get(prop)
    cases = tuple(prop.edge_cases())

    def decorate(test: Callable) -> Callable:
        # Hypothesis runs explicit examples last-applied first: apply them in reverse
        for case in reversed(cases):
            test = example(case)(test)
        return test

    return decorate


def form_value(name: str, **values):
    """The catalogue form ``name`` evaluated exactly (int or Fraction) on the inputs it takes;
    values for inputs the form does not have are ignored (so one dict of case values can feed
    every form). Raises UnknownQuantityError for an unknown name, ConfigError for bad inputs."""
    from distcheck.closed_form import get as get_form

    form = get_form(name)
    known = {i.name for i in form.inputs}
    return form.evaluate(**{k: v for k, v in values.items() if k in known})


def call_impl(what: str, fn: Callable, *args, **kwargs):
    """Call the implementation under test; turn anything it raises into an ImplementationError.

    A crash of the implementation on a valid case fails the property (e.g. a
    mis-sharded weight whose shapes no longer line up), but as
    :class:`~distcheck.errors.ImplementationError` (``kind="raised"``), whose message
    says "implementation WHAT raised TYPE: message": distinct from a claim that does
    not hold (a wrong value, bound or count). Even a PropertyFailure raised inside the
    implementation is wrapped: only the property itself judges its claim.
    """
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - any crash on a valid input fails the property
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
    implementation could not be checked; :class:`~distcheck.errors.ImplementationError`), or
    ``"error"`` (anything else: the property's own code or Hypothesis raised)."""
    return error.kind if isinstance(error, PropertyFailure) else "error"


def resolve_seed(profile: str, seed: int | None = None) -> int:
    """The seed of a run: ``seed`` when given, else 0 under a derandomized profile (``ci``), else a
    fresh random 32-bit seed (``dev``, ``thorough``). It is reported with every property row
    (``extra["seed"]``) and in the summary line; passing it back replays the run.

    Raises ConfigError for an unknown profile, or a seed that is not an int >= 0.
    """
    from distcheck.profiles import get_profile

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
        profile: ``"dev"``, ``"ci"`` or ``"thorough"`` (:mod:`distcheck.profiles`).
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
    from distcheck.profiles import get_profile

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

    def test(case):
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
        impl_text = "" if impl is None else f", impl={getattr(impl, '__module__', '?')}.{getattr(impl, '__qualname__', impl)}"
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


def mutant_summary(rows: Iterable[CheckResult]) -> CheckResult:
    """One row "mutants killed k/n" over the rows of :func:`distcheck.mutants.kill_mutants`.

    Only a kill counts (``extra["outcome"] == "killed"``, or a ``pass`` row without an
    outcome); broken mutants (the implementation raised) and survivors are named, and
    the row FAILs unless every mutant was killed.
    """
    rows = list(rows)

    def outcome(r: CheckResult) -> str:
        return str(r.extra.get("outcome", "killed" if r.verdict == PASS else "survived"))

    killed = sum(1 for r in rows if outcome(r) == "killed")
    named = {kind: [r.check.removeprefix("mutant:") for r in rows if outcome(r) == kind] for kind in ("broken", "survived")}
    detail = f"mutants killed {killed}/{len(rows)}" + "".join(
        f"; {kind}: {', '.join(names)}" for kind, names in named.items() if names)
    ok = bool(rows) and killed == len(rows)
    return CheckResult(check="mutants", backend="reference", verdict=PASS if ok else FAIL,
                       examples=sum(r.examples for r in rows), detail=detail,
                       extra={"killed": killed, "total": len(rows), **named})


def run_all(profile: str = "ci", *, mutants: bool = True, proofs: bool = True,
            seed: int | None = None) -> list[CheckResult]:
    """Everything ``distcheck check`` runs for the properties stage, one row each:
    every property (backend "reference"), every sympy proof (backend "sympy"), every
    mutant ("mutant:<name>", pass = killed) and a final "mutants killed k/n" row.

    ``seed``: the run seed (:func:`resolve_seed`), shared by every property and mutant row
    and recorded in their ``extra["seed"]``; the same profile and seed give the same rows.
    """
    seed = resolve_seed(profile, seed)
    rows = run_suite(None, profile, seed=seed)
    if proofs:
        from distcheck.props.proofs import prove_all

        rows += prove_all()
    if mutants:
        from distcheck.mutants import kill_mutants

        killed = kill_mutants(profile, seed=seed)
        summary = mutant_summary(killed)
        summary.extra.update(seed=seed, profile=profile)
        rows += [*killed, summary]
    return rows
