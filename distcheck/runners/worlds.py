"""Local worlds for a run of several checks: one rank pool per world size, shared.

``distcheck check`` runs the DDP checks and every layer's checks on the same pools:
:class:`LocalWorlds` starts a :class:`~distcheck.runners.pool.RankPool` for a world size
the first time a stage asks for it, hands the same pool to every later stage, and closes
them all at the end (or when the ``with`` block is left by an exception, Ctrl-C or
SIGTERM turned into an exception), so every rank, descendant and folder goes with it.
:func:`iter_pools` serves a driver that takes either a world or world sizes.

Sharing is safe because a pool's ranks keep no state between steps that a check relies
on: each rank function builds its models and groups from explicit seeds, and a failed step
tears the world down (the next step starts a fresh one), so one check's failure does not
leak into the next one's rows. Only ``ctx.scratch`` persists, and only within one world.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Self

from distcheck.core.errors import BackendUnavailable, ConfigError
from distcheck.core.validate import check_positive_int
from distcheck.engine.drivers import is_world
from distcheck.engine.world import World
from distcheck.runners.pool import RankPool

__all__ = ["LocalWorlds", "iter_pools"]


class LocalWorlds:
    """One :class:`~distcheck.runners.pool.RankPool` per world size, started on first use.

    Arguments:
        backend, timeout_s, preload: passed to every pool (see :class:`RankPool`); ``preload``
            should name every module any of the checks wants imported before forking.

    :meth:`get` raises what the pool's constructor raises (``BackendUnavailable`` when the
    backend cannot run that many ranks here, ``ConfigError`` for a bad argument), decided
    before anything starts. Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, backend: str, timeout_s: float, preload: Sequence[str] = ()):
        self.backend, self.timeout_s, self.preload = backend, timeout_s, tuple(preload)
        self._pools: dict[int, RankPool] = {}

    def get(self, world_size: int) -> World:
        """The pool of ``world_size`` ranks (created now if this is the first request)."""
        if world_size not in self._pools:
            self._pools[world_size] = RankPool(world_size, backend=self.backend, timeout_s=self.timeout_s,
                                               preload=self.preload)
        return self._pools[world_size]

    @property
    def world_sizes(self) -> list[int]:
        """World sizes of the pools created so far, in order of creation."""
        return list(self._pools)

    def close(self) -> None:
        """Close every pool (each removes its ranks, their descendants and its folder); idempotent."""
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def _pool_for(world_size: int, backend: str, timeout_s: float) -> Iterator[RankPool]:
    with RankPool(world_size=world_size, backend=backend, timeout_s=timeout_s) as pool:
        yield pool


def iter_pools(pool_or_world_sizes: Any, backend: str = "gloo",
               timeout_s: float = 60.0) -> Iterator[tuple[Any, int, str, str | None]]:
    """Yield ``(world, world_size, backend, skip_reason)`` for each world to check.

    ``pool_or_world_sizes`` is a world (see :func:`is_world`: a started or
    unstarted ``RankPool``, a ``TorchrunWorld``, ...) used as is with its own
    world size and backend, an int world size, or a sequence of them (a pool is
    opened per world size with ``backend`` and closed after its checks). When a
    backend cannot run here (e.g. NCCL without GPUs) the world is ``None`` and
    ``skip_reason`` says why; the caller emits ``skip`` rows.

    Raises:
        ConfigError: a world size that is not an int >= 1, or an empty sequence.
    """
    if is_world(pool_or_world_sizes):
        yield pool_or_world_sizes, pool_or_world_sizes.world_size, pool_or_world_sizes.backend, None
        return
    # world sizes (ints) and worlds, as given
    sizes: list[Any] = [pool_or_world_sizes] if isinstance(pool_or_world_sizes, int) else list(pool_or_world_sizes)
    if not sizes:
        raise ConfigError("pool_or_world_sizes", pool_or_world_sizes, "must name at least one world size")
    for ws in sizes:
        if is_world(ws):
            yield ws, ws.world_size, ws.backend, None
            continue
        check_positive_int("world_size", ws)
        try:
            cm = _pool_for(ws, backend, timeout_s)
            pool = cm.__enter__()
        except BackendUnavailable as exc:
            yield None, ws, backend, str(exc)
            continue
        try:
            yield pool, ws, backend, None
        finally:
            cm.__exit__(None, None, None)
