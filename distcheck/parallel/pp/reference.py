"""Simulator of pipeline-parallel schedules (the reference side of ``pp.*``): public path
:mod:`distcheck.parallel.pp`.

Model. ``p`` ranks (pipeline stages) process ``m`` micro-batches. Every action costs a whole
number of ticks: a forward ``t_f`` (default 1), a full backward ``t_b`` (default 2), and, for
the zero-bubble orders that split the backward, an input-gradient backward ``t_i`` and a
weight-gradient backward ``t_w``; DualPipe's overlapped forward + backward pairs cost ``t_fb``.
Communication is free and instantaneous; a rank runs one action (or pair) at a time. These are
the idealised assumptions of the lesson "Scaling and distributed training" ("Pipeline bubble":
forward 1 tick, backward 2 ticks per stage, no communication time).

Stages are *virtual*: with ``v`` chunks per rank the model is cut into ``v * p`` consecutive
stages, placed in a loop (stage ``s`` on rank ``s % p``: Megatron-LM, torch) or in a V (rank
``r`` holds stages ``r`` and ``2p - 1 - r``: ZB-V, DualPipe); ``t_f``/``t_b`` are per stage.

Dependencies (for one micro-batch ``j``):

* ``F`` of stage ``s`` needs ``F`` of stage ``s - 1``;
* the backward (``B`` or ``I``) of stage ``s`` needs the backward of stage ``s + 1`` and
  ``F`` of stage ``s`` (the last stage's backward needs only its own ``F``: the loss is
  computed at its end);
* ``W`` of stage ``s`` needs ``I`` of stage ``s``.

:func:`replay` runs any per-rank order under these rules, each rank in its list's order,
each action starting at ``max(rank free, dependencies done)``
(:mod:`distcheck.parallel.pp.simulator`: arrays, a prefix maximum per rank, a few sweeps over
the ranks, exact). :func:`schedule_order` builds the orders of the named schedules
(:mod:`distcheck.parallel.pp.schedules`); :func:`simulate` is ``replay(schedule_order(...))``.
This module imports neither sympy nor torch; :func:`from_torch_actions` duck-types torch's
actions.

Size limits, checked before any work:

* :data:`MAX_ACTIONS` = 10**7 actions in one order (and as many (stage, micro-batch) pairs);
  p = 64, m = 1024, v = 4 (524,288 actions of interleaved 1F1B) simulates in about a tenth
  of a second (``benchmarks/bench_pipeline.py``);
* :data:`MAX_GRID_CELLS` = 10**7 cells of :attr:`Timeline.grid` (``num_ranks * step_ticks``;
  large tick costs make long timelines). The grid and the spans are built only when asked
  for: the figures need neither.

Beyond them a ConfigError points to the closed forms, which answer any size exactly:
``distcheck.closed_form.get("pp.step_ticks.gpipe").evaluate(p=4, m=10**9)`` (also
``pp.bubble_fraction.*``, ``pp.peak_in_flight.*``, ``pp.bubble_ticks.*`` ...).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from distcheck.core.errors import ConfigError
from distcheck.core.vocab import Schedule
from distcheck.parallel.pp.actions import KINDS, MAX_ACTIONS, MAX_GRID_CELLS, SCHEDULES, Action, DeadlockError, Span
from distcheck.parallel.pp.schedules import SPLIT_BACKWARD, placement, schedule_order, simulate
from distcheck.parallel.pp.simulator import replay
from distcheck.parallel.pp.timeline import Timeline

__all__ = [
    "Schedule",
    "SCHEDULES",
    "SPLIT_BACKWARD",
    "KINDS",
    "Action",
    "Span",
    "Timeline",
    "DeadlockError",
    "schedule_order",
    "placement",
    "replay",
    "simulate",
    "from_torch_actions",
    "MAX_ACTIONS",
    "MAX_GRID_CELLS",
]


# ----------------------------------------------------------------------------------------------
# torch.distributed.pipelining adapter

#: torch _ComputationType names -> Action kinds
_TORCH_COMPUTE = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}
#: torch action types that take no compute time in this model (communication, FSDP resharding, grad reduction)
_TORCH_FREE = {"SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD"}


def _torch_kind_name(ctype: object) -> str:
    name = getattr(ctype, "name", None)
    if isinstance(name, str):
        return name
    return str(ctype)


def _convert_torch_action(rank: int, a: Any, out: list, pairs: bool = False) -> None:
    name = _torch_kind_name(getattr(a, "computation_type", None))
    if name in _TORCH_COMPUTE:
        try:
            out.append(Action(_TORCH_COMPUTE[name], a.microbatch_index, a.stage_index))
        except ConfigError as exc:
            raise ConfigError(f"pipeline_order[{rank}]", a, f"is not a valid action: {exc}") from None
    elif name == "OVERLAP_F_B":
        subs: list = []
        for sub in getattr(a, "sub_actions", None) or ():
            _convert_torch_action(rank, sub, subs)
        if pairs and len(subs) == 2:
            out.append(tuple(subs))  # run together: one overlapped pair
        else:
            out.extend(subs)  # run back to back
    elif name in _TORCH_FREE:
        return
    else:
        raise ConfigError(
            f"pipeline_order[{rank}]", a,
            f"has computation type {name!r}; expected one of {', '.join(sorted(_TORCH_COMPUTE))} "
            "(or a free comm action)",
        )


def from_torch_actions(pipeline_order: Mapping[int, Sequence[Any]] | Sequence[Sequence[Any]], *,
                       pairs: bool = False) -> dict[int, list]:
    """Convert a ``torch.distributed.pipelining`` ``pipeline_order`` to :func:`replay`'s format.

    Torch is not imported: each entry is duck-typed through its
    ``.computation_type`` (mapped by enum *name*: ``FORWARD`` -> F,
    ``FULL_BACKWARD`` -> B, ``BACKWARD_INPUT`` -> I, ``BACKWARD_WEIGHT`` -> W),
    ``.microbatch_index`` and ``.stage_index``. ``None`` entries (idle slots)
    are dropped; zero-cost actions (``SEND_*``, ``RECV_*``, ``UNSHARD``,
    ``RESHARD``, ``REDUCE_GRAD``) are dropped; ``OVERLAP_F_B`` is replaced by
    its ``sub_actions`` in order, run back to back, or, with ``pairs=True``, kept as one
    overlapped ``(Action, Action)`` pair (:func:`replay`'s ``t_fb``).

    Args:
        pipeline_order: ``{rank: [action | None, ...]}`` or a list of such lists.

    Returns:
        ``{rank: [Action | (Action, Action), ...]}``.

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
        acts: list = []
        for a in actions:
            if a is not None:
                _convert_torch_action(rank, a, acts, pairs)
        out[rank] = acts
    return out
