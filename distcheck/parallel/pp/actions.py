"""The vocabulary of the pipeline simulator: actions, spans, limits and tick checks.

An :class:`Action` is one unit of work of one rank (a forward, a full backward, or the
input- and weight-gradient halves of a split backward) on one micro-batch and one
virtual stage; a :class:`Span` places it in time. The simulator itself is
:mod:`distcheck.parallel.pp.simulator` (replay of any per-rank order, on arrays) and
:mod:`distcheck.parallel.pp.schedules` (the named schedules).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from distcheck.core.errors import ConfigError, DistcheckError
from distcheck.core.validate import check_choice, check_int
from distcheck.core.vocab import Schedule, names

__all__ = ["SCHEDULES", "KINDS", "Action", "Span", "DeadlockError", "MAX_ACTIONS", "MAX_GRID_CELLS"]

#: the most actions one simulated order may hold (F, B, I and W each count one)
MAX_ACTIONS = 10**7
#: the most cells (ranks x ticks) of one Timeline.grid (built only when asked for)
MAX_GRID_CELLS = 10**7

#: the schedules :func:`~distcheck.parallel.pp.schedules.schedule_order` and ``simulate`` know
#: (:class:`distcheck.core.vocab.Schedule`)
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

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, KINDS)
        for name in ("microbatch", "stage"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), min_value=0,
                                                     rule="must be an integer >= 0"))

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

    def __reduce__(self) -> tuple[type[DeadlockError], tuple[dict[int, tuple[Action, Action]]]]:
        return (type(self), (self.blocked,))


def _check_ticks(field: str, value: object) -> int:
    """``value`` as an int >= 1 (ticks of one action); ConfigError naming ``field`` otherwise."""
    value = check_int(field, value, rule="must be a positive integer number of ticks")
    if value < 1:
        raise ConfigError(field, value, "must be >= 1 tick")
    return value
