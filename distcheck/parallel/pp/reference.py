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
The actions, limits and checks are :mod:`distcheck.parallel.pp.actions`; the replay and
the timeline :mod:`distcheck.parallel.pp.timeline`; this module re-exports both.

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

from collections.abc import Iterable, Mapping, Sequence

from distcheck.core.errors import ConfigError
from distcheck.core.vocab import Schedule
from distcheck.parallel.pp.actions import (
    KINDS,
    MAX_ACTIONS,
    MAX_GRID_CELLS,
    SCHEDULES,
    Action,
    DeadlockError,
    Span,
    _check_shape,
    _check_ticks,
)
from distcheck.parallel.pp.timeline import Timeline, replay

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
