"""Mutants of the pipeline's accounting, its engine and its zero-bubble schedules.

=================================  ==============================================  ====================================
mutant                             mistake                                         killed by
=================================  ==============================================  ====================================
pp.ratio_as_fraction         (p-1)/m (idle relative to IDEAL time)           pp.bubble_fraction.formula
                                   labelled as idle / total
pp.stash_ignores_m           1F1B stash taken as p, without min(p, m)        pp.stash.formula (m < p)
pp.engine_single_sweep       the array engine stopped after one sweep up     pp.engine.matches_plain_replay
                                   the ranks (backwards wait on later ranks)
pp.zb_w_before_i             every weight pass moved just before its own     pp.zero_bubble.w_after_i
                                   input pass (W before B)
pp.zb_b_as_full_backward     ZB-H1 bubble from DeepSeek's (PP-1)(F+B-2W),    pp.zero_bubble.bubble_formula
                                   whose B is the FULL backward, fed the
                                   input-gradient cost
pp.zb_h1_w_deferred          ZB-H1 holding every weight pass to the end      pp.zero_bubble.stash_bound
                                   (a smaller bubble, but m activations stashed)
pp.1f1b_as_gpipe             1F1B simulated with GPipe's order (all          pp.simulator.closed_forms
                                   forwards first): m activations stashed, not
                                   min(p, m)
pp.zb_h2_as_h1               ZB-H2 served with ZB-H1's order (no extra       pp.zero_bubble.closed_forms
                                   warm-up forwards): the bubble stays
=================================  ==============================================  ====================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from distcheck.core.vocab import Schedule
from distcheck.engine.mutants import mutant

if TYPE_CHECKING:
    from distcheck.parallel.pp.order import Order
    from distcheck.parallel.pp.simulator import _Units
    from distcheck.parallel.pp.timeline import Timeline

__all__ = ["bubble_ratio_as_fraction", "stash_ignores_few_microbatches", "replay_single_sweep", "order_w_before_i",
           "zb_h1_bubble_b_as_full", "order_w_deferred", "simulate_1f1b_as_gpipe", "order_zb_h2_as_h1"]


@mutant("pp.ratio_as_fraction", "pp.bubble_fraction.formula")
def bubble_ratio_as_fraction(schedule: str, p: int, m: int, v: int = 1) -> Fraction:
    """(p-1)/m (idle relative to IDEAL time; (p-1)/(v m) interleaved) labelled as idle / total."""
    return Fraction(p - 1, v * m)


@mutant("pp.stash_ignores_m", "pp.stash.formula")
def stash_ignores_few_microbatches(schedule: str, p: int, m: int, v: int = 1) -> int:
    """Activation stash of 1F1B taken as p micro-batches (interleaved: (v+1) p - 1 chunks) without
    the min with m (v m): too many when there are fewer micro-batches than stages (m < p)."""
    if schedule in (Schedule.GPIPE, Schedule.LOOPED_BFS):
        return v * m
    return p if schedule == Schedule.ONE_F_ONE_B else (v + 1) * p - 1


@mutant("pp.engine_single_sweep", "pp.engine.matches_plain_replay")
def replay_single_sweep(order: Mapping[int, Sequence[Any]] | Sequence[Sequence[Any]], num_stages: int,
                        num_microbatches: int, t_f: int = 1, t_b: int = 2, *, t_fb: int | None = None,
                        routes: tuple[ArrayLike, ArrayLike] | None = None) -> Timeline:
    """The array engine stopped after one sweep up the ranks, without the sweep that proves the
    result: a backward that waits on a later rank starts too early."""
    from distcheck.parallel.pp import simulator
    from distcheck.parallel.pp.order import compile_order

    compiled = compile_order(order, num_stages, num_microbatches, routes)
    split = bool((compiled.kind >= 2).any())
    costs = simulator.Costs(f=t_f, b=t_b, i=t_b // 2 if split else 1, w=t_b // 2 if split else 1, fb=t_fb)
    real = simulator.MAX_SWEEPS
    simulator.MAX_SWEEPS = 1
    try:
        rank_of = compiled.ranks()
        idx_f, idx_bk, idx_i, idx_w, placed = simulator.check_order(compiled, rank_of)
        deps = simulator.dependencies(compiled, idx_f, idx_bk, idx_i, idx_w)
        units = simulator._units(compiled, deps, costs, rank_of)
        end = simulator._sweeps(units, placed, 2**61)
    finally:
        simulator.MAX_SWEEPS = real
    if end is None:  # one sweep never settles: keep what it computed
        end = _one_sweep(units)
    start = end - units.cost
    if units.unit_of is not None:
        start, end = start[units.unit_of], end[units.unit_of]
    return simulator.Timeline(compiled, rank_of, start, end, units.cost, units.rank, units.paired)


def _one_sweep(u: _Units) -> np.ndarray:
    end = np.zeros(u.count + 1, np.int64)
    deps = np.where(u.deps >= 0, u.deps, u.count)
    incl = np.cumsum(u.cost)
    for a, b in zip(u.offsets[:-1].tolist(), u.offsets[1:].tolist(), strict=True):
        if b > a:
            d = end[deps[a:b]].max(axis=1) - (incl[a:b] - u.cost[a:b])
            end[a:b] = np.maximum.accumulate(d) + incl[a:b]
    return end[:-1]


def _reordered(o: Order, index: np.ndarray) -> Order:
    return replace(o, kind=o.kind[index], stage=o.stage[index], microbatch=o.microbatch[index],
                   overlap=o.overlap[index])


@mutant("pp.zb_w_before_i", "pp.zero_bubble.w_after_i")
def order_w_before_i(schedule: str, p: int, m: int, v: int | None = None) -> Order:
    """The schedule's order with every weight pass moved to just before its own input pass."""
    from distcheck.parallel.pp.schedules import order_arrays

    o = order_arrays(schedule, p, m, v)
    key = o.stage * m + o.microbatch
    w_of = {int(key[k]): k for k in np.flatnonzero(o.kind == 3).tolist()}
    out = []
    for k in range(o.num_actions):
        if o.kind[k] == 3:
            continue
        if o.kind[k] == 2 and int(key[k]) in w_of:
            out.append(w_of[int(key[k])])
        out.append(k)
    return _reordered(o, np.asarray(out, np.int64))


