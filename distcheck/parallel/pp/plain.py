"""The plain replay: one action at a time, in pure Python, with dictionaries of Action objects.

This is the simulator as first written (list scheduling: each rank's next action runs once
its dependencies have run, at ``max(rank free, dependencies done)``), kept as the independent
oracle of the array engine of :mod:`distcheck.parallel.pp.simulator`: the property
``pp.engine.matches_plain_replay`` checks that both give the same spans, figures, tick
grid and deadlocks. It is slow (microseconds per action) and assumes a valid order (the
checks are the engine's): use :func:`distcheck.parallel.pp.replay`.

Overlapped pairs ``(Action, Action)`` start together when the rank and both members'
dependencies are ready, and both end ``t_fb`` ticks later. ``routes`` gives each
micro-batch its first and last stage (DualPipe's two directions).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from distcheck.core.errors import ConfigError
from distcheck.parallel.pp.actions import Action, DeadlockError, Span

__all__ = ["PlainTimeline", "plain_replay"]


@dataclass(frozen=True)
class PlainTimeline:
    """Spans, grid and figures of :func:`plain_replay`, with the meanings of
    :class:`distcheck.parallel.pp.Timeline`'s attributes of the same names."""

    spans: tuple[Span, ...]
    grid: tuple[tuple, ...]
    step_ticks: int
    busy_ticks: tuple[int, ...]
    idle_ticks: tuple[int, ...]
    bubble_fraction: Fraction
    bubble_ratio: Fraction
    peak_in_flight: tuple[int, ...]


def plain_replay(order: dict[int, Any] | Sequence[Sequence[Any]], num_stages: int, num_microbatches: int,  # noqa: C901 - one branch per action kind of the replay
                 *, t_f: int = 1, t_b: int = 2, t_i: int = 1, t_w: int = 1, t_fb: int | None = None,
                 routes: tuple[Sequence[int], Sequence[int]] | None = None) -> PlainTimeline:
    """Replay ``{rank: [Action | (Action, Action), ...]}`` action by action (module docstring).

    Raises DeadlockError (every blocked rank, its next action and the dependency it waits
    for) when the order cannot finish.
    """
    S, M = num_stages, num_microbatches
    first = [0] * M if routes is None else [int(x) for x in routes[0]]
    last = [S - 1] * M if routes is None else [int(x) for x in routes[1]]
    orders = {r: [a if isinstance(a, tuple) else (a,) for a in acts if a is not None]
              for r, acts in (order.items() if isinstance(order, dict) else enumerate(order))}
    num_ranks = max(orders) + 1
    split = {(a.stage, a.microbatch) for acts in orders.values() for unit in acts for a in unit if a.kind == "I"}
    cost = {"F": t_f, "B": t_b, "I": t_i, "W": t_w}

    def deps(a: Action) -> list[Action]:
        s, j = a.stage, a.microbatch
        if a.kind == "F":
            return [Action("F", j, s - 1)] if s > first[j] else []
        if a.kind == "W":
            return [Action("I", j, s)]
        out = [Action("F", j, s)]
        if s < last[j]:
            out.append(Action("I" if (s + 1, j) in split else "B", j, s + 1))
        return out

    end: dict[Action, int] = {}
    free = {r: 0 for r in orders}
    pos = {r: 0 for r in orders}
    spans: list[Span] = []
    parked: dict[Action, list[int]] = {}
    ready = deque(orders)
    while ready:
        r = ready.popleft()
        acts = orders[r]
        while pos[r] < len(acts):
            unit = acts[pos[r]]
            ds = [d for a in unit for d in deps(a)]
            missing = next((d for d in ds if d not in end), None)
            if missing is not None:
                parked.setdefault(missing, []).append(r)
                break
            start = max([free[r]] + [end[d] for d in ds])
            if len(unit) == 1:
                ticks = cost[unit[0].kind]
            elif t_fb is None:
                raise ConfigError("t_fb", None, "is required when the order has overlapped pairs")
            else:
                ticks = t_fb
            stop = start + ticks
            for a in unit:
                end[a] = stop
                spans.append(Span(a, r, start, stop))
            free[r] = stop
            pos[r] += 1
            for a in unit:
                ready.extend(parked.pop(a, ()))
    blocked = {}
    for r, acts in orders.items():
        if pos[r] < len(acts):
            for a in acts[pos[r]]:
                missing = next((d for d in deps(a) if d not in end), None)
                if missing is not None:
                    blocked[r] = (a, missing)
                    break
    if blocked:
        raise DeadlockError(blocked)
    return _figures(spans, num_ranks)


def _figures(spans: list[Span], num_ranks: int) -> PlainTimeline:
    spans.sort(key=lambda s: (s.start, s.rank))
    origin = min(s.start for s in spans)
    step = max(s.end for s in spans) - origin
    grid: list[list] = [[None] * step for _ in range(num_ranks)]
    busy = [0] * num_ranks
    for s in spans:
        t0 = s.start - origin
        if grid[s.rank][t0] is None:
            busy[s.rank] += s.end - s.start
            for t in range(t0, s.end - origin):
                grid[s.rank][t] = s.action
        else:  # the second member of an overlapped pair
            for t in range(t0, s.end - origin):
                grid[s.rank][t] = (grid[s.rank][t], s.action)
    idle = [step - b for b in busy]
    born: dict[tuple[int, int], tuple[int, int]] = {}
    freed: dict[tuple[int, int], int] = {}
    for s in spans:
        key = (s.action.stage, s.action.microbatch)
        if s.action.kind == "F":
            born[key] = (s.rank, s.start)
        else:
            freed[key] = max(freed.get(key, s.end), s.end)
    events: list[list[tuple[int, int]]] = [[] for _ in range(num_ranks)]
    for key, (rank, t0) in born.items():
        events[rank].append((t0, +1))
        events[rank].append((freed[key], -1))
    peak = []
    for ev in events:
        level = best = 0
        for _, delta in sorted(ev):  # at equal times a release (-1) sorts before an acquire (+1)
            level += delta
            best = max(best, level)
        peak.append(best)
    return PlainTimeline(tuple(spans), tuple(tuple(row) for row in grid), step, tuple(busy), tuple(idle),
                         Fraction(sum(idle), num_ranks * step), Fraction(sum(idle), sum(busy)), tuple(peak))
