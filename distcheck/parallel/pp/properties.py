"""Pipeline properties: the tick simulator against the closed forms, for every schedule.

Everything is exact (integer ticks, Fraction bubbles). Implementation slots:
``simulate(schedule, p, m, v, t_f, t_b) -> Timeline`` (:func:`distcheck.parallel.pp.simulate`)
``bubble_fraction(schedule, p, m, v) -> Fraction`` (the catalogue's
``pp.bubble_fraction.<schedule>``) and ``peak_in_flight(schedule, p, m, v) -> int``
(``pp.peak_in_flight.<schedule>``).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from distcheck.core.errors import PropertyFailure
from distcheck.core.vocab import Schedule
from distcheck.engine.catalogue import form_value as _form
from distcheck.engine.registry import Property, register
from distcheck.engine.runner import call_impl
from distcheck.parallel.pp import strategies as ds

if TYPE_CHECKING:
    from distcheck.parallel.pp.timeline import Timeline

__all__ = ["simulator_matches_closed_forms", "bubble_fraction_formula", "formula_matches_simulator", "stash_formula",
           "stash_formula_matches_simulator"]


def _equal(what: str, expected: int | Fraction, got: Any, params: ds.PipelineParams) -> None:
    if Fraction(expected) != Fraction(got):
        raise PropertyFailure(f"{what} for {params}", expected=expected, got=got)


def _simulate(*args: Any, **kwargs: Any) -> Timeline:
    from distcheck.parallel.pp.reference import simulate

    return simulate(*args, **kwargs)


def simulator_matches_closed_forms(pp: ds.PipelineParams, *, impl: Callable[..., Timeline] = _simulate) -> None:
    """step_ticks, busy ticks per rank, bubble_fraction, bubble_ratio and the activation
    stash equal the closed forms ``pp.*.<schedule>``; the two bubble conventions
    satisfy fraction = ratio / (1 + ratio); GPipe stashes m, 1F1B at most p."""
    tl = call_impl("simulate", impl, pp.schedule, pp.p, pp.m, pp.v, pp.t_f, pp.t_b)
    vals = dict(p=pp.p, m=pp.m, v=pp.v, t_f=pp.t_f, t_b=pp.t_b)
    s = pp.schedule
    _equal("step_ticks", _form(f"pp.step_ticks.{s}", **vals), tl.step_ticks, pp)
    busy = _form("pp.busy_ticks", **vals)
    for rank, b in enumerate(tl.busy_ticks):
        _equal(f"busy_ticks of rank {rank}", busy, b, pp)
    _equal("bubble_fraction", _form(f"pp.bubble_fraction.{s}", **vals), tl.bubble_fraction, pp)
    _equal("bubble_ratio", _form(f"pp.bubble_ratio.{s}", **vals), tl.bubble_ratio, pp)
    ratio = Fraction(tl.bubble_ratio)
    _equal("bubble_fraction vs ratio/(1+ratio)", ratio / (1 + ratio), tl.bubble_fraction, pp)
    _equal("peak_in_flight", _form(f"pp.peak_in_flight.{s}", **vals), max(tl.peak_in_flight), pp)
    if s == Schedule.GPIPE and tl.peak_in_flight[0] != pp.m:
        raise PropertyFailure(f"GPipe rank 0 must stash all m micro-batches for {pp}", expected=pp.m,
                              got=tl.peak_in_flight[0])
    if s == Schedule.ONE_F_ONE_B and max(tl.peak_in_flight) > pp.p:
        raise PropertyFailure(f"1F1B must stash at most p micro-batches for {pp}", expected=f"<= {pp.p}",
                              got=max(tl.peak_in_flight))


def bubble_fraction_formula(schedule: str, p: int, m: int, v: int = 1) -> Fraction:
    """Reference formula: the catalogue's ``pp.bubble_fraction.<schedule>`` (idle / total)."""
    return Fraction(_form(f"pp.bubble_fraction.{schedule}", p=p, m=m, v=v))


def formula_matches_simulator(pp: ds.PipelineParams, *,
                              impl: Callable[..., Fraction] = bubble_fraction_formula) -> None:
    """A bubble-fraction formula (idle / TOTAL time) must equal the simulated fraction exactly."""
    got = call_impl("bubble_fraction", impl, pp.schedule, pp.p, pp.m, pp.v)
    tl = _simulate(pp.schedule, pp.p, pp.m, pp.v, pp.t_f, pp.t_b)
    _equal("bubble fraction (idle / total) of the formula vs the simulator", tl.bubble_fraction, got, pp)


def stash_formula(schedule: str, p: int, m: int, v: int = 1) -> int:
    """Reference formula: the catalogue's ``pp.peak_in_flight.<schedule>`` (GPipe m,
    1F1B min(p, m), interleaved min((v+1) p - 1, v m); Narayanan et al. 2021 §2.2)."""
    return int(_form(f"pp.peak_in_flight.{schedule}", p=p, m=m, v=v))


def stash_formula_matches_simulator(pp: ds.PipelineParams, *, impl: Callable[..., int] = stash_formula) -> None:
    """An activation-stash formula (peak micro-batches, or chunks, in flight on the busiest
    rank) must equal the simulated peak exactly; m < p is where a formula without min(p, m) breaks."""
    got = call_impl("peak_in_flight", impl, pp.schedule, pp.p, pp.m, pp.v)
    tl = _simulate(pp.schedule, pp.p, pp.m, pp.v, pp.t_f, pp.t_b)
    _equal("peak in flight of the formula vs the simulator", max(tl.peak_in_flight), got, pp)


def _edges() -> tuple[ds.PipelineParams, ...]:
    """One stage (no bubble); fewer micro-batches than stages (m < p: the stash is m, not p);
    interleaved with v m below (v + 1) p - 1; the lesson's GPipe p = 4, m = 4 (bubble 3/7); 1F1B with
    more micro-batches than stages (m > p: the stash stops at p, GPipe's would be m)."""
    P = ds.PipelineParams
    return (P(Schedule.GPIPE, 1, 1, 1, 1, 2), P(Schedule.ONE_F_ONE_B, 2, 1, 1, 1, 2),
            P(Schedule.ONE_F_ONE_B, 4, 2, 1, 1, 2), P(Schedule.INTERLEAVED, 2, 2, 2, 1, 2),
            P(Schedule.GPIPE, 4, 4, 1, 1, 2), P(Schedule.ONE_F_ONE_B, 2, 4, 1, 1, 2))


register(Property(
    "pp.simulator.closed_forms",
    lambda: ds.pipeline_params(schedules=ds.SCHEDULES),
    simulator_matches_closed_forms,
    "simulator == closed forms (step, busy, both bubble conventions, stash) for gpipe, 1f1b, interleaved, looped_bfs",
    _simulate, "simulate(schedule, p, m, v, t_f, t_b) -> Timeline", _edges,
))
register(Property(
    "pp.bubble_fraction.formula",
    lambda: ds.pipeline_params(),
    formula_matches_simulator,
    "bubble-fraction formula (idle / total) == simulated idle / total, exactly",
    bubble_fraction_formula, "bubble_fraction(schedule, p, m, v=1) -> Fraction", _edges,
))
register(Property(
    "pp.stash.formula",
    lambda: ds.pipeline_params(),
    stash_formula_matches_simulator,
    "activation-stash formula (peak in flight) == simulated peak, exactly (incl. m < p)",
    stash_formula, "peak_in_flight(schedule, p, m, v=1) -> int", _edges,
))


# the engine's and the split-backward schedules' properties register themselves on import
from distcheck.parallel.pp import properties_zero_bubble  # noqa: E402, F401
