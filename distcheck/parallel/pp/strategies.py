"""Hypothesis strategies of pipeline schedules: (schedule, p, m, v, t_f, t_b) respecting each
schedule's constraints; split-backward schedules with their costs (t_f, t_i, t_w, t_fb);
orders of the named schedules perturbed (swaps within ranks, backwards split).

Public path: :mod:`distcheck.strategies` (Hypothesis' conventions are listed there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from distcheck.core.validate import check_interval, check_subset
from distcheck.core.vocab import Schedule, names
from distcheck.engine.strategies import defines

__all__ = ["PipelineParams", "pipeline_params", "ZeroBubbleCase", "zero_bubble_cases", "OrderCase", "order_cases"]

#: the schedules :func:`pipeline_params` may draw: full backward, closed forms in (p, m, v, t_f, t_b)
SCHEDULES = (Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED, Schedule.LOOPED_BFS)
#: its default: the three schedules of the lesson and of Narayanan et al. 2021
DEFAULT_SCHEDULES = SCHEDULES[:3]
#: the schedules of :func:`zero_bubble_cases`: the backward split into I and W
ZB_SCHEDULES = (Schedule.ZB_H1, Schedule.ZB_H2, Schedule.INTERLEAVED_ZB, Schedule.ZB_V, Schedule.DUALPIPE,
                Schedule.DUALPIPEV)
_ALL = names(Schedule)


@dataclass(frozen=True)
class PipelineParams:
    """Inputs of :func:`distcheck.parallel.pp.simulate` and the ``pp.*`` closed forms."""

    schedule: str
    p: int
    m: int
    v: int = 1
    t_f: int = 1
    t_b: int = 2

    def as_kwargs(self) -> dict:
        return dict(schedule=self.schedule, p=self.p, m=self.m, v=self.v, t_f=self.t_f, t_b=self.t_b)


def _interleaved_stages(min_stages: int, max_stages: int, min_microbatches: int, max_microbatches: int) -> list[int]:
    return [p for p in range(min_stages, max_stages + 1) if -(-min_microbatches // p) * p <= max_microbatches]


def _v_pipeline_params(*, schedules: Sequence[str], min_stages: int, max_stages: int, min_microbatches: int,
                       max_microbatches: int, min_v: int, max_v: int,
                       min_t_f: int, max_t_f: int, min_t_b: int, max_t_b: int) -> None:
    chosen = check_subset("schedules", schedules, SCHEDULES)
    check_interval("min_stages", min_stages, "max_stages", max_stages)
    check_interval("min_microbatches", min_microbatches, "max_microbatches", max_microbatches)
    check_interval("min_v", min_v, "max_v", max_v, at_least=2)
    check_interval("min_t_f", min_t_f, "max_t_f", max_t_f)
    check_interval("min_t_b", min_t_b, "max_t_b", max_t_b)
    if chosen == (Schedule.INTERLEAVED,) and not _interleaved_stages(min_stages, max_stages, min_microbatches,
                                                                     max_microbatches):
        raise InvalidArgument(
            "the interleaved schedule needs m to be a multiple of p, and no m in "
            f"[min_microbatches={min_microbatches}, max_microbatches={max_microbatches}] is a multiple of any p in "
            f"[min_stages={min_stages}, max_stages={max_stages}]"
        )


@defines(_v_pipeline_params)
def pipeline_params(
    draw: st.DrawFn,
    *,
    schedules: tuple[str, ...] = DEFAULT_SCHEDULES,
    min_stages: int = 1, max_stages: int = 8,
    min_microbatches: int = 1, max_microbatches: int = 16,
    min_v: int = 2, max_v: int = 4,
    min_t_f: int = 1, max_t_f: int = 3,
    min_t_b: int = 1, max_t_b: int = 6,
) -> PipelineParams:
    """A :class:`PipelineParams` respecting its schedule's constraints.

    - ``schedules``: subset of ("gpipe", "1f1b", "interleaved", "looped_bfs"); default the
      first three.
    - gpipe/1f1b: v = 1, any p, m. interleaved: v in [min_v, max_v] (>= 2) and
      m a multiple of p (Narayanan et al. 2021 §2.2.2); an interleaved draw whose
      ranges admit no such (p, m) falls back to another schedule. looped_bfs: v in
      [1, max_v], any p, m.
    - ``t_f``, ``t_b``: integer ticks per forward / backward (defaults 1..3, 1..6).
    """
    feasible = _interleaved_stages(min_stages, max_stages, min_microbatches, max_microbatches)
    options = tuple(s for s in schedules if s != Schedule.INTERLEAVED or feasible)
    schedule = draw(st.sampled_from(options))
    t_f = draw(st.integers(min_t_f, max_t_f))
    t_b = draw(st.integers(min_t_b, max_t_b))
    if schedule == Schedule.INTERLEAVED:
        p = draw(st.sampled_from(feasible))
        k = draw(st.integers(-(-min_microbatches // p), max_microbatches // p))
        return PipelineParams(schedule, p, k * p, draw(st.integers(min_v, max_v)), t_f, t_b)
    p = draw(st.integers(min_stages, max_stages))
    m = draw(st.integers(min_microbatches, max_microbatches))
    v = draw(st.integers(1, max_v)) if schedule == Schedule.LOOPED_BFS else 1
    return PipelineParams(schedule, p, m, v, t_f, t_b)


@dataclass(frozen=True)
class ZeroBubbleCase:
    """A split-backward schedule and its costs (ticks): ``t_f`` forward, ``t_i`` input-gradient
    and ``t_w`` weight-gradient backward, ``t_fb`` an overlapped pair (DualPipe(V); None: none).
    ``v`` stages per rank (2 for the V schedules)."""

    schedule: str
    p: int
    m: int
    v: int = 1
    t_f: int = 1
    t_i: int = 1
    t_w: int = 1
    t_fb: int | None = None


def _v_zero_bubble_cases(*, schedules: Sequence[str], max_stages: int, max_cost: int) -> None:
    check_subset("schedules", schedules, ZB_SCHEDULES)
    check_interval("min_stages", 1, "max_stages", max_stages)
    check_interval("min_cost", 1, "max_cost", max_cost)
    if tuple(schedules) == (Schedule.DUALPIPE,) and max_stages < 2:
        raise InvalidArgument(f"dualpipe needs an even p >= 2; max_stages={max_stages} allows none")


@defines(_v_zero_bubble_cases)
def zero_bubble_cases(draw: st.DrawFn, *, schedules: tuple[str, ...] = ZB_SCHEDULES, max_stages: int = 6,
                      max_cost: int = 4) -> ZeroBubbleCase:
    """A :class:`ZeroBubbleCase` inside its closed forms' constraints
    (:mod:`distcheck.parallel.pp.forms_zero_bubble`): m >= p for ZB-H1 and interleaved ZB
    (m a multiple of its rounds), m >= 2p - 1 for ZB-H2, m >= 2p for ZB-V and DualPipe(V) (p
    and m even for DualPipe); any costs in [1, max_cost] for ZB-H1, ZB-H2 and interleaved ZB;
    equal costs t and 2t <= t_fb <= 3t for ZB-V and DualPipe(V)."""
    options = tuple(s for s in schedules if s != Schedule.DUALPIPE or max_stages >= 2)
    s = draw(st.sampled_from(options))
    if s == Schedule.DUALPIPE:
        p = 2 * draw(st.integers(1, max_stages // 2))
        m = 2 * draw(st.integers(p, 3 * p))
    else:
        p = draw(st.integers(1, max_stages))
        least: dict[str, int] = {Schedule.ZB_H1: p, Schedule.INTERLEAVED_ZB: p, Schedule.ZB_H2: 2 * p - 1}
        lo = least.get(s, 2 * p)
        m = draw(st.integers(lo, lo + 3 * p))
    if s == Schedule.INTERLEAVED_ZB:
        rounds = max(1, m // p)
        m = m - m % rounds if m - m % rounds >= p else p
    v = 2 if s in (Schedule.ZB_V, Schedule.DUALPIPE, Schedule.DUALPIPEV) else \
        (draw(st.integers(1, 3)) if s == Schedule.INTERLEAVED_ZB else 1)
    if s in (Schedule.ZB_H1, Schedule.ZB_H2, Schedule.INTERLEAVED_ZB):
        return ZeroBubbleCase(s, p, m, v, draw(st.integers(1, max_cost)), draw(st.integers(1, max_cost)),
                              draw(st.integers(1, max_cost)))
    t = draw(st.integers(1, max(1, max_cost // 2)))
    t_fb = draw(st.integers(2 * t, 3 * t)) if s != Schedule.ZB_V else None
    return ZeroBubbleCase(s, p, m, v, t, t, t, t_fb)


@dataclass(frozen=True)
class OrderCase:
    """A named schedule's order, perturbed: ``swaps`` adjacent swaps inside ranks (drawn with
    ``seed``), and, with ``split``, every full backward B replaced by I then W."""

    schedule: str
    p: int
    m: int
    v: int
    t_f: int
    t_b: int
    swaps: int
    seed: int
    split: bool


def _v_order_cases(*, max_stages: int, max_swaps: int) -> None:
    check_interval("min_stages", 1, "max_stages", max_stages)
    check_interval("min_swaps", 0, "max_swaps", max_swaps, at_least=0)


@defines(_v_order_cases)
def order_cases(draw: st.DrawFn, *, max_stages: int = 5, max_swaps: int = 3) -> OrderCase:
    """An :class:`OrderCase` of any schedule of :data:`distcheck.parallel.pp.SCHEDULES` (its own
    constraints on p and m), costs t_f in [1, 3] and an even t_b in [2, 6]. Swapped orders
    may deadlock: that is part of what they test."""
    s = draw(st.sampled_from(_ALL))
    p = draw(st.integers(1, max_stages))
    if s == Schedule.DUALPIPE:
        p += p % 2
    chunks: dict[str, int] = {Schedule.INTERLEAVED: draw(st.integers(2, 3)),
                              Schedule.LOOPED_BFS: draw(st.integers(1, 3)),
                              Schedule.INTERLEAVED_ZB: draw(st.integers(1, 3))}
    v = chunks.get(s, 2 if s in (Schedule.ZB_V, Schedule.DUALPIPE, Schedule.DUALPIPEV) else 1)
    if s == Schedule.INTERLEAVED:
        m = p * draw(st.integers(1, 3))
    elif s in (Schedule.DUALPIPE, Schedule.DUALPIPEV):
        m = 2 * p + 2 * draw(st.integers(0, 2))
    elif s == Schedule.INTERLEAVED_ZB:
        m = p * draw(st.integers(1, 3))
    else:
        m = draw(st.integers(1, 8))
    return OrderCase(s, p, m, v, draw(st.integers(1, 3)), 2 * draw(st.integers(1, 3)), draw(st.integers(0, max_swaps)),
                     draw(st.integers(0, 2**16)), draw(st.booleans()))
