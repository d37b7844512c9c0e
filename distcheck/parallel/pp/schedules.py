"""The named schedules: their shapes, their stage placement, their orders (as arrays), and ``simulate``.

========================  ======  ===============================  =============================================
schedule                  v       constraints                      source of the order
========================  ======  ===============================  =============================================
``gpipe``                 1       any p, m                         Huang et al. 2019 (GPipe)
``1f1b``                  1       any p, m                         Narayanan et al. 2021 §2.2.1 (PipeDream-Flush)
``interleaved``           >= 2    m % p == 0                       Narayanan et al. 2021 §2.2.2 (Megatron-LM)
``looped_bfs``            >= 1    any p, m                         Lamy-Poirier 2023 (breadth-first); torch's
                                                                   ScheduleLoopedBFS (backwards last micro-batch first)
``zb_h1``                 1       any p, m                         Qi et al. 2023 §2.1 (:mod:`.zero_bubble`)
``zb_h2``                 1       any p, m                         Qi et al. 2023 §2.2
``interleaved_zb``        >= 1    m % max(1, m // p) == 0          torch's ScheduleInterleavedZeroBubble
``zb_v``                  2       any p, m                         Qi et al. 2023 §6 (ZB-V)
``dualpipe``              2       p even, m even, m >= 2p          DeepSeek-V3 report §3.2.1 (:mod:`.dualpipe`)
``dualpipev``             2       m >= 2p                          the DualPipe repository (DualPipeV)
========================  ======  ===============================  =============================================

``v`` is the number of stages (model chunks) each rank holds; None picks the schedule's
own (2 for the interleaved ones). Placement: "loop" (stage ``c * p + r`` on rank ``r``,
Megatron-LM's and torch's) or "v" (rank ``r`` holds stages ``r`` and ``2p - 1 - r``).
The split schedules (:data:`SPLIT_BACKWARD`) run the backward as ``I`` then ``W``;
DualPipe and DualPipeV also run overlapped forward + full backward pairs.

Costs (:func:`simulate`, the convention of :func:`distcheck.parallel.pp.replay`): ``t_f`` one
forward of one stage, ``t_b`` one FULL backward, ``t_i``/``t_w`` its input- and
weight-gradient parts (default ``t_b / 2`` each: the zero-bubble papers' ``T_F = T_B = T_W``
at the defaults 1 and 2), ``t_fb`` an overlapped pair (default ``t_f + t_b``: no gain).
Qi et al. write ``T_B`` for the input-gradient part (``t_i`` here); DeepSeek-V3's Table 2
writes ``B`` for the full backward (``t_b`` here).
"""

from __future__ import annotations

import numpy as np

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_choice, check_positive_int
from distcheck.core.vocab import Schedule
from distcheck.parallel.pp import dualpipe as _dualpipe
from distcheck.parallel.pp import zero_bubble as _zb
from distcheck.parallel.pp.actions import MAX_ACTIONS, SCHEDULES, _check_ticks
from distcheck.parallel.pp.build import one_f_one_b_rank, rank_arrays
from distcheck.parallel.pp.order import B, F, Order, from_arrays
from distcheck.parallel.pp.simulator import Costs, run
from distcheck.parallel.pp.timeline import Timeline

__all__ = ["SPLIT_BACKWARD", "V_PLACEMENT", "FIXED_V", "check_shape", "placement", "order_arrays", "schedule_order",
           "simulate", "costs_of"]

#: schedules whose backward is split into I (input gradient) and W (weight gradient)
SPLIT_BACKWARD = frozenset({Schedule.ZB_H1, Schedule.ZB_H2, Schedule.INTERLEAVED_ZB, Schedule.ZB_V, Schedule.DUALPIPE,
                            Schedule.DUALPIPEV})
#: schedules with the V placement (rank r holds stages r and 2p - 1 - r)
V_PLACEMENT = frozenset({Schedule.ZB_V, Schedule.DUALPIPE, Schedule.DUALPIPEV})
#: schedules whose v (stages per rank) is fixed
FIXED_V: dict[str, int] = {Schedule.GPIPE: 1, Schedule.ONE_F_ONE_B: 1, Schedule.ZB_H1: 1, Schedule.ZB_H2: 1,
                           Schedule.ZB_V: 2, Schedule.DUALPIPE: 2, Schedule.DUALPIPEV: 2}


