"""The result of simulating a per-rank order: its figures at once, its spans and tick grid on demand.

A :class:`Timeline` holds the start and end tick of every action (numpy arrays) and the
figures derived from them (step ticks, busy and idle ticks per rank, both bubble
conventions, the activation stash). The list of :class:`~distcheck.parallel.pp.actions.Span`
objects, the tick grid and the text Gantt chart are built on first use, so a run of
millions of actions never builds them unless asked (the grid is refused beyond
:data:`~distcheck.parallel.pp.actions.MAX_GRID_CELLS` cells).
"""

from __future__ import annotations

from fractions import Fraction
from functools import cached_property

import numpy as np

from distcheck.core.errors import ConfigError
from distcheck.parallel.pp.actions import KINDS, MAX_GRID_CELLS, Action, Span
from distcheck.parallel.pp.order import Order

__all__ = ["Timeline"]

_F, _B, _W = 0, 1, 3


class Timeline:
    """The times of every action of an order, and the figures of one pipeline step.

    Attributes:
        num_ranks: ranks (``p``).
        num_stages: virtual stages (``v * p`` with ``v`` chunks per rank, else ``p``).
        num_microbatches: ``m``.
        step_ticks: ticks from the first start to the last end (the step time).
        busy_ticks: per rank, ticks spent computing (an overlapped pair counts its ``t_fb`` once).
        idle_ticks: per rank, ``step_ticks - busy_ticks``.
        bubble_fraction: total idle / total time, ``sum(idle) / (p * step_ticks)``
            (0..1; GPipe: ``(p-1)/(m+p-1)``, lesson).
        bubble_ratio: total idle / ideal time, ``sum(idle) / sum(busy)``
            (GPipe and 1F1B: ``(p-1)/m``, Narayanan et al. 2021 §2.2.1).
        peak_in_flight: per rank, the largest number of (stage, micro-batch) pairs held at
            once, from the start of the pair's ``F`` to the end of its last backward piece
            (``B``, or ``W`` when split): the micro-batches whose activations are stashed
            (with ``v`` chunks per rank, each pair holds one chunk's activations).
        window_idle_ticks: per rank, idle ticks between the rank's own first start and last
            end: the bubble when consecutive steps overlap (no barrier between steps).
        start, end: numpy arrays, the start and end tick of every action of ``order``.
        order: the simulated :class:`~distcheck.parallel.pp.order.Order`.
        spans: every action with its rank and ``[start, end)``, sorted by (start, rank);
            built on first use.
        grid: ``grid[rank][tick]``, the Action running then (a pair of Actions for an
            overlapped pair) or None; built on first use, refused (ConfigError) beyond
            ``MAX_GRID_CELLS`` cells.

    Two timelines are equal when their sizes, figures and spans are equal.
    """

    def __init__(self, order: Order, rank_of: np.ndarray, start: np.ndarray, end: np.ndarray, unit_cost: np.ndarray,
                 unit_rank: np.ndarray, unit_paired: np.ndarray | None = None) -> None:
        p = order.num_ranks
        self.order = order
        self.rank_of, self.start, self.end = rank_of, start, end
        self.num_ranks, self.num_stages, self.num_microbatches = p, order.num_stages, order.num_microbatches
        self.has_overlap = bool(unit_paired is not None and unit_paired.any())
        self.origin = int(start.min())
        self.step_ticks = int(end.max()) - self.origin
        busy = np.bincount(unit_rank, weights=unit_cost, minlength=p).astype(np.int64) \
            if int(unit_cost.max()) < 2**50 else _exact_bincount(unit_rank, unit_cost, p)
        total_busy = int(busy.sum())
        self.busy_ticks = tuple(busy.tolist())
        self.idle_ticks = tuple((self.step_ticks - busy).tolist())
        total_idle = self.step_ticks * p - total_busy
        self.bubble_fraction = Fraction(total_idle, p * self.step_ticks)
        self.bubble_ratio = Fraction(total_idle, total_busy)
        has = np.diff(order.offsets) > 0
        lo = np.full(p, self.origin, np.int64)
        hi = np.full(p, self.origin, np.int64)
        if has.any():
            heads = order.offsets[:-1][has]
            lo[has] = np.minimum.reduceat(start, heads)
            hi[has] = np.maximum.reduceat(end, heads)
        self.window_idle_ticks = tuple((hi - lo - busy).tolist())
        self.peak_in_flight = tuple(self._peaks().tolist())

    # ------------------------------------------------------------------ figures

    def _peaks(self) -> np.ndarray:
        """Peak (stage, micro-batch) pairs held per rank: a pair is taken at the start of its F
        and freed at the end of its last backward piece (B, or W: W ends after its I), both on
        the stage's rank. A rank runs its actions one after the other, so its events come in its
        list's order (a release at the end of an action before a birth at the start of the
        next); the level is a running sum along the list. In an overlapped pair the forward's
        birth comes first (both start together, the release is at the common end)."""
        o = self.order
        kind = o.kind
        delta = (kind == _F).astype(np.int64)
        delta -= (kind == _B) | (kind == _W)
        if self.has_overlap:
            first = np.flatnonzero(o.overlap)
            births = (kind[first] == _F).astype(np.int64) + (kind[first + 1] == _F)
            total = delta[first] + delta[first + 1]
            delta[first], delta[first + 1] = births, total - births
        level = np.cumsum(delta)
        has = np.diff(o.offsets) > 0
        out = np.zeros(o.num_ranks, np.int64)
        if has.any():
            heads = o.offsets[:-1][has]
            before = level[heads] - delta[heads]
            out[has] = np.maximum.reduceat(level, heads) - before
        return out.clip(min=0)

    # ------------------------------------------------------------------ on demand

    @cached_property
    def spans(self) -> tuple[Span, ...]:
        """Every action with its rank and ``[start, end)``, sorted by (start, rank)."""
        o = self.order
        idx = np.lexsort((np.arange(o.num_actions), self.rank_of, self.start))
        kinds, mbs, sts = o.kind[idx].tolist(), o.microbatch[idx].tolist(), o.stage[idx].tolist()
        ranks, starts, ends = self.rank_of[idx].tolist(), self.start[idx].tolist(), self.end[idx].tolist()
        return tuple(Span(Action(KINDS[k], j, s), r, a, e)
                     for k, j, s, r, a, e in zip(kinds, mbs, sts, ranks, starts, ends, strict=True))

    @cached_property
    def grid(self) -> tuple[tuple[Action | tuple[Action, Action] | None, ...], ...]:
        """``grid[rank][tick]``: the Action running then (an overlapped pair: both Actions) or None."""
        cells = self.num_ranks * self.step_ticks
        if cells > MAX_GRID_CELLS:
            raise ConfigError("num_ranks*step_ticks", cells,
                              f"must be <= pp.MAX_GRID_CELLS = {MAX_GRID_CELLS} (the timeline grid has one cell "
                              f"per rank and tick; here {self.num_ranks} ranks x {self.step_ticks} ticks): the figures "
                              "(step_ticks, bubble, peak_in_flight) need no grid; use fewer ranks or smaller tick "
                              "costs t_f/t_b to draw one")
        rows: list[list] = [[None] * self.step_ticks for _ in range(self.num_ranks)]
        together: dict[tuple[int, int], list[Span]] = {}
        for s in self.spans:
            together.setdefault((s.rank, s.start), []).append(s)
        for (rank, t0), group in together.items():
            cell = group[0].action if len(group) == 1 else tuple(g.action for g in group)
            row = rows[rank]
            for t in range(t0 - self.origin, group[0].end - self.origin):
                row[t] = cell
        return tuple(tuple(r) for r in rows)

    def render(self) -> str:
        """A text Gantt chart: a header of tick numbers, then one row per rank.

        Each row is ``"rank R |"`` followed by exactly ``step_ticks`` cells separated by single
        spaces; a cell is the running action's kind and micro-batch (``F3``, ``B0``; with
        several stages on a rank, ``F3.1`` names the rank's chunk 1; an overlapped pair shows
        as ``F3+B1``) or ``.`` when the rank is idle, padded to one width. A two-tick backward
        fills two cells. Raises ConfigError beyond ``MAX_GRID_CELLS`` cells.
        """
        grid = self.grid
        stages: dict[int, list[int]] = {}
        for s in self.spans:
            lst = stages.setdefault(s.rank, [])
            if s.action.stage not in lst:
                lst.append(s.action.stage)
        for lst in stages.values():
            lst.sort()

        def one(rank: int, a: Action) -> str:
            text = f"{a.kind}{a.microbatch}"
            if len(stages.get(rank, ())) > 1:
                text += f".{stages[rank].index(a.stage)}"
            return text

        def label(rank: int, cell: Action | tuple[Action, ...] | None) -> str:
            if cell is None:
                return "."
            return "+".join(one(rank, a) for a in cell) if isinstance(cell, tuple) else one(rank, cell)

        cells = [[label(r, a) for a in row] for r, row in enumerate(grid)]
        width = max([len(str(max(self.step_ticks - 1, 0)))] + [len(c) for row in cells for c in row])
        head = f"rank {self.num_ranks - 1}"
        lines = [" " * len(head) + " |" + " ".join(str(t).ljust(width) for t in range(self.step_ticks))]
        for r, row in enumerate(cells):
            lines.append(f"rank {r}".ljust(len(head)) + " |" + " ".join(c.ljust(width) for c in row))
        return "\n".join(line.rstrip() for line in lines)

    # ------------------------------------------------------------------ comparison

    def _figures(self) -> tuple:
        return (self.num_ranks, self.num_stages, self.num_microbatches, self.step_ticks, self.busy_ticks,
                self.idle_ticks, self.bubble_fraction, self.bubble_ratio, self.peak_in_flight)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Timeline):
            return NotImplemented
        return self._figures() == other._figures() and self.spans == other.spans

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"Timeline(num_ranks={self.num_ranks}, num_stages={self.num_stages}, num_microbatches="
                f"{self.num_microbatches}, step_ticks={self.step_ticks}, bubble_fraction={self.bubble_fraction}, "
                f"peak_in_flight={max(self.peak_in_flight)})")


def _exact_bincount(rank: np.ndarray, cost: np.ndarray, p: int) -> np.ndarray:
    out = np.zeros(p, np.int64)
    np.add.at(out, rank, cost)
    return out
