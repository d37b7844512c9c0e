"""Properties of the array engine and of the split-backward schedules (registered by
:mod:`distcheck.parallel.pp.properties`, the package's ``properties`` role).

Everything is exact (integer ticks, Fraction bubbles).

* ``pp.engine.matches_plain_replay``: :func:`distcheck.parallel.pp.replay` (the array
  engine, any implementation with its signature) gives the spans, figures and tick grid of
  the plain one-action-at-a-time replay (:mod:`distcheck.parallel.pp.plain`) on every named
  schedule's order, perturbed by swaps inside ranks and with backwards split, and the same
  DeadlockError (blocked ranks, actions, dependencies) when an order cannot finish.
* ``pp.zero_bubble.closed_forms``: each split schedule's simulated bubble (with a
  barrier and, where catalogued, steady), bubble fraction and ratio, peak activations and
  parameter copies equal the forms of :mod:`distcheck.parallel.pp.forms_zero_bubble`,
  inside their constraints.
* ``pp.zero_bubble.w_after_i``: in a schedule's order every W comes after its own I on
  the same rank, and runs after it ends (implementation: an order generator).
* ``pp.zero_bubble.stash_bound``: no rank of a schedule with a published bound (not
  torch's interleaved ZB) holds more activations than it: p (ZB-H1, Qi et al. §2.1), 2p - 1
  (ZB-H2, §2.2), 2p half-stage chunks (ZB-V, §6), PP + 1 (DualPipe, DeepSeek-V3 Table 2;
  2p + 1 stage-chunks for DualPipeV) (implementation: an order generator).
* ``pp.zero_bubble.bubble_formula``: a ZB-H1 bubble formula in (p, t_f, t_i, t_w) equals
  the simulated bubble where the published form applies (t_w <= t_f, t_i; m >= p).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from distcheck.core.errors import PropertyFailure
from distcheck.core.vocab import Schedule
from distcheck.engine.catalogue import form_value
from distcheck.engine.registry import Property, register
from distcheck.engine.runner import call_impl
from distcheck.parallel.pp import strategies as ds
from distcheck.parallel.pp.actions import Action, DeadlockError

if TYPE_CHECKING:
    from hypothesis import strategies as st

    from distcheck.parallel.pp.order import Order
    from distcheck.parallel.pp.timeline import Timeline

__all__ = ["matches_plain_replay", "zero_bubble_closed_forms", "w_after_i", "stash_bound", "zb_h1_bubble_formula",
           "bubble_formula_matches_simulator", "perturbed_order", "STASH_BOUND"]


def _replay(*args: Any, **kwargs: Any) -> Timeline:
    from distcheck.parallel.pp.simulator import replay

    return replay(*args, **kwargs)


def _order_arrays(schedule: str, p: int, m: int, v: int | None = None) -> Order:
    from distcheck.parallel.pp.schedules import order_arrays

    return order_arrays(schedule, p, m, v)


def _routes(case: ds.OrderCase) -> tuple[list[int], list[int]] | None:
    if case.schedule != Schedule.DUALPIPE:
        return None
    half = case.m // 2
    return ([0 if j < half else case.p for j in range(case.m)],
            [case.p - 1 if j < half else 2 * case.p - 1 for j in range(case.m)])


def perturbed_order(case: ds.OrderCase) -> dict[int, list]:
    """The named order of an :class:`~distcheck.parallel.pp.strategies.OrderCase`, every B split
    into I then W when ``case.split``, then ``case.swaps`` adjacent swaps inside ranks."""
    from distcheck.parallel.pp.schedules import schedule_order

    order = {r: list(a) for r, a in schedule_order(case.schedule, case.p, case.m, case.v).items()}
    if case.split:
        order = {r: [x for a in acts for x in ((Action("I", a.microbatch, a.stage), Action("W", a.microbatch, a.stage))
                                               if isinstance(a, Action) and a.kind == "B" else (a,))]
                 for r, acts in order.items()}
    rng = random.Random(case.seed)
    for _ in range(case.swaps):
        r = rng.randrange(case.p)
        if len(order[r]) > 1:
            k = rng.randrange(len(order[r]) - 1)
            order[r][k], order[r][k + 1] = order[r][k + 1], order[r][k]
    return order


def matches_plain_replay(case: ds.OrderCase, *, impl: Callable[..., Timeline] = _replay) -> None:
    """Spans, figures and grid equal the plain replay's; a deadlock is the same deadlock."""
    from distcheck.parallel.pp.plain import plain_replay

    order = perturbed_order(case)
    stages = case.v * case.p
    costs = dict(t_f=case.t_f, t_b=case.t_b)
    split = dict(t_i=case.t_b // 2, t_w=case.t_b // 2)
    t_fb = case.t_f + case.t_b
    try:
        want = plain_replay(order, stages, case.m, **costs, **split, t_fb=t_fb, routes=_routes(case))
    except DeadlockError as exc:
        try:
            impl(order, stages, case.m, **costs, t_fb=t_fb, routes=_routes(case))
        except DeadlockError as theirs:
            if theirs.blocked != exc.blocked:
                raise PropertyFailure(f"deadlock reports differ for {case}", expected=exc.blocked,
                                      got=theirs.blocked) from None
            return
        except Exception as other:  # noqa: BLE001 - a crash where a deadlock belongs is the implementation's
            raise PropertyFailure(f"the order deadlocks, the implementation raised {type(other).__name__} for {case}",
                                  expected=str(exc), got=str(other)) from None
        raise PropertyFailure(f"the plain replay deadlocks on {case}, the implementation does not", expected=str(exc),
                              got="a timeline") from None
    got = call_impl("replay", impl, order, stages, case.m, **costs, t_fb=t_fb, routes=_routes(case))
    for name in ("step_ticks", "busy_ticks", "idle_ticks", "bubble_fraction", "bubble_ratio", "peak_in_flight"):
        if getattr(got, name) != getattr(want, name):
            raise PropertyFailure(f"{name} differs from the plain replay for {case}", expected=getattr(want, name),
                                  got=getattr(got, name))
    if tuple(got.spans) != want.spans:
        first = next(i for i, (a, b) in enumerate(zip(got.spans, want.spans, strict=True)) if a != b) \
            if len(got.spans) == len(want.spans) else min(len(got.spans), len(want.spans))
        raise PropertyFailure(f"spans differ from the plain replay for {case} (first at {first})",
                              expected=want.spans[first:first + 1], got=tuple(got.spans)[first:first + 1])
    if got.num_ranks * got.step_ticks <= 4096 and tuple(got.grid) != want.grid:
        raise PropertyFailure(f"tick grid differs from the plain replay for {case}", expected="the plain grid",
                              got="another grid")


def _simulate(case: ds.ZeroBubbleCase, generator: Callable[..., Order] = _order_arrays) -> tuple[Timeline, Order]:
    from distcheck.parallel.pp.simulator import Costs, run

    order = call_impl("schedule_order", generator, case.schedule, case.p, case.m, case.v)
    costs = Costs(f=case.t_f, b=case.t_i + case.t_w, i=case.t_i, w=case.t_w,
                  fb=case.t_fb or case.t_f + case.t_i + case.t_w)
    try:
        return run(order, costs), order
    except DeadlockError as exc:
        raise PropertyFailure(f"the order of {case} cannot finish", expected="a timeline", got=str(exc)) from None


def _equal(what: str, expected: int | Fraction, got: Any, case: ds.ZeroBubbleCase) -> None:
    if Fraction(expected) != Fraction(got):
        raise PropertyFailure(f"{what} for {case}", expected=expected, got=got)


def zero_bubble_closed_forms(case: ds.ZeroBubbleCase, *, impl: Callable[..., Order] = _order_arrays) -> None:
    """Simulated bubble (barrier, steady), fraction, ratio, peak and copies == the catalogue forms."""
    tl, _ = _simulate(case, impl)
    s = case.schedule
    vals = dict(p=case.p, m=case.m, v=case.v, t_f=case.t_f, t_i=case.t_i, t_w=case.t_w, t=case.t_f, t_fb=case.t_fb)
    _equal("bubble ticks (the most any rank idles)", form_value(f"pp.bubble_ticks.{s}", **vals),
           max(tl.idle_ticks), case)
    if s in (Schedule.ZB_H2, Schedule.ZB_V):
        _equal("steady bubble (idle inside each rank's window)",
               form_value(f"pp.bubble_ticks.{s}.steady", **vals), max(tl.window_idle_ticks), case)
        _equal("steady bubble ratio", form_value(f"pp.bubble_ratio.{s}.steady", **vals),
               Fraction(max(tl.window_idle_ticks), tl.busy_ticks[0]), case)
    if s not in (Schedule.DUALPIPE, Schedule.DUALPIPEV) or case.t_fb == 3 * case.t_f:
        _equal("bubble fraction", form_value(f"pp.bubble_fraction.{s}", **vals), tl.bubble_fraction, case)
        _equal("bubble ratio", form_value(f"pp.bubble_ratio.{s}", **vals), tl.bubble_ratio, case)
    _equal("peak activations", form_value(f"pp.peak_in_flight.{s}", **vals), max(tl.peak_in_flight), case)
    if s in (Schedule.DUALPIPE, Schedule.DUALPIPEV):
        forwards = int((tl.order.kind == 0).sum())  # one F per (stage, micro-batch) of one model copy's route
        copies = Fraction(tl.num_stages * case.m, forwards)
        _equal("parameter copies", form_value(f"pp.parameter_copies.{s}", **vals), copies, case)


def w_after_i(case: ds.ZeroBubbleCase, *, impl: Callable[..., Order] = _order_arrays) -> None:
    """Every W comes after its own I on the same rank, and starts after that I ends."""
    order = call_impl("schedule_order", impl, case.schedule, case.p, case.m, case.v)
    key = order.stage * order.num_microbatches + order.microbatch
    ranks = order.ranks()
    seen_i: dict[int, tuple[int, int]] = {}
    for k in range(order.num_actions):
        kind = int(order.kind[k])
        if kind == 2:
            seen_i[int(key[k])] = (k, int(ranks[k]))
        elif kind == 3:
            at = seen_i.get(int(key[k]))
            if at is None or at[1] != ranks[k]:
                raise PropertyFailure(f"{order.action(k)} on rank {int(ranks[k])} comes before its I in {case}",
                                      expected="I earlier on the same rank", got="no I before it")
    tl, _ = _simulate(case, lambda *a: order)
    for k in (order.kind == 3).nonzero()[0].tolist():
        i = seen_i[int(key[k])][0]
        if tl.start[k] < tl.end[i]:
            raise PropertyFailure(f"{order.action(k)} starts before its I ends in {case}", expected=int(tl.end[i]),
                                  got=int(tl.start[k]))


#: published activation bounds, in (stage, micro-batch) activations per rank
STASH_BOUND: dict[str, Callable[[int], int]] = {
    Schedule.ZB_H1: lambda p: p, Schedule.ZB_H2: lambda p: 2 * p - 1, Schedule.ZB_V: lambda p: 2 * p,
    Schedule.DUALPIPE: lambda p: p + 1, Schedule.DUALPIPEV: lambda p: 2 * p + 1}


def stash_bound(case: ds.ZeroBubbleCase, *, impl: Callable[..., Order] = _order_arrays) -> None:
    """No rank holds more activations than the schedule's published bound (module docstring)."""
    tl, _ = _simulate(case, impl)
    bound = STASH_BOUND[case.schedule](case.p)
    if max(tl.peak_in_flight) > bound:
        raise PropertyFailure(f"activation stash over the published bound for {case}", expected=f"<= {bound}",
                              got=max(tl.peak_in_flight))


def zb_h1_bubble_formula(p: int, t_f: int, t_i: int, t_w: int) -> int | Fraction:
    """Reference formula: ``pp.bubble_ticks.zb_h1.published``, (p-1)(t_f + t_i - t_w) with
    t_i the input-gradient backward (Qi et al. 2023, Table 2)."""
    return form_value("pp.bubble_ticks.zb_h1.published", p=p, t_f=t_f, t_i=t_i, t_w=t_w)


def bubble_formula_matches_simulator(case: ds.ZeroBubbleCase, *,
                                     impl: Callable[..., int | Fraction] = zb_h1_bubble_formula) -> None:
    """In the published regime (t_w <= t_f, t_i; m >= p) a ZB-H1 bubble formula equals the simulated bubble."""
    tl, _ = _simulate(case)
    got = call_impl("bubble", impl, case.p, case.t_f, case.t_i, case.t_w)
    _equal("ZB-H1 bubble of the formula vs the simulator", max(tl.idle_ticks), got, case)


def _regime_h1() -> st.SearchStrategy[ds.ZeroBubbleCase]:
    return ds.zero_bubble_cases(schedules=(Schedule.ZB_H1,)).filter(lambda c: c.t_w <= min(c.t_f, c.t_i))


def _engine_edges() -> tuple[ds.OrderCase, ...]:
    """The lesson's GPipe, a 1F1B order swapped into a deadlock, DualPipe with its pairs and routes,
    ZB-V split and swapped."""
    C = ds.OrderCase
    return (C(Schedule.GPIPE, 4, 4, 1, 1, 2, 0, 0, False), C(Schedule.ONE_F_ONE_B, 2, 3, 1, 1, 2, 3, 1, False),
            C(Schedule.DUALPIPE, 4, 8, 2, 1, 2, 0, 0, False), C(Schedule.ZB_V, 2, 4, 2, 2, 4, 2, 5, True))


def _zb_edges() -> tuple[ds.ZeroBubbleCase, ...]:
    """Every split schedule at its smallest shape (one rank; DualPipe two), then p = 4 with
    t_w > t_f (ZB-H1 outside the published regime)."""
    Z = ds.ZeroBubbleCase
    return (Z(Schedule.ZB_H1, 1, 1), Z(Schedule.ZB_H2, 1, 1), Z(Schedule.INTERLEAVED_ZB, 1, 1, 2),
            Z(Schedule.ZB_V, 1, 2, 2), Z(Schedule.DUALPIPEV, 1, 2, 2, t_fb=3), Z(Schedule.DUALPIPE, 2, 4, 2, t_fb=3),
            Z(Schedule.ZB_H1, 4, 8, 1, 1, 1, 2), Z(Schedule.ZB_H2, 4, 8, 1, 1, 1, 1))


def _formula_edges() -> tuple[ds.ZeroBubbleCase, ...]:
    """Equal costs (one third of 1F1B's bubble), and t_w = t_f < t_i."""
    Z = ds.ZeroBubbleCase
    return (Z(Schedule.ZB_H1, 4, 8, 1, 1, 1, 1), Z(Schedule.ZB_H1, 3, 6, 1, 2, 3, 2))


register(Property("pp.engine.matches_plain_replay", lambda: ds.order_cases(), matches_plain_replay,
                  "array engine == plain one-action-at-a-time replay: spans, figures, grid, deadlocks (every schedule, "
                  "perturbed orders)", _replay,
                  "replay(order, num_stages, num_microbatches, t_f=, t_b=, t_fb=, routes=) -> Timeline", _engine_edges))
register(Property("pp.zero_bubble.closed_forms", lambda: ds.zero_bubble_cases(), zero_bubble_closed_forms,
                  "simulated bubble (barrier, steady), fraction, ratio, peak, copies == forms (ZB-H1, ZB-H2, "
                  "interleaved ZB, ZB-V, DualPipe, DualPipeV)", _order_arrays,
                  "order_arrays(schedule, p, m, v) -> Order", _zb_edges))
register(Property("pp.zero_bubble.w_after_i", lambda: ds.zero_bubble_cases(), w_after_i,
                  "every W after its own I on the same rank, and after that I ends", _order_arrays,
                  "order_arrays(schedule, p, m, v) -> Order", _zb_edges))
register(Property("pp.zero_bubble.stash_bound", lambda: ds.zero_bubble_cases(schedules=tuple(STASH_BOUND)),
                  stash_bound, "peak activations within the published bound (p, 2p-1, 2p chunks, PP+1)", _order_arrays,
                  "order_arrays(schedule, p, m, v) -> Order",
                  lambda: tuple(c for c in _zb_edges() if c.schedule in STASH_BOUND)))
register(Property("pp.zero_bubble.bubble_formula", _regime_h1, bubble_formula_matches_simulator,
                  "ZB-H1 bubble formula == simulated bubble where the published form applies (t_w <= t_f, t_i)",
                  zb_h1_bubble_formula, "bubble(p, t_f, t_i, t_w) -> int", _formula_edges))
