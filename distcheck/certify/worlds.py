"""The worlds a certification runs on: a world given by the caller (borrowed, never closed), pools opened per
world size and closed after, the in-process world of one rank (:class:`LocalWorld`), and the companion worlds
of a contract whose examples also run on other sizes (:class:`Companions`: a checkpoint saved on N ranks and
loaded on fewer or more), one :class:`~distcheck.runners.pool.RankPool` per size.

Every size is checked before anything starts: a size that is not a positive integer raises ConfigError, a
backend that cannot run it here BackendUnavailable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Literal

from distcheck.certify.reproduce import LOCAL_BACKEND
from distcheck.core.errors import ConfigError, RankFailure
from distcheck.core.validate import check_positive_int
from distcheck.engine.contracts.contract import Contract
from distcheck.engine.contracts.targets import from_signal
from distcheck.engine.world import World

if TYPE_CHECKING:
    from distcheck.runners.pool import RankPool

__all__ = ["LocalWorld", "Companions", "world_of_one", "Joined", "companions_for", "worlds_for"]


class LocalWorld:
    """A world of one rank in this process, for contracts that need no process group.

    What the rank function raises is reported as a rank pool reports it, a
    :class:`~distcheck.core.errors.RankFailure` of rank 0 with the traceback (the exception chained), so
    that a target that raises fails the example's properties instead of stopping the run. That holds
    for any ``BaseException``, as on a rank: a target that calls ``sys.exit(0)`` or raises
    ``KeyboardInterrupt`` fails (``rank 0 raised SystemExit: 0``) and never ends the run as if
    it had passed; only a real Ctrl-C or SIGTERM (:func:`~distcheck.engine.contracts.targets.from_signal`)
    goes through."""

    world_size = 1
    backend = LOCAL_BACKEND

    def __init__(self) -> None:
        self._ctx = SimpleNamespace(rank=0, world_size=1, backend="local", device="cpu", local_rank=0, scratch={})

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> list[Any]:
        try:
            return [fn(self._ctx, *args)]
        except BaseException as exc:  # what the target raised is its failure (see the class doc)
            if from_signal(exc):
                raise
            import traceback

            raise RankFailure(0, "".join(traceback.format_exception(exc))) from exc


def world_of_one(world: World) -> Callable[[int], World]:
    """``world_of`` of a world given without companions: ``world`` itself, and a ConfigError for any other size."""
    def world_of(n: int) -> World:
        if n != world.world_size:
            raise ConfigError("world_size", n, f"has no world here: only the world of {world.world_size} ranks was "
                                               "given (certify opens the companion worlds a contract names)")
        return world
    return world_of


class Companions:
    """The companion worlds of one certification (:meth:`Contract.companion_worlds`): the ``given`` worlds
    (borrowed: never closed here) and one :class:`~distcheck.runners.pool.RankPool` per other size, of
    ``backend`` with ``timeout_s`` and ``preload``, made on first use, started by its first ``run`` and closed
    by :meth:`close`."""

    def __init__(self, backend: str, timeout_s: float, preload: Sequence[str] = (),
                 given: dict[int, World] | None = None) -> None:
        self.backend, self.timeout_s, self.preload = backend, timeout_s, tuple(preload)
        self.given: dict[int, World] = dict(given or {})
        self.opened: dict[int, RankPool] = {}

    def world(self, n: int) -> World:
        """The world of ``n`` ranks."""
        if n in self.given:
            return self.given[n]
        if n not in self.opened:
            from distcheck.runners.pool import RankPool

            self.opened[n] = RankPool(n, backend=self.backend, timeout_s=self.timeout_s, preload=self.preload)
        return self.opened[n]

    def close(self, keep: Sequence[int] = ()) -> None:
        """Close every pool opened here, but those of the sizes in ``keep``."""
        for n in [n for n in self.opened if n not in keep]:
            self.opened.pop(n).close()


class Joined:
    """The certified world with its companions: runs as ``world`` does; ``world_of(n)`` is ``world`` for its own
    size, else the companion of ``n`` ranks."""

    def __init__(self, world: World, companions: Companions) -> None:
        self.world, self.companions = world, companions

    @property
    def world_size(self) -> int:
        return self.world.world_size

    @property
    def backend(self) -> str:
        return self.world.backend

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> list[Any]:
        return self.world.run(fn, *args, timeout_s=timeout_s)

    def run_on(self, fn: Callable[..., Any], args_per_rank: Sequence[Sequence[Any]],
               timeout_s: float | None = None) -> list[Any]:
        return self.world.run_on(fn, args_per_rank, timeout_s=timeout_s)

    def world_of(self, n: int) -> World:
        return self.world if n == self.world.world_size else self.companions.world(n)


def companions_for(contract: Contract, opts: dict, worlds: list, backend: str, timeout_s: float,
                given: dict[int, World] | None) -> Companions | None:
    """The companion worlds the certification's worlds need (None: the contract names none), every size checked
    before anything starts. Raises ConfigError when a given world is not a pool (a torchrun world cannot open
    others beside it) and BackendUnavailable when the backend cannot run a companion's size here."""
    if given is not None:
        if not isinstance(given, dict):
            raise ConfigError("companions", type(given).__name__, "must be a dict of world size -> world")
        for n, w in given.items():
            if isinstance(n, bool) or not isinstance(n, int) or getattr(w, "world_size", None) != n:
                raise ConfigError(f"companions[{n!r}]", type(w).__name__,
                                  f"must be a world of {n!r} ranks (its world_size is "
                                  f"{getattr(w, 'world_size', None)!r})")
    wanted = {n for w in worlds for n in contract.companion_worlds(w.world_size, opts)}
    if not wanted:
        return None
    from distcheck.runners.pool import RankPool, check_backend_available

    needed = sorted(wanted - set(given or {}))
    preload: tuple[str, ...] = tuple(contract.preload)
    for w in worlds:
        if isinstance(w, _Borrowed):
            if needed and not isinstance(w.world, RankPool):
                raise ConfigError("world", type(w.world).__name__,
                                  f"must be a RankPool: contract {contract.name} also runs examples on worlds of "
                                  f"{', '.join(map(str, needed))} ranks, opened beside it (see the contract's options "
                                  "to keep every example on one world)")
            if isinstance(w.world, RankPool):
                backend, timeout_s = w.world.backend, w.world.timeout_s
                preload += tuple(m for m in w.world.preload if m not in preload)
    for n in needed:
        check_positive_int("world_size", n)
        check_backend_available(backend, n)
    return Companions(backend, timeout_s, preload, given)


