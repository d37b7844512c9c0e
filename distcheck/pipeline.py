"""Tick-level simulator of pipeline-parallel schedules (the reference side of ``pipeline.*``).

Model. ``p`` ranks (pipeline stages) process ``m`` micro-batches. Every action
costs a whole number of ticks: a forward ``t_f`` (default 1), a full backward
``t_b`` (default 2), and, for zero-bubble style orders that split the backward,
an input-gradient backward ``t_i`` and a weight-gradient backward ``t_w``.
Communication is free and instantaneous; a rank runs one action at a time.
These are the idealised assumptions of the lesson "Scaling and distributed training" ("Pipeline bubble":
forward 1 tick, backward 2 ticks per stage, no communication time).

Stages are *virtual*: with interleaving each rank holds ``v`` model chunks and
virtual stage ``s = chunk * p + rank`` lives on rank ``s % p`` (the looped
placement of Megatron-LM and ``torch.distributed.pipelining``), so the model is
cut into ``v * p`` consecutive virtual stages and ``t_f``/``t_b`` are per chunk.

Dependencies (for one micro-batch ``j``):

* ``F`` of stage ``s`` needs ``F`` of stage ``s - 1``;
* the backward (``B`` or ``I``) of stage ``s`` needs the backward of stage
  ``s + 1`` and ``F`` of stage ``s`` (the last stage's backward needs only its
  own ``F``: the loss is computed at its end);
* ``W`` of stage ``s`` needs ``I`` of stage ``s``.

:func:`replay` runs any per-rank order under these rules, each rank in its
list's order, each action starting at ``max(rank free, dependencies done)``.
:func:`schedule_order` builds the orders of GPipe, 1F1B and interleaved 1F1B;
:func:`simulate` is ``replay(schedule_order(...))``. This module imports
neither sympy nor torch; :func:`from_torch_actions` duck-types torch's actions.

Size limits. The simulation is tick by tick in pure Python (about 20 us per
action), so its size is checked before any work:

* :data:`MAX_ACTIONS` = 10**6 forward actions, i.e. (virtual stage, micro-batch)
  pairs: ``p*v*m`` for :func:`schedule_order` / :func:`simulate`,
  ``num_stages * num_microbatches`` for :func:`replay`, whose order may hold at
  most ``3 * MAX_ACTIONS`` actions (F, then B or I and W, per pair);
* :data:`MAX_GRID_CELLS` = 10**7 cells of :attr:`Timeline.grid`
  (``num_ranks * step_ticks``; large tick costs make long timelines).

Beyond them a ConfigError points to the closed forms, which answer any size
exactly: ``distcheck.closed_form.get("pipeline.step_ticks.gpipe").evaluate(p=4, m=10**9)``
(also ``pipeline.bubble_fraction.*``, ``pipeline.peak_in_flight.*``, ...).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Mapping, Sequence

from distcheck.core.errors import ConfigError, DistcheckError
from distcheck.core.validate import check_choice, check_positive_int
from distcheck.core.vocab import Schedule, names

__all__ = [
    "Schedule",
    "SCHEDULES",
    "KINDS",
    "Action",
    "Span",
    "Timeline",
    "DeadlockError",
    "schedule_order",
    "replay",
    "simulate",
    "from_torch_actions",
    "MAX_ACTIONS",
    "MAX_GRID_CELLS",
]

#: the most (virtual stage, micro-batch) pairs one tick-level simulation runs (module docstring)
MAX_ACTIONS = 10**6
#: the most cells (ranks x ticks) of one Timeline.grid
MAX_GRID_CELLS = 10**7


def _closed_form_hint(schedule: str, p: int, m: int, v: int) -> str:
    args = f"p={p}, m={m}" + (f", v={v}" if schedule == Schedule.INTERLEAVED else "")
    return (f"for large sizes use the closed forms, e.g. "
            f"distcheck.closed_form.get('pipeline.step_ticks.{schedule}').evaluate({args})")

#: the schedules :func:`schedule_order` and :func:`simulate` know (:class:`distcheck.core.vocab.Schedule`)
SCHEDULES: tuple[str, ...] = names(Schedule)
#: action kinds: forward, full backward, input-gradient backward, weight-gradient backward
KINDS: tuple[str, ...] = ("F", "B", "I", "W")


@dataclass(frozen=True)
class Action:
    """One unit of work of one rank.

    Attributes:
        kind: ``"F"`` forward, ``"B"`` full backward, ``"I"`` backward for the
            inputs only, ``"W"`` backward for the weights only (zero-bubble
            schedules split ``B`` into ``I`` then ``W``).
        microbatch: micro-batch index, ``0 <= microbatch < m``.
        stage: virtual stage index, ``0 <= stage < num_stages``; for interleaved
            schedules ``stage = chunk * p + rank``.

    Raises ConfigError for an unknown ``kind`` or a negative / non-integer
    ``microbatch`` or ``stage``.
    """

    kind: str
    microbatch: int
    stage: int

    def __post_init__(self):
        check_choice("kind", self.kind, KINDS)
        if isinstance(self.microbatch, bool) or not isinstance(self.microbatch, int) or self.microbatch < 0:
            raise ConfigError("microbatch", self.microbatch, "must be an integer >= 0")
        if isinstance(self.stage, bool) or not isinstance(self.stage, int) or self.stage < 0:
            raise ConfigError("stage", self.stage, "must be an integer >= 0")

    def __str__(self) -> str:
        return f"{self.kind}(mb={self.microbatch}, stage={self.stage})"


@dataclass(frozen=True)
class Span:
    """An action placed in time: it occupies ticks ``start .. end - 1`` of ``rank``."""

    action: Action
    rank: int
    start: int
    end: int


class DeadlockError(DistcheckError, ValueError):
    """A per-rank order that can never finish: every unfinished rank waits on an
    action that another rank has not reached yet (a cycle of waits).

    Attributes: ``rank`` and ``action`` (the first blocked rank and the action it
    is stuck at), ``waiting_for`` (the dependency of ``action`` that never runs),
    ``blocked`` (every blocked rank -> (its next action, the dependency it waits for)).
    """

    def __init__(self, blocked: Mapping[int, tuple[Action, Action]]):
        self.blocked = dict(blocked)
        self.rank = min(self.blocked)
        self.action, self.waiting_for = self.blocked[self.rank]
        detail = "; ".join(f"rank {r} at {a} waits for {d}" for r, (a, d) in sorted(self.blocked.items()))
        super().__init__(f"deadlock: rank {self.rank} cannot run {self.action} ({detail})")

    def __reduce__(self):
        return (type(self), (self.blocked,))


def _check_ticks(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(field, value, "must be a positive integer number of ticks")
    if value < 1:
        raise ConfigError(field, value, "must be >= 1 tick")
    return value


def _check_shape(schedule: str, p: object, m: object, v: object) -> None:
    check_choice("schedule", schedule, SCHEDULES)
    p = check_positive_int("p", p)
    m = check_positive_int("m", m)
    v = check_positive_int("v", v)
    if schedule == Schedule.INTERLEAVED:
        if v < 2:
            raise ConfigError("v", v, "must be >= 2 for the interleaved schedule (v=1 is plain 1f1b)")
        if m % p != 0:
            raise ConfigError("m", m, f"must be a multiple of p={p} for the interleaved schedule")
    elif v != 1:
        raise ConfigError("v", v, f"must be 1 for the {schedule} schedule (chunks per rank need 'interleaved')")
    if p * v * m > MAX_ACTIONS:
        raise ConfigError("m", m, f"gives p*v*m = {p}*{v}*{m} = {p * v * m} (stage, micro-batch) pairs, more than "
                                  f"the tick-level simulation handles (pipeline.MAX_ACTIONS = {MAX_ACTIONS}); "
                                  + _closed_form_hint(schedule, p, m, v))


# ----------------------------------------------------------------------------------------------
# schedule orders


def _gpipe(p: int, m: int) -> dict[int, list[Action]]:
    return {r: [Action("F", j, r) for j in range(m)] + [Action("B", j, r) for j in range(m)] for r in range(p)}


def _one_f_one_b(p: int, m: int) -> dict[int, list[Action]]:
    order: dict[int, list[Action]] = {}
    for r in range(p):
        warmup = min(p - r - 1, m)
        ops = [Action("F", j, r) for j in range(warmup)]
        for k in range(m - warmup):  # steady state: one forward, one backward
            ops.append(Action("F", warmup + k, r))
            ops.append(Action("B", k, r))
        ops.extend(Action("B", j, r) for j in range(m - warmup, m))  # cool-down
        order[r] = ops
    return order


def _interleaved(p: int, m: int, v: int) -> dict[int, list[Action]]:
    total = m * v  # (chunk, micro-batch) pairs per rank

    def chunk_and_mb(k: int, forward: bool) -> tuple[int, int]:
        group, in_group = divmod(k, p * v)
        chunk = in_group // p
        if not forward:
            chunk = v - 1 - chunk
        return chunk, group * p + in_group % p

    order: dict[int, list[Action]] = {}
    for r in range(p):
        warmup = min((p - r - 1) * 2 + (v - 1) * p, total)

        def fwd(k: int) -> Action:
            c, j = chunk_and_mb(k, True)
            return Action("F", j, c * p + r)

        def bwd(k: int) -> Action:
            c, j = chunk_and_mb(k, False)
            return Action("B", j, c * p + r)

        ops = [fwd(k) for k in range(warmup)]
        for k in range(total - warmup):
            ops.append(fwd(k + warmup))
            ops.append(bwd(k))
        ops.extend(bwd(k) for k in range(total - warmup, total))
        order[r] = ops
    return order


def schedule_order(schedule: Schedule | str, p: int, m: int, v: int = 1) -> dict[int, list[Action]]:
    """The per-rank action order of a named schedule.

    Args:
        schedule: one of :data:`SCHEDULES`:

            * ``"gpipe"`` (Huang et al. 2019): every rank runs its ``m`` forwards,
              then its ``m`` backwards. Any ``p, m >= 1``; ``v`` must be 1.
            * ``"1f1b"`` (PipeDream-Flush, Narayanan et al. 2021 §2.2.1): rank
              ``r`` runs ``min(p - r - 1, m)`` warm-up forwards, then alternates
              one forward and one backward, then runs the remaining backwards.
              Any ``p, m >= 1``; ``v`` must be 1.
            * ``"interleaved"`` (Narayanan et al. 2021 §2.2.2; Megatron-LM's
              ``forward_backward_pipelining_with_interleaving``): each rank holds
              ``v >= 2`` chunks; forwards walk micro-batches in groups of ``p``,
              chunk by chunk (backwards walk the chunks in reverse); rank ``r``
              warms up with ``min(2 (p - r - 1) + (v - 1) p, v m)`` forwards, then
              runs 1F1B pairs, then the remaining backwards. Requires
              ``m % p == 0``. (This is also what
              ``torch.distributed.pipelining.ScheduleInterleaved1F1B`` builds when
              ``m % p == 0``; older Megatron-LM put every forward into the warm-up
              when ``m == p``.)
        p: ranks (pipeline stages), >= 1.
        m: micro-batches, >= 1.
        v: model chunks per rank, >= 1 (>= 2 for ``"interleaved"``).

    Returns:
        ``{rank: [Action, ...]}`` for ranks ``0 .. p-1``; virtual stage
        ``chunk * p + rank`` (so ``stage == rank`` when ``v == 1``).

    Raises:
        ConfigError: unknown schedule, ``p``/``m``/``v`` not positive integers,
        ``v != 1`` outside interleaved, ``v < 2`` or ``m % p != 0`` for interleaved,
        ``p*v*m > MAX_ACTIONS`` (use the closed forms ``pipeline.*`` then).
    """
    _check_shape(schedule, p, m, v)
    if schedule == Schedule.GPIPE:
        return _gpipe(p, m)
    if schedule == Schedule.ONE_F_ONE_B:
        return _one_f_one_b(p, m)
    return _interleaved(p, m, v)


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


def simulate(schedule: Schedule | str, p: int, m: int, v: int = 1, t_f: int = 1, t_b: int = 2) -> Timeline:
    """Simulate a named schedule: ``replay(schedule_order(schedule, p, m, v), ...)``.

    Args: as :func:`schedule_order` (``p`` ranks, ``m`` micro-batches, ``v``
    chunks per rank), plus ``t_f``/``t_b``: ticks of one forward/backward of one
    stage (of one chunk when interleaved), positive integers (lesson: 1 and 2).

    Figures of the lesson "Scaling and distributed training": ``simulate("gpipe", 4, 4).step_ticks == 21`` with
    ``bubble_fraction == 3/7``; ``p=4, m=16`` gives 57 ticks and ``3/19``.

    Raises:
        ConfigError: as :func:`schedule_order`, or ``t_f``/``t_b`` not positive integers.
    """
    _check_ticks("t_f", t_f)
    _check_ticks("t_b", t_b)
    order = schedule_order(schedule, p, m, v)
    stages = v * p
    return replay(order, stages, m, t_f=t_f, t_b=t_b, stage_to_rank={s: s % p for s in range(stages)})


# ----------------------------------------------------------------------------------------------
# torch.distributed.pipelining adapter

#: torch _ComputationType names -> Action kinds
_TORCH_COMPUTE = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}
#: torch action types that take no compute time in this model (communication, FSDP resharding, grad reduction)
_TORCH_FREE = {"SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD"}


def _torch_kind_name(ctype) -> str:
    name = getattr(ctype, "name", None)
    if isinstance(name, str):
        return name
    return str(ctype)


def _convert_torch_action(rank: int, a, out: list[Action]) -> None:
    name = _torch_kind_name(getattr(a, "computation_type", None))
    if name in _TORCH_COMPUTE:
        try:
            out.append(Action(_TORCH_COMPUTE[name], a.microbatch_index, a.stage_index))
        except ConfigError as exc:
            raise ConfigError(f"pipeline_order[{rank}]", a, f"is not a valid action: {exc}") from None
    elif name == "OVERLAP_F_B":
        subs = getattr(a, "sub_actions", None) or ()
        for sub in subs:  # overlapped forward+backward: modelled as its parts run back to back
            _convert_torch_action(rank, sub, out)
    elif name in _TORCH_FREE:
        return
    else:
        raise ConfigError(
            f"pipeline_order[{rank}]", a,
            f"has computation type {name!r}; expected one of {', '.join(sorted(_TORCH_COMPUTE))} (or a free comm action)",
        )


def from_torch_actions(pipeline_order) -> dict[int, list[Action]]:
    """Convert a ``torch.distributed.pipelining`` ``pipeline_order`` to :func:`replay`'s format.

    Torch is not imported: each entry is duck-typed through its
    ``.computation_type`` (mapped by enum *name*: ``FORWARD`` -> F,
    ``FULL_BACKWARD`` -> B, ``BACKWARD_INPUT`` -> I, ``BACKWARD_WEIGHT`` -> W),
    ``.microbatch_index`` and ``.stage_index``. ``None`` entries (idle slots)
    are dropped; zero-cost actions (``SEND_*``, ``RECV_*``, ``UNSHARD``,
    ``RESHARD``, ``REDUCE_GRAD``) are dropped; ``OVERLAP_F_B`` is replaced by
    its ``sub_actions`` in order (this model does not overlap them).

    Args:
        pipeline_order: ``{rank: [action | None, ...]}`` or a list of such lists.

    Returns:
        ``{rank: [Action, ...]}``.

    Raises:
        ConfigError: an entry with another computation type or a bad index.
    """
    if isinstance(pipeline_order, Mapping):
        items = list(pipeline_order.items())
    elif isinstance(pipeline_order, Sequence) and not isinstance(pipeline_order, (str, bytes)):
        items = list(enumerate(pipeline_order))
    else:
        raise ConfigError(
            "pipeline_order", type(pipeline_order).__name__, "must be a dict {rank: [action, ...]} or a list of lists"
        )
    out: dict[int, list[Action]] = {}
    for rank, actions in items:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ConfigError("rank", rank, "must be an integer >= 0")
        if isinstance(actions, (str, bytes, Mapping)) or not isinstance(actions, Iterable):
            raise ConfigError(f"pipeline_order[{rank}]", type(actions).__name__, "must be a list of actions")
        acts: list[Action] = []
        for a in actions:
            if a is not None:
                _convert_torch_action(rank, a, acts)
        out[rank] = acts
    return out