@mutant("pp.zb_b_as_full_backward", "pp.zero_bubble.bubble_formula")
def zb_h1_bubble_b_as_full(p: int, t_f: int, t_i: int, t_w: int) -> int:
    """ZB-H1 bubble as (p-1)(t_f + t_i - 2 t_w): DeepSeek's ZB1P formula, whose B is the FULL
    backward, fed the input-gradient cost t_i."""
    return (p - 1) * (t_f + t_i - 2 * t_w)


@mutant("pp.zb_h1_w_deferred", "pp.zero_bubble.stash_bound")
def order_w_deferred(schedule: str, p: int, m: int, v: int | None = None) -> Order:
    """The schedule's order with every weight pass held back until the rank's input passes are done."""
    from distcheck.parallel.pp.schedules import order_arrays

    o = order_arrays(schedule, p, m, v)
    out = []
    for lo, hi in zip(o.offsets[:-1].tolist(), o.offsets[1:].tolist(), strict=True):
        k = np.arange(lo, hi)
        out.append(np.concatenate([k[o.kind[k] != 3], k[o.kind[k] == 3]]))
    return _reordered(o, np.concatenate(out))


@mutant("pp.1f1b_as_gpipe", "pp.simulator.closed_forms")
def simulate_1f1b_as_gpipe(schedule: str, p: int, m: int, v: int = 1, t_f: int = 1, t_b: int = 2) -> Timeline:
    """1F1B simulated with GPipe's order (every forward before any backward): the same step time,
    but each rank stashes all m micro-batches instead of min(p, m)."""
    from distcheck.parallel.pp.reference import simulate

    return simulate(Schedule.GPIPE if schedule == Schedule.ONE_F_ONE_B else schedule, p, m, v, t_f, t_b)


@mutant("pp.zb_h2_as_h1", "pp.zero_bubble.closed_forms")
def order_zb_h2_as_h1(schedule: str, p: int, m: int, v: int | None = None) -> Order:
    """ZB-H2 served with ZB-H1's order: without ZB-H2's extra warm-up forwards the bubble it removes stays."""
    from distcheck.parallel.pp.schedules import order_arrays

    return order_arrays(Schedule.ZB_H1 if schedule == Schedule.ZB_H2 else schedule, p, m, v)
