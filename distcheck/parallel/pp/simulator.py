"""The engine of the pipeline simulator: the start of every action of a per-rank order, exactly.

Model (the lesson "Scaling and distributed training", "Pipeline bubble"): every action costs
a whole number of ticks, communication is free, a rank runs one action (or one overlapped
pair) at a time, in its list's order. Every *unit* (an action, or an overlapped pair) starts
at ``max(end of the unit before it on its rank, end of its dependencies)`` (the dependencies
are in :mod:`distcheck.parallel.pp.order`). These equations have exactly one solution when
the order can finish (the dependency graph together with the ranks' orders is acyclic: a
longest-path recursion), and none when it deadlocks (a cycle of waits costs at least one
tick per turn).

Algorithm (:func:`run`). Within one rank the recursion is a prefix maximum: with ``C`` the
running sum of the rank's costs and ``d`` the end of each unit's dependencies,
``start = C + maximum.accumulate(d - C)``, one vectorised pass per rank. Ranks are swept in
turn (Gauss-Seidel), up the ranks and then down, each rank reading the others' latest
values, starting from all zeros: the values only grow and never pass the solution, so a
sweep in which no rank changes has reached it, and that sweep is the proof that the
equations hold everywhere. A forward's dependencies run up the ranks and a backward's down,
so the named schedules need two to five sweeps (``benchmarks/bench_pipeline.py``), and a
rank none of whose inputs changed since it was computed is skipped; the cost is linear in
the number of actions. When the values pass the total work (only a cycle can do
that) or the sweeps do not settle, the order is replayed by plain list scheduling
(:func:`_list_schedule`), which is also exact and names the blocked ranks of a deadlock.

Checked against the plain one-action-at-a-time replay of :mod:`distcheck.parallel.pp.plain`
by the property ``pp.engine.matches_plain_replay``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_positive_int
from distcheck.parallel.pp.actions import MAX_ACTIONS, DeadlockError, _check_ticks
from distcheck.parallel.pp.order import Order, check_order, dependencies
from distcheck.parallel.pp.timeline import Timeline

__all__ = ["Costs", "run", "replay", "ENGINES", "MAX_SWEEPS"]

#: the engines :func:`run` accepts: ``"sweeps"`` (default) and ``"list"`` (plain list scheduling)
ENGINES = ("sweeps", "list")
#: sweeps after which :func:`run` stops sweeping and replays the order by list scheduling
MAX_SWEEPS = 64
#: the largest total work (ticks summed over every action) the engine's int64 arithmetic allows
MAX_TOTAL_TICKS = 2**62


@dataclass(frozen=True)
class Costs:
    """Ticks of each kind of action, whole numbers >= 1 (checked by the callers).

    ``f`` forward, ``b`` FULL backward, ``i`` input-gradient backward, ``w`` weight-gradient
    backward, ``fb`` an overlapped pair (None: the order may hold no pair).
    """

    f: int = 1
    b: int = 2
    i: int = 1
    w: int = 1
    fb: int | None = None


@dataclass(frozen=True, eq=False)
class _Units:
    """The units of an order: actions, with each overlapped pair merged into one."""

    count: int
    cost: np.ndarray
    rank: np.ndarray
    deps: np.ndarray  # (U, k) unit indices, -1 none
    offsets: np.ndarray  # (p + 1,) per-rank ranges
    unit_of: np.ndarray | None  # action -> unit (None: one unit per action)
    first_action: np.ndarray | None
    paired: np.ndarray | None


def _units(order: Order, deps: np.ndarray, costs: Costs, rank_of: np.ndarray) -> _Units:
    kind_cost = np.array([costs.f, costs.b, costs.i, costs.w], np.int64)
    if not order.overlap.any():
        return _Units(order.num_actions, kind_cost[order.kind], rank_of, deps, order.offsets, None, None, None)
    n = order.num_actions
    unit_start = np.ones(n, bool)
    unit_start[1:] = ~order.overlap[:-1]
    unit_of = np.cumsum(unit_start) - 1
    first_action = np.flatnonzero(unit_start)
    count = int(first_action.size)
    paired = np.zeros(count, bool)
    paired[unit_of[np.flatnonzero(order.overlap)]] = True
    cost = kind_cost[order.kind[first_action]]
    cost[paired] = costs.fb
    udeps = np.full((count, 4), -1, np.int64)
    udeps[:, :2] = deps[first_action]
    udeps[paired, 2:] = deps[first_action[paired] + 1]
    valid = udeps >= 0
    udeps[valid] = unit_of[udeps[valid]]
    offsets = np.searchsorted(first_action, order.offsets).astype(np.int64)
    return _Units(count, cost, rank_of[first_action], udeps, offsets, unit_of, first_action, paired)


def _readers(placed: np.ndarray, p: int) -> list[list[int]]:
    """``readers[q]``: the other ranks that may wait on a unit of rank ``q``. A forward of stage
    ``s`` waits on stage ``s - 1``, a backward on stage ``s + 1``, a weight pass on its own stage:
    so the rank of ``s`` reads the ranks of ``s - 1`` and ``s + 1`` (a superset with routes)."""
    readers: list[set[int]] = [set() for _ in range(p)]
    stages = placed.tolist()
    for s, r in enumerate(stages):
        if r < 0:
            continue
        for n in (s - 1, s + 1):
            if 0 <= n < len(stages) and stages[n] >= 0 and stages[n] != r:
                readers[stages[n]].add(r)
    return [sorted(x) for x in readers]


def _holds(u: _Units, end: np.ndarray, columns: list[np.ndarray]) -> bool:
    """True when ``end`` solves the equations: every unit starts at the later of the end of the
    unit before it on its rank (0 for a rank's first) and the end of its dependencies."""
    start = end[:-1] - u.cost
    need = end[columns[0]]
    for col in columns[1:]:
        np.maximum(need, end[col], out=need)
    prev = np.empty_like(start)
    prev[0] = 0
    prev[1:] = end[:-2]
    prev[u.offsets[:-1][u.offsets[:-1] < u.count]] = 0
    np.maximum(need, prev, out=need)
    return bool(np.array_equal(need, start))


def _sweeps(u: _Units, placed: np.ndarray, total: int) -> np.ndarray | None:
    """End of every unit by Gauss-Seidel sweeps over the ranks; None when they do not settle.

    A rank is recomputed only when a rank it reads changed since it was last computed; the
    result is then checked against the equations (:func:`_holds`), which also rules out a
    dependency on a later unit of the same rank."""
    end = np.zeros(u.count + 1, np.int64)  # end[count] = 0: the slot of "no dependency"
    columns = [np.where(col >= 0, col, u.count) for col in u.deps.T if (col >= 0).any()]
    if not columns:
        columns = [np.full(u.count, u.count, np.int64)]
    incl = np.cumsum(u.cost)
    excl = incl - u.cost
    p = len(u.offsets) - 1
    ranges = [(r, int(a), int(b)) for r, (a, b) in enumerate(zip(u.offsets[:-1], u.offsets[1:], strict=True)) if b > a]
    readers = _readers(placed, p)
    dirty = [True] * p
    first, rest = columns[0], columns[1:]
    for sweep in range(MAX_SWEEPS):
        changed = False
        for r, a, b in (ranges if sweep % 2 == 0 else reversed(ranges)):
            if not dirty[r]:
                continue
            dirty[r] = False
            d = end[first[a:b]]
            for col in rest:
                np.maximum(d, end[col[a:b]], out=d)
            d -= excl[a:b]
            np.maximum.accumulate(d, out=d)
            d += incl[a:b]
            if np.array_equal(d, end[a:b]):
                continue
            end[a:b] = d
            changed = True
            for q in readers[r]:
                dirty[q] = True
        if not changed:
            return end[:-1] if _holds(u, end, columns) else None
        if int(end.max()) > total:  # only a cycle of waits grows past the total work
            return None
    return None


def _list_schedule(u: _Units, order: Order, deps: np.ndarray) -> np.ndarray:
    """End of every unit by plain list scheduling (each rank's next unit runs once its
    dependencies are placed); raises DeadlockError naming every blocked rank."""
    end = [-1] * u.count
    cost = u.cost.tolist()
    udeps = [[d for d in row if d >= 0] for row in u.deps.tolist()]
    offsets = u.offsets.tolist()
    pos = offsets[:-1]
    free = [0] * order.num_ranks
    parked: dict[int, list[int]] = {}
    ready = deque(r for r in range(order.num_ranks) if pos[r] < offsets[r + 1])
    while ready:
        r = ready.popleft()
        k, stop = pos[r], offsets[r + 1]
        while k < stop:
            t = free[r]
            for d in udeps[k]:
                e = end[d]
                if e < 0:
                    parked.setdefault(d, []).append(r)
                    break
                if e > t:
                    t = e
            else:
                end[k] = free[r] = t + cost[k]
                woken = parked.pop(k, None)
                if woken:
                    ready.extend(woken)
                k += 1
                continue
            break
        pos[r] = k
    if any(pos[r] < offsets[r + 1] for r in range(order.num_ranks)):
        _raise_deadlock(u, order, deps, np.asarray(end, np.int64), pos, offsets)
    return np.asarray(end, np.int64)


def _raise_deadlock(u: _Units, order: Order, deps: np.ndarray, end: np.ndarray, pos: np.ndarray,
                    offsets: np.ndarray) -> None:
    done = end >= 0 if u.unit_of is None else (end >= 0)[u.unit_of]
    blocked = {}
    for r in range(order.num_ranks):
        if pos[r] >= offsets[r + 1]:
            continue
        a0 = pos[r] if u.first_action is None else int(u.first_action[pos[r]])
        members = [a0, a0 + 1] if order.overlap[a0] else [a0]
        for a in members:
            missing = [int(d) for d in deps[a] if d >= 0 and not done[d]]
            if missing:
                blocked[r] = (order.action(a), order.action(missing[0]))
                break
    raise DeadlockError(blocked)


def run(order: Order, costs: Costs, *, stage_to_rank: Mapping[int, int] | Sequence[int] | None = None,
        engine: str = "sweeps") -> Timeline:
    """Simulate ``order`` under ``costs`` and return its :class:`~distcheck.parallel.pp.timeline.Timeline`.

    ``engine`` is ``"sweeps"`` (the default; see the module docstring) or ``"list"`` (plain
    list scheduling, for comparison); both give the same times.

    Raises:
        ConfigError: an invalid order (:func:`~distcheck.parallel.pp.order.check_order`),
            overlapped pairs without ``costs.fb``, or a total work of 2**62 ticks or more.
        DeadlockError: the order can never finish (names every blocked rank, the action it
            is stuck at and the dependency it waits for).
    """
    if engine not in ENGINES:
        raise ConfigError("engine", engine, f"must be one of {', '.join(map(repr, ENGINES))}")
    rank_of = order.ranks()
    idx_f, idx_bk, idx_i, idx_w, placed = check_order(order, rank_of, stage_to_rank)
    if order.overlap.any() and costs.fb is None:
        raise ConfigError("t_fb", None, "is required when the order has overlapped pairs")
    deps = dependencies(order, idx_f, idx_bk, idx_i, idx_w)
    u = _units(order, deps, costs, rank_of)
    total = int(u.cost.sum(dtype=object)) if u.count and int(u.cost.max()) > 2**40 else int(u.cost.sum())
    if total >= MAX_TOTAL_TICKS:
        raise ConfigError("costs", f"{total} ticks of work", "must add up to less than 2**62 ticks over the order")
    end = _sweeps(u, placed, total) if engine == "sweeps" else None
    if end is None:
        end = _list_schedule(u, order, deps)
    start = end - u.cost
    if u.unit_of is not None:
        start, end = start[u.unit_of], end[u.unit_of]
    return Timeline(order, rank_of, start, end, u.cost, u.rank, u.paired)




def replay(order: Order | Mapping[int, Sequence[Any]] | Sequence[Sequence[Any]], num_stages: int,
           num_microbatches: int, t_f: int = 1, t_b: int = 2, t_i: int | None = None, t_w: int | None = None,
           stage_to_rank: Mapping[int, int] | Sequence[int] | None = None, *, t_fb: int | None = None,
           routes: tuple[ArrayLike, ArrayLike] | None = None, engine: str = "sweeps") -> Timeline:
    """Run a per-rank action order and return its :class:`~distcheck.parallel.pp.timeline.Timeline`.

    Each rank runs its list in order; an action starts at ``max(time the rank is free, time
    its dependencies are done)`` (dependencies: :mod:`distcheck.parallel.pp.order`) and runs
    for its cost in ticks.

    Args:
        order: ``{rank: [Action | None, ...]}`` (or a list of lists, index = rank), or an
            :class:`~distcheck.parallel.pp.order.Order`. ``None`` entries (idle slots of a
            torch ``pipeline_order``) are skipped: the order is replayed, blanks are not
            counted as time. Ranks missing from the keys but below the largest key are idle.
            A pair ``(Action, Action)`` is an overlapped forward and backward (``t_fb``).
        num_stages: virtual stages, >= 1.
        num_microbatches: ``m``, >= 1.
        t_f: ticks of one forward of one stage, integer >= 1.
        t_b: ticks of one FULL backward, integer >= 1.
        t_i, t_w: ticks of an input-gradient / weight-gradient backward, integers >= 1. Only
            used when the order holds ``I``/``W`` actions; when both are None there,
            ``t_i = t_w = t_b / 2`` (``t_b`` must then be even).
        stage_to_rank: optional placement ``stage -> rank`` to check the order against; by
            default each stage's rank is the one whose list holds it.
        t_fb: ticks of an overlapped pair (required when the order has one).
        routes: ``(first_stage, last_stage)`` per micro-batch (default: every stage).
        engine: ``"sweeps"`` or ``"list"`` (:func:`run`); the same times either way.

    Every (stage, micro-batch) on a route must appear exactly once as ``F`` and once as
    either ``B`` or the pair ``I`` + ``W`` (on the same rank as its ``F``).

    Raises:
        ConfigError: bad sizes or tick costs; an action outside ``num_stages`` /
            ``num_microbatches``; a duplicate or missing action; a stage on two ranks or off
            its ``stage_to_rank`` rank; ``B`` mixed with ``I``/``W`` for one (stage,
            micro-batch); ``I``/``W`` with no usable ``t_i``/``t_w``; more than
            ``MAX_ACTIONS`` actions or (stage, micro-batch) pairs.
        DeadlockError: the order can never finish (names the blocked ranks and actions).
    """
    from distcheck.parallel.pp.order import compile_order

    num_stages = check_positive_int("num_stages", num_stages)
    num_microbatches = check_positive_int("num_microbatches", num_microbatches)
    if num_stages * num_microbatches > MAX_ACTIONS:
        raise ConfigError("num_microbatches", num_microbatches,
                          f"gives num_stages*num_microbatches = {num_stages * num_microbatches} (stage, micro-batch) "
                          f"pairs, more than the simulation handles (pp.MAX_ACTIONS = {MAX_ACTIONS}); "
                          "for large sizes use the closed forms pp.* (distcheck.closed_form.get)")
    _check_ticks("t_f", t_f)
    _check_ticks("t_b", t_b)
    if isinstance(order, Order):
        compiled = order
    else:
        compiled = compile_order(order, num_stages, num_microbatches, routes)
    split = bool(((compiled.kind == 2) | (compiled.kind == 3)).any())
    i = w = 1  # unused without split backwards
    if split:
        if t_i is None and t_w is None:
            if t_b % 2:
                raise ConfigError("t_i", None, f"is required when the order has I/W actions and t_b={t_b} is odd")
            t_i = t_w = t_b // 2
        i = _check_ticks("t_i", t_i)
        w = _check_ticks("t_w", t_w)
    if t_fb is not None:
        _check_ticks("t_fb", t_fb)
    costs = Costs(f=t_f, b=t_b, i=i, w=w, fb=t_fb)
    return run(compiled, costs, stage_to_rank=stage_to_rank, engine=engine)