class _Borrowed:
    """A world given by the caller: entered and left without closing it."""

    def __init__(self, world: Any) -> None:  # a World, or LocalWorld (no run_on)
        self.world = world

    @property
    def world_size(self) -> int:
        return self.world.world_size

    def __enter__(self) -> Any:
        return self.world

    def __exit__(self, *exc: object) -> Literal[False]:
        return False


def worlds_for(contract: Contract, pool: World | None, world: World | None, world_sizes: Sequence[int] | None,
            backend: str, timeout_s: float) -> list[_Borrowed | _LazyPool]:
    if (given := pool if pool is not None else world) is not None:
        return [_Borrowed(given)]
    if not contract.needs_world:
        return [_Borrowed(LocalWorld())]
    from distcheck.runners.pool import RankPool, check_backend_available

    sizes = list(world_sizes or (2,))
    for ws in sizes:
        check_positive_int("world_size", ws)
        check_backend_available(backend, ws)  # refuse before anything starts
    return [_LazyPool(RankPool, ws, backend, timeout_s) for ws in sizes]


class _LazyPool:
    """A RankPool of ``ws`` ranks started on ``__enter__`` and closed on ``__exit__``."""

    def __init__(self, cls: type[RankPool], ws: int, backend: str, timeout_s: float):
        self.args = (cls, ws, backend, timeout_s)
        self.world_size = ws
        self.pool: RankPool | None = None

    def __enter__(self) -> RankPool:
        cls, ws, backend, timeout_s = self.args
        self.pool = cls(ws, backend=backend, timeout_s=timeout_s)
        return self.pool.__enter__()

    def __exit__(self, *exc: object) -> Literal[False]:
        if self.pool is not None:
            self.pool.close()
        return False

