"""Replay of any per-rank order of pipeline actions, tick by tick, and the resulting timeline.

:func:`replay` runs each rank's list in order, each action starting at
``max(rank free, dependencies done)``, and returns a :class:`Timeline` (step ticks, busy
and idle ticks, both bubble conventions, activations in flight, a text Gantt chart). The
dependency rules and the size limits are in :mod:`distcheck.parallel.pp.reference`'s
docstring.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_positive_int
from distcheck.parallel.pp.actions import (
    MAX_ACTIONS,
    MAX_GRID_CELLS,
    Action,
    DeadlockError,
    Span,
    _check_ticks,
)

__all__ = ["Timeline", "replay"]


# ----------------------------------------------------------------------------------------------
# the timeline


@dataclass(frozen=True)
class Timeline:
    """The result of running a per-rank order tick by tick.

    Attributes:
        num_ranks: ranks (``p``).
        num_stages: virtual stages (``v * p`` for interleaved, else ``p``).
        num_microbatches: ``m``.
        spans: every action with its rank and ``[start, end)`` ticks, in start order.
        grid: ``grid[rank][tick]`` is the :class:`Action` running then, or None (idle);
            every row has ``step_ticks`` entries.
        step_ticks: ticks from the first start to the last end (the step time).
        busy_ticks: per rank, ticks spent on actions.
        idle_ticks: per rank, ``step_ticks - busy_ticks``.
        bubble_fraction: total idle / total time, ``sum(idle) / (p * step_ticks)``
            (0..1; GPipe: ``(p-1)/(m+p-1)``, lesson).
        bubble_ratio: total idle / ideal time, ``sum(idle) / sum(busy)``
            (GPipe and 1F1B: ``(p-1)/m``, Narayanan et al. 2021 §2.2.1).
        peak_in_flight: per rank, the largest number of (micro-batch, stage)
            pairs held at once: counted from the start of the pair's ``F`` to the
            end of its last backward piece (``B``, or ``W`` when split). With one
            stage per rank this is the number of micro-batches whose activations
            are stashed; with ``v`` chunks per rank each pair stashes one chunk's
            activations.
    """

    num_ranks: int
    num_stages: int
    num_microbatches: int
    spans: tuple[Span, ...]
    grid: tuple[tuple[Action | None, ...], ...]
    step_ticks: int
    busy_ticks: tuple[int, ...]
    idle_ticks: tuple[int, ...]
    bubble_fraction: Fraction
    bubble_ratio: Fraction
    peak_in_flight: tuple[int, ...]

    def render(self) -> str:
        """A text Gantt chart: a header of tick numbers, then one row per rank.

        Each row is ``"rank R |"`` followed by exactly ``step_ticks`` cells
        separated by single spaces; a cell is the running action's kind and
        micro-batch (``F3``, ``B0``; with several stages on a rank, ``F3.1``
        names chunk 1) or ``.`` when the rank is idle, padded to one width. A
        two-tick backward fills two cells.
        """
        stages_per_rank: dict[int, list[int]] = {}
        for s in self.spans:
            lst = stages_per_rank.setdefault(s.rank, [])
            if s.action.stage not in lst:
                lst.append(s.action.stage)
        for lst in stages_per_rank.values():
            lst.sort()

        def label(rank: int, a: Action | None) -> str:
            if a is None:
                return "."
            text = f"{a.kind}{a.microbatch}"
            if len(stages_per_rank.get(rank, ())) > 1:
                text += f".{stages_per_rank[rank].index(a.stage)}"
            return text

        cells = [[label(r, a) for a in row] for r, row in enumerate(self.grid)]
        width = max([len(str(max(self.step_ticks - 1, 0)))] + [len(c) for row in cells for c in row])
        head = f"rank {self.num_ranks - 1}"
        lines = [" " * len(head) + " |" + " ".join(str(t).ljust(width) for t in range(self.step_ticks))]
        for r, row in enumerate(cells):
            lines.append(f"rank {r}".ljust(len(head)) + " |" + " ".join(c.ljust(width) for c in row))
        return "\n".join(line.rstrip() for line in lines)


# ----------------------------------------------------------------------------------------------
# replay


def _normalise_order(order, max_actions: int) -> dict[int, list[Action]]:
    if isinstance(order, Mapping):
        items = list(order.items())
    elif isinstance(order, Sequence) and not isinstance(order, (str, bytes)):
        items = list(enumerate(order))
    else:
        raise ConfigError("order", type(order).__name__, "must be a dict {rank: [Action, ...]} or a list of lists")
    out: dict[int, list[Action]] = {}
    total = 0
    for rank, actions in items:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ConfigError("rank", rank, "must be an integer >= 0")
        if isinstance(actions, (str, bytes)) or not isinstance(actions, Iterable):
            raise ConfigError(f"order[{rank}]", type(actions).__name__, "must be a list of actions")
        acts = []
        for a in actions:
            if a is None:  # an idle slot of a torch pipeline_order: replay the order, not the blanks
                continue
            if not isinstance(a, Action):
                raise ConfigError(f"order[{rank}]", a, "must hold Action objects or None (see from_torch_actions)")
            acts.append(a)
            total += 1
            if total > max_actions:
                raise ConfigError("order", f"<more than {max_actions} actions>",
                                  "must hold at most 3 actions per (stage, micro-batch) pair (pipeline.MAX_ACTIONS pairs)")
        out[rank] = acts
    if not out:
        raise ConfigError("order", order, "must have at least one rank")
    return out


def _backward_of(kinds: Mapping[tuple[int, int], str], stage: int, mb: int) -> Action:
    """The action that finishes the input gradient of (stage, mb): B, or I when split."""
    return Action(kinds[(stage, mb)], mb, stage)


def replay(
    order: Mapping[int, Sequence[Action | None]] | Sequence[Sequence[Action | None]],
    num_stages: int,
    num_microbatches: int,
    t_f: int = 1,
    t_b: int = 2,
    t_i: int | None = None,
    t_w: int | None = None,
    stage_to_rank: Mapping[int, int] | Sequence[int] | None = None,
) -> Timeline:
    """Run a per-rank action order tick by tick and return its :class:`Timeline`.

    Each rank runs its list in order; an action starts at
    ``max(time the rank is free, time its dependencies are done)`` (see the
    module docstring for the dependencies) and runs for its cost in ticks.

    Args:
        order: ``{rank: [Action | None, ...]}`` (or a list of lists, index =
            rank). ``None`` entries (idle slots of a torch ``pipeline_order``)
            are skipped: the order is replayed, blanks are not counted as time.
            Ranks missing from the keys but below the largest key are idle.
        num_stages: virtual stages, >= 1.
        num_microbatches: ``m``, >= 1.
        t_f: ticks of one forward of one stage, integer >= 1.
        t_b: ticks of one full backward, integer >= 1.
        t_i, t_w: ticks of an input-gradient / weight-gradient backward, integers
            >= 1. Only used when the order holds ``I``/``W`` actions; when both are
            None there, ``t_i = t_w = t_b / 2`` (``t_b`` must then be even).
        stage_to_rank: optional placement ``stage -> rank`` to check the order
            against; by default each stage's rank is the one whose list holds it.

    Every (stage, micro-batch) must appear exactly once as ``F`` and once as
    either ``B`` or the pair ``I`` + ``W`` (on the same rank as its ``F``).

    Raises:
        ConfigError: bad sizes or tick costs; an action outside
            ``num_stages``/``num_microbatches``; a duplicate or missing action; a
            stage on two ranks or off its ``stage_to_rank`` rank; ``B`` mixed with
            ``I``/``W`` for one (stage, micro-batch); ``I``/``W`` with no usable
            ``t_i``/``t_w``.
        DeadlockError: the order can never finish (names the blocked rank and action).
        ConfigError: ``num_stages * num_microbatches > MAX_ACTIONS``, more than
            ``3 * MAX_ACTIONS`` actions, or a timeline of more than
            ``MAX_GRID_CELLS`` rank-ticks (module docstring: size limits).
    """
    num_stages = check_positive_int("num_stages", num_stages)
    num_microbatches = check_positive_int("num_microbatches", num_microbatches)
    if num_stages * num_microbatches > MAX_ACTIONS:
        raise ConfigError("num_microbatches", num_microbatches,
                          f"gives num_stages*num_microbatches = {num_stages * num_microbatches} (stage, micro-batch) "
                          f"pairs, more than the tick-level simulation handles (pipeline.MAX_ACTIONS = {MAX_ACTIONS}); "
                          "for large sizes use the closed forms pipeline.* (distcheck.closed_form.get)")
    _check_ticks("t_f", t_f)
    _check_ticks("t_b", t_b)
    orders = _normalise_order(order, 3 * MAX_ACTIONS)
    num_ranks = max(orders) + 1
    S, M = num_stages, num_microbatches

    # --- completeness and placement
    seen: dict[Action, int] = {}
    placed: dict[int, int] = {}
    for rank, acts in orders.items():
        for a in acts:
            if a.stage >= S:
                raise ConfigError("stage", a.stage, f"must be < num_stages={S} (in {a} on rank {rank})")
            if a.microbatch >= M:
                raise ConfigError("microbatch", a.microbatch, f"must be < num_microbatches={M} (in {a} on rank {rank})")
            if a in seen:
                raise ConfigError("order", str(a), f"appears twice (ranks {seen[a]} and {rank})")
            seen[a] = rank
            if placed.setdefault(a.stage, rank) != rank:
                raise ConfigError("stage", a.stage, f"must live on one rank (found on ranks {placed[a.stage]} and {rank})")
    if stage_to_rank is not None:
        mapping = dict(stage_to_rank.items()) if isinstance(stage_to_rank, Mapping) else dict(enumerate(stage_to_rank))
        for s, r in placed.items():
            if mapping.get(s) != r:
                raise ConfigError(
                    "stage_to_rank", mapping.get(s), f"puts stage {s} on rank {mapping.get(s)}, but the order runs it on rank {r}"
                )

    split = any(a.kind in ("I", "W") for a in seen)
    if split:
        if t_i is None and t_w is None:
            if t_b % 2:
                raise ConfigError("t_i", None, f"is required when the order has I/W actions and t_b={t_b} is odd")
            t_i = t_w = t_b // 2
        _check_ticks("t_i", t_i)
        _check_ticks("t_w", t_w)
    cost = {"F": t_f, "B": t_b, "I": t_i, "W": t_w}

    kinds: dict[tuple[int, int], str] = {}
    for s in range(S):
        for j in range(M):
            if Action("F", j, s) not in seen:
                raise ConfigError("order", str(Action("F", j, s)), "is missing (every stage runs every micro-batch forward)")
            has_b, has_i, has_w = (Action(k, j, s) in seen for k in "BIW")
            if has_b and (has_i or has_w):
                raise ConfigError("order", str(Action("B", j, s)), "mixes a full backward B with split I/W for one micro-batch")
            if has_b:
                kinds[(s, j)] = "B"
            elif has_i and has_w:
                kinds[(s, j)] = "I"
            else:
                missing = "W" if has_i else ("I" if has_w else "B")
                raise ConfigError(
                    "order", str(Action(missing, j, s)), "is missing (each micro-batch needs B, or I and W, per stage)"
                )

    def deps(a: Action) -> list[Action]:
        s, j = a.stage, a.microbatch
        if a.kind == "F":
            return [Action("F", j, s - 1)] if s > 0 else []
        if a.kind == "W":
            return [Action("I", j, s)]
        out = [Action("F", j, s)]
        if s + 1 < S:
            out.append(_backward_of(kinds, s + 1, j))
        return out

    # --- list scheduling: each rank's next action runs once its dependencies are placed.
    # A rank whose next action waits on a dependency is parked on it and woken when it ends, so
    # the work is linear in the number of actions. The times do not depend on the visiting order:
    # an action starts at max(its rank free, its dependencies done).
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
            a = acts[pos[r]]
            ds = deps(a)
            missing = next((d for d in ds if d not in end), None)
            if missing is not None:
                parked.setdefault(missing, []).append(r)
                break
            start = max([free[r]] + [end[d] for d in ds])
            end[a] = start + cost[a.kind]
            free[r] = end[a]
            spans.append(Span(a, r, start, end[a]))
            pos[r] += 1
            ready.extend(parked.pop(a, ()))
    blocked = {}
    for r, acts in orders.items():
        if pos[r] < len(acts):
            a = acts[pos[r]]
            blocked[r] = (a, next(d for d in deps(a) if d not in end))
    if blocked:
        raise DeadlockError(blocked)

    return _timeline(spans, num_ranks, S, M)


def _timeline(spans: list[Span], num_ranks: int, num_stages: int, num_microbatches: int) -> Timeline:
    spans.sort(key=lambda s: (s.start, s.rank))
    step = max(s.end for s in spans) - min(s.start for s in spans)
    origin = min(s.start for s in spans)
    if num_ranks * step > MAX_GRID_CELLS:
        raise ConfigError("num_ranks*step_ticks", num_ranks * step,
                          f"must be <= pipeline.MAX_GRID_CELLS = {MAX_GRID_CELLS} (the timeline grid has one cell per rank "
                          f"and tick; here {num_ranks} ranks x {step} ticks): use fewer ranks or smaller tick costs t_f/t_b, or the "
                          "closed forms pipeline.* (distcheck.closed_form.get) for large sizes")
    grid = [[None] * step for _ in range(num_ranks)]
    busy = [0] * num_ranks
    for s in spans:
        busy[s.rank] += s.end - s.start
        for t in range(s.start - origin, s.end - origin):
            grid[s.rank][t] = s.action
    idle = [step - b for b in busy]

    # activation stash: a (stage, mb) pair is held from the start of its F to the end of its last backward piece
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

    total_busy = sum(busy)
    return Timeline(
        num_ranks=num_ranks,
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        spans=tuple(spans),
        grid=tuple(tuple(row) for row in grid),
        step_ticks=step,
        busy_ticks=tuple(busy),
        idle_ticks=tuple(idle),
        bubble_fraction=Fraction(sum(idle), num_ranks * step),
        bubble_ratio=Fraction(sum(idle), total_busy),
        peak_in_flight=tuple(peak),
    )