def _closed_form_hint(schedule: str, p: int, m: int, v: int) -> str:
    args = f"p={p}, m={m}" + (f", v={v}" if schedule == Schedule.INTERLEAVED else "")
    form = schedule if schedule in (Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED) else Schedule.GPIPE
    return (f"for large sizes use the closed forms, e.g. "
            f"distcheck.closed_form.get('pp.step_ticks.{form}').evaluate({args})")


def check_shape(schedule: str, p: object, m: object, v: object = None) -> int:
    """Check a shape against the schedule's constraints (module docstring); return ``v``
    (the schedule's own when None). Raises ConfigError naming the rule."""
    check_choice("schedule", schedule, SCHEDULES)
    p = check_positive_int("p", p)
    m = check_positive_int("m", m)
    if v is None:
        v = FIXED_V.get(schedule, 2)
    v = check_positive_int("v", v)
    fixed = FIXED_V.get(schedule)
    if fixed is not None and v != fixed:
        raise ConfigError("v", v, f"must be {fixed} for the {schedule} schedule" +
                          (" (chunks per rank need 'interleaved')" if fixed == 1 else " (two stages per rank, in a V)"))
    if schedule == Schedule.INTERLEAVED:
        if v < 2:
            raise ConfigError("v", v, "must be >= 2 for the interleaved schedule (v=1 is plain 1f1b)")
        if m % p:
            raise ConfigError("m", m, f"must be a multiple of p={p} for the interleaved schedule")
    elif schedule == Schedule.INTERLEAVED_ZB and m % max(1, m // p):
        raise ConfigError("m", m, f"must be a multiple of max(1, m // p) = {max(1, m // p)} rounds for the "
                                  "interleaved_zb schedule (torch's ScheduleInterleavedZeroBubble)")
    elif schedule == Schedule.DUALPIPE:
        if p % 2:
            raise ConfigError("p", p, "must be even for the dualpipe schedule (two directions meet in the middle)")
        if m % 2 or m < 2 * p:
            raise ConfigError("m", m, f"must be even and >= 2p = {2 * p} for the dualpipe schedule "
                                      "(m/2 micro-batches per direction)")
    elif schedule == Schedule.DUALPIPEV and m < 2 * p:
        raise ConfigError("m", m, f"must be >= 2p = {2 * p} for the dualpipev schedule")
    actions = p * v * m * (3 if schedule in SPLIT_BACKWARD else 2)
    if actions > MAX_ACTIONS:
        raise ConfigError("m", m, f"gives p*v*m = {p}*{v}*{m} = {p * v * m} (stage, micro-batch) pairs and {actions} "
                                  f"actions, more than the simulation handles (pp.MAX_ACTIONS = {MAX_ACTIONS}); "
                                  + _closed_form_hint(schedule, p, m, v))
    return v


def placement(schedule: str, p: int, v: int | None = None) -> np.ndarray:
    """The rank of each of the ``v * p`` stages under the schedule's placement (module docstring)."""
    check_choice("schedule", schedule, SCHEDULES)
    p = check_positive_int("p", p)
    v = check_shape(schedule, p, 2 * p if schedule in (Schedule.DUALPIPE, Schedule.DUALPIPEV) else p, v)
    s = np.arange(v * p)
    return np.where(s < p, s, 2 * p - 1 - s) if schedule in V_PLACEMENT else s % p


def _gpipe(p: int, m: int) -> Order:
    j = np.arange(m)
    return from_arrays(p, m, [rank_arrays(np.repeat([F, B], m), np.full(2 * m, r), np.tile(j, 2)) for r in range(p)])


def _one_f_one_b(p: int, m: int) -> Order:
    return from_arrays(p, m, [one_f_one_b_rank(m, min(p - r - 1, m), lambda k, r=r: (k * 0 + r, k),
                                               lambda k, r=r: (k * 0 + r, k)) for r in range(p)])


def _interleaved(p: int, m: int, v: int) -> Order:
    """Megatron-LM's interleaved 1F1B: micro-batches in groups of p, chunk by chunk (backwards
    walk the chunks in reverse); rank r warms up with min(2 (p - r - 1) + (v - 1) p, v m) forwards."""
    def split(k: np.ndarray, forward: bool, r: int) -> tuple[np.ndarray, np.ndarray]:
        group, within = np.divmod(k, p * v)
        chunk = within // p if forward else v - 1 - within // p
        return chunk * p + r, group * p + within % p

    return from_arrays(v * p, m, [one_f_one_b_rank(m * v, min(2 * (p - r - 1) + (v - 1) * p, m * v),
                                                   lambda k, r=r: split(k, True, r), lambda k, r=r: split(k, False, r))
                                  for r in range(p)])


def _looped_bfs(p: int, m: int, v: int) -> Order:
    """Every micro-batch through chunk 0, then chunk 1, ...; backwards from the last chunk, last
    micro-batch first (torch's ScheduleLoopedBFS)."""
    j = np.arange(m)
    ranks = []
    for r in range(p):
        stages = np.arange(v) * p + r
        ranks.append(rank_arrays(np.repeat([F, B], v * m), np.concatenate([np.repeat(stages, m),
                                                                           np.repeat(stages[::-1], m)]),
                                 np.concatenate([np.tile(j, v), np.tile(j[::-1], v)])))
    return from_arrays(v * p, m, ranks)


_BUILDERS = {
    Schedule.GPIPE: lambda p, m, v: _gpipe(p, m),
    Schedule.ONE_F_ONE_B: lambda p, m, v: _one_f_one_b(p, m),
    Schedule.INTERLEAVED: _interleaved,
    Schedule.LOOPED_BFS: _looped_bfs,
    Schedule.ZB_H1: _zb.zb_h1,
    Schedule.ZB_H2: _zb.zb_h2,
    Schedule.INTERLEAVED_ZB: _zb.interleaved_zb,
    Schedule.ZB_V: _zb.zb_v,
    Schedule.DUALPIPE: _dualpipe.dualpipe,
    Schedule.DUALPIPEV: _dualpipe.dualpipev,
}


def order_arrays(schedule: str, p: int, m: int, v: int | None = None) -> Order:
    """The schedule's per-rank order as an :class:`~distcheck.parallel.pp.order.Order` (arrays,
    no Action objects). Raises ConfigError as :func:`check_shape`."""
    v = check_shape(schedule, p, m, v)
    return _BUILDERS[Schedule(schedule)](int(p), int(m), v)


def schedule_order(schedule: Schedule | str, p: int, m: int, v: int | None = None) -> dict[int, list]:
    """The per-rank action order of a named schedule.

    Args:
        schedule: one of :data:`~distcheck.parallel.pp.actions.SCHEDULES` (module docstring):

            * ``"gpipe"`` (Huang et al. 2019): every rank runs its ``m`` forwards, then its
              ``m`` backwards.
            * ``"1f1b"`` (PipeDream-Flush, Narayanan et al. 2021 §2.2.1): rank ``r`` runs
              ``min(p - r - 1, m)`` warm-up forwards, then alternates one forward and one
              backward, then runs the remaining backwards.
            * ``"interleaved"`` (Narayanan et al. 2021 §2.2.2; Megatron-LM's
              ``forward_backward_pipelining_with_interleaving``): each rank holds ``v >= 2``
              chunks; forwards walk micro-batches in groups of ``p``, chunk by chunk
              (backwards walk the chunks in reverse); rank ``r`` warms up with
              ``min(2 (p - r - 1) + (v - 1) p, v m)`` forwards, then runs 1F1B pairs, then
              the remaining backwards. Requires ``m % p == 0``. (This is also what
              ``torch.distributed.pipelining.ScheduleInterleaved1F1B`` builds when
              ``m % p == 0``.)
            * the breadth-first, zero-bubble and DualPipe schedules: module docstring,
              :mod:`~distcheck.parallel.pp.zero_bubble`, :mod:`~distcheck.parallel.pp.dualpipe`.
        p: ranks (pipeline stages), >= 1.
        m: micro-batches, >= 1.
        v: model chunks per rank (None: the schedule's own; >= 2 for ``"interleaved"``).

    Returns:
        ``{rank: [Action | (Action, Action), ...]}`` for ranks ``0 .. p-1`` (a tuple is an
        overlapped pair); stage ``chunk * p + rank`` under the loop placement (so
        ``stage == rank`` when ``v == 1``).

    Raises:
        ConfigError: unknown schedule, ``p``/``m``/``v`` not positive integers, a shape the
        schedule does not allow, more than ``MAX_ACTIONS`` actions (use the closed forms
        ``pp.*`` then).
    """
    return order_arrays(schedule, p, m, v).to_actions(pairs=True)


def costs_of(schedule: str, t_f: int = 1, t_b: int | None = None, t_i: int | None = None, t_w: int | None = None,
             t_fb: int | None = None) -> Costs:
    """The :class:`~distcheck.parallel.pp.simulator.Costs` of one run of ``schedule`` (module docstring).

    ``t_b`` (default 2) is the full backward. For a split schedule, ``t_i`` and ``t_w``
    default to ``t_b / 2`` each; one of them given, the other is ``t_b`` minus it; both
    given, the full backward is ``t_i + t_w`` and ``t_b``, if given, must equal it. For
    DualPipe(V) ``t_fb`` defaults to ``t_f + t_i + t_w``. Raises ConfigError naming the cost.
    """
    _check_ticks("t_f", t_f)
    if t_b is not None:
        _check_ticks("t_b", t_b)
    if schedule not in SPLIT_BACKWARD:
        return Costs(f=t_f, b=2 if t_b is None else t_b)
    if t_i is not None and t_w is not None:
        _check_ticks("t_i", t_i)
        _check_ticks("t_w", t_w)
        if t_b is not None and t_b != t_i + t_w:
            raise ConfigError("t_b", t_b, f"must equal t_i + t_w = {t_i} + {t_w} (the full backward) for the "
                                          f"{schedule} schedule")
    else:
        full = 2 if t_b is None else t_b
        if t_i is None and t_w is None:
            if full % 2:
                raise ConfigError("t_i", None, f"is required for the {schedule} schedule when t_b={full} is odd "
                                               "(the backward is split into I and W)")
            t_i = t_w = full // 2
        elif t_i is None:
            t_w = _check_ticks("t_w", t_w)
            t_i = full - t_w
            if t_i < 1:
                raise ConfigError("t_w", t_w, f"must be < t_b={full} (t_i = t_b - t_w must be >= 1 tick)")
        else:
            t_i = _check_ticks("t_i", t_i)
            t_w = full - t_i
            if t_w < 1:
                raise ConfigError("t_i", t_i, f"must be < t_b={full} (t_w = t_b - t_i must be >= 1 tick)")
    fb = None
    if schedule in (Schedule.DUALPIPE, Schedule.DUALPIPEV):
        fb = t_f + t_i + t_w if t_fb is None else _check_ticks("t_fb", t_fb)
    return Costs(f=t_f, b=t_i + t_w, i=t_i, w=t_w, fb=fb)


def simulate(schedule: Schedule | str, p: int, m: int, v: int | None = None, t_f: int = 1, t_b: int | None = None, *,
             t_i: int | None = None, t_w: int | None = None, t_fb: int | None = None,
             engine: str = "sweeps") -> Timeline:
    """Simulate a named schedule: ``replay(schedule_order(schedule, p, m, v), ...)``, on arrays.

    Args: as :func:`schedule_order` (``p`` ranks, ``m`` micro-batches, ``v`` chunks per
    rank), plus the costs in ticks, positive integers (:func:`costs_of`): ``t_f`` one
    forward and ``t_b`` one full backward of one stage (one chunk when interleaved; lesson:
    1 and 2, the defaults); for the split schedules ``t_i``/``t_w`` (default ``t_b / 2``
    each); for DualPipe(V) ``t_fb`` (default ``t_f + t_b``). ``engine``: see
    :func:`distcheck.parallel.pp.simulator.run`.

    Figures of the lesson "Scaling and distributed training": ``simulate("gpipe", 4, 4).step_ticks == 21`` with
    ``bubble_fraction == 3/7``; ``p=4, m=16`` gives 57 ticks and ``3/19``. Up to
    ``MAX_ACTIONS`` = 10**7 actions; p = 64, m = 1024, v = 4 runs in about a tenth of a
    second (``benchmarks/bench_pipeline.py``).

    Raises:
        ConfigError: as :func:`schedule_order` and :func:`costs_of`.
    """
    check_choice("schedule", schedule, SCHEDULES)
    costs = costs_of(schedule, t_f, t_b, t_i, t_w, t_fb)
    v = check_shape(schedule, p, m, v)
    return run(_BUILDERS[Schedule(schedule)](int(p), int(m), v), costs, engine=engine)
