"""Known-wrong implementations (mutants) and the machinery that kills them.

A mutant is a small function with the same signature as the implementation slot of one
property, carrying one mistake that real code makes. The parallelism packages' ``mutants``
modules register theirs with the :func:`mutant` decorator; :func:`kill_mutants` runs each
mutant's property with the mutant as ``impl`` and expects it to FAIL on the property's own
claim (a wrong value, bound or count), with a shrunk counterexample. A mutant that survives
means the property is too weak; a mutant that raises is *broken* (a crash proves nothing
about the property). Either way ``distcheck check`` FAILs the "mutants killed k/n" row
(:func:`mutant_summary`) and names it. Every registered property must kill at least one
mutant on its own claim: that row also counts the "properties without a mutant" and FAILs
unless there are none.

A mutant's public path is ``distcheck.mutants.<function name>``: the decorator sets the
function's ``__module__`` to it, so the ``reproduce`` line of a row, ``repr`` and pickling
all name the path a user imports it from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from distcheck.core.results import FAIL, PASS, CheckResult
from distcheck.engine.discovery import role_modules
from distcheck.engine.registry import get
from distcheck.engine.runner import resolve_seed, run_property

__all__ = ["Mutant", "PUBLIC_MODULE", "mutant", "registry", "mutants", "kill_mutant", "kill_mutants", "mutant_summary"]

#: the module users import every mutant function from (``from distcheck.mutants import plain_mean_unequal``)
PUBLIC_MODULE = "distcheck.mutants"

_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Mutant:
    """A known-wrong implementation and the property that must kill it.

    ``name`` (``"<suite>.<mistake>"``), ``function`` (the wrong implementation), ``kills``
    (the property's name), ``description`` (the first line of the function's docstring).
    """

    name: str
    function: Callable[..., Any]
    kills: str
    description: str


_REGISTRY: dict[str, Mutant] = {}
_loaded = False


def mutant(name: str, kills: str) -> Callable[[_F], _F]:
    """Decorator: register the function as the mutant ``name`` that property ``kills`` must kill.

    The first line of the function's docstring is the mutant's description. Raises ValueError
    when another function is registered under the same name."""

    def register(fn: _F) -> _F:
        if name in _REGISTRY and _REGISTRY[name].function is not fn:
            raise ValueError(f"mutant {name!r} registered twice")
        fn.__module__ = PUBLIC_MODULE
        _REGISTRY[name] = Mutant(name, fn, kills, (fn.__doc__ or "").strip().split("\n")[0])
        return fn

    return register


def registry() -> dict[str, Mutant]:
    """The registry itself, name -> :class:`Mutant`, after every package's ``mutants`` module
    has been imported (the same dict object on every call)."""
    global _loaded
    if not _loaded:
        role_modules("mutants")
        _loaded = True
    return _REGISTRY


def mutants() -> list[Mutant]:
    """Every registered mutant, sorted by name."""
    found = registry()
    return [found[n] for n in sorted(found)]


def kill_mutant(mutant: Mutant | str, profile: str = "ci", *, seed: int | None = None,
                shrink: bool = True, edge_cases: bool = True) -> CheckResult:
    """Run ``mutant.kills`` with the mutant as the implementation.

    Returns a CheckResult with ``check = "mutant:<name>"`` and ``extra["outcome"]``:

    - ``"killed"`` (verdict ``pass``): the property FAILED on its own claim (a wrong value,
      bound or count; ``failure_kind == "claim"``). ``detail`` = the reason and the shrunk
      counterexample.
    - ``"broken"`` (verdict ``FAIL``): the run failed some other way: the mutant raised
      (``ImplementationError``, e.g. a ZeroDivisionError or a call with the wrong
      signature), broke the slot's contract, or the property's code raised on what it
      returned. A crash proves nothing about the property: the mutant must be fixed.
    - ``"survived"`` (verdict ``FAIL``): the property held on every example.

    ``seed`` is the run seed (:func:`distcheck.engine.runner.resolve_seed`); the property runs
    with Hypothesis seed ``example_seed(seed, "mutant:<name>")``, so the same profile and seed
    give the same row. The property tries its edge cases first (``extra["found_by"]`` says
    whether an edge case or a generated example killed the mutant); ``edge_cases=False``
    leaves them out, to show what the generated search alone finds. ``shrink=False`` stops at
    the first failing example (to scan many seeds quickly). ``extra`` also holds the property
    run's extra (counterexample, error, failure_kind, reproduce_failure, seed,
    examples_until_failure, shrink_calls) plus ``killed``, ``property``, ``reproduce`` (a
    ``kill_mutant`` call with the seed) and, for a catalogue mutant, ``replay`` (the
    ``distcheck check`` command). Raises KeyError for an unknown mutant name.
    """
    if isinstance(mutant, str):
        mutant = registry()[mutant]
    run = run_property(get(mutant.kills), profile, impl=mutant.function, seed=seed, label=f"mutant:{mutant.name}",
                       shrink=shrink, edge_cases=edge_cases)
    if run.verdict == PASS:
        outcome = "survived"
        detail = f"SURVIVED {run.examples} examples of {mutant.kills}: {mutant.description}"
    elif run.extra.get("failure_kind") == "claim":
        outcome = "killed"
        detail = f"killed by {mutant.kills}: {run.detail}"
    else:
        outcome = "broken"
        detail = f"BROKEN (not a kill of {mutant.kills}): {run.detail}"
    replay = f"kill_mutant({mutant.name!r}, profile={profile!r}, seed={run.extra['seed']})"
    extra = dict(run.extra, killed=outcome == "killed", outcome=outcome, property=mutant.kills, mutant=mutant.name,
                 reproduce=replay)
    if registry().get(mutant.name) is mutant:  # a catalogue mutant: distcheck check replays it
        extra["replay"] = f"distcheck check --only properties --profile {profile} --seed {run.extra['seed']}"
    return CheckResult(check=f"mutant:{mutant.name}", backend="reference",
                       verdict=PASS if outcome == "killed" else FAIL, world_size=1, examples=run.examples,
                       max_error=run.max_error, bound=run.bound, detail=detail, extra=extra)


def kill_mutants(profile: str = "ci", *, seed: int | None = None) -> list[CheckResult]:
    """Run every mutant (see :func:`kill_mutant`) with one run seed (:func:`resolve_seed`);
    one row each, sorted by mutant name."""
    seed = resolve_seed(profile, seed)
    return [kill_mutant(m, profile, seed=seed) for m in mutants()]


def mutant_summary(rows: Iterable[CheckResult], properties: Iterable[str] | None = None) -> CheckResult:
    """One row "mutants killed k/n; properties without a mutant: m" over the rows of :func:`kill_mutants`.

    Only a kill counts (``extra["outcome"] == "killed"``, or a ``pass`` row without an
    outcome); broken mutants (the implementation raised) and survivors are named. Every
    property must also be shown failing: ``properties`` (default: the name of every
    registered property, :func:`distcheck.engine.registry.properties`) lists those that need
    a kill, and a property that no row (``extra["property"]``) kills is *without a mutant*:
    counted, named (``extra["without_mutant"]``), and a FAIL of the row. The row FAILs unless
    every mutant was killed and no property is without a mutant.
    """
    from distcheck.engine.registry import properties as registered

    rows = list(rows)
    needed = sorted({p.name for p in registered()} if properties is None else set(properties))

    def outcome(r: CheckResult) -> str:
        return str(r.extra.get("outcome", "killed" if r.verdict == PASS else "survived"))

    killed = sum(1 for r in rows if outcome(r) == "killed")
    shown = {r.extra.get("property") for r in rows if outcome(r) == "killed"}
    without = [n for n in needed if n not in shown]
    named = {kind: [r.check.removeprefix("mutant:") for r in rows if outcome(r) == kind]
             for kind in ("broken", "survived")}
    detail = (f"mutants killed {killed}/{len(rows)}; properties without a mutant: {len(without)}"
              + (f" ({', '.join(without)})" if without else "")
              + "".join(f"; {kind}: {', '.join(names)}" for kind, names in named.items() if names))
    ok = bool(rows) and killed == len(rows) and not without
    return CheckResult(check="mutants", backend="reference", verdict=PASS if ok else FAIL,
                       examples=sum(r.examples for r in rows), detail=detail,
                       extra={"killed": killed, "total": len(rows), "without_mutant": without, **named})
