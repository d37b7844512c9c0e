"""Real-backend checks that have not moved into their parallelism package yet (transitional).

Every real-backend check of ``distcheck check`` is a parallelism package's ``checks`` role
module (``distcheck/parallel/<name>/checks.py``), found by discovery
(:func:`distcheck.stages.discover_checks`); the protocol is in :mod:`distcheck.stages`.
The drivers below still live in ``distcheck/runners/``: each :class:`NotYetMoved` entry
presents one of them to the stages as if it were such a module. When a driver moves into its
package, its entry is deleted (one line).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import SimpleNamespace

__all__ = ["NOT_YET_MOVED", "NotYetMoved", "not_yet_moved"]


@dataclass(frozen=True)
class NotYetMoved:
    """A driver in ``distcheck/runners/``, seen by the stages as a ``checks`` module.

    Attributes:
        name: the parallelism package it will move into (the checks' name in the stage).
        module: the module that holds the driver.
        driver: ``driver(world, timeout_s=..., **kwargs)`` gives its rows on one world.
        kwargs: keyword arguments of every call of ``driver`` (and of ``unavailable``).
        world_free: the name of a function of ``module`` that gives the rows needing no world, or None.
        stage: the world stage it joins (``"layers"`` or ``"distributed"``).
        preload: modules a pool's parent imports before forking.
        unavailable: ``unavailable([world_size], backend=..., timeout_s=..., **kwargs)`` gives the
            ``skip`` rows for a world the backend cannot run here (decided before anything
            starts); None: ``driver`` itself, called that way.
    """

    name: str
    module: str
    driver: str
    kwargs: dict = field(default_factory=dict)
    world_free: str | None = None
    stage: str = "layers"
    preload: tuple[str, ...] = ()
    unavailable: str | None = None

    def _fn(self, name: str):
        return getattr(importlib.import_module(self.module), name)

    def as_checks_module(self) -> SimpleNamespace:
        """An object with the attributes of a ``checks`` module (``world_rows``, ``skip_rows``,
        ``world_free_rows`` when there is one, ``STAGE``, ``PRELOAD``)."""
        out = SimpleNamespace(
            __name__=f"{self.module}:{self.driver}", STAGE=self.stage, PRELOAD=self.preload,
            world_rows=lambda world, *, timeout_s: self._fn(self.driver)(world, timeout_s=timeout_s, **self.kwargs),
            skip_rows=lambda world_size, backend, reason: self._fn(self.unavailable or self.driver)(
                [world_size], backend=backend, timeout_s=60.0, **self.kwargs))
        if self.world_free is not None:
            out.world_free_rows = lambda: self._fn(self.world_free)()
        return out


#: the drivers that have not moved into their package yet
NOT_YET_MOVED: tuple[NotYetMoved, ...] = (
    NotYetMoved("pp", "distcheck.runners.pipelining", "run_pipelining_checks", {"tables": False}, "run_table_checks"),
)


def not_yet_moved() -> list[tuple[str, SimpleNamespace]]:
    """``(name, checks module)`` of every entry of :data:`NOT_YET_MOVED`, in order."""
    return [(entry.name, entry.as_checks_module()) for entry in NOT_YET_MOVED]
