"""What a rank function sees (:class:`RankContext`) and what a check driver sees (:class:`World`).

Their one path is this module. They live in the
engine layer so that the parallelism packages' real-backend checks, which receive a world and
never start one, can name them; the worlds themselves are :mod:`distcheck.runners`.

A rank function has the signature ``fn(ctx, *args)`` and runs unchanged on every
runner (a gloo :class:`~distcheck.runners.pool.RankPool`, the threaded backend,
NCCL, the fake backend or a torchrun launch). ``ctx`` tells it who it is.

A check driver (a parallelism package's ``world_rows``, the certify engine) receives a
*world*: any object with the :class:`World` contract, such as a :class:`~distcheck.runners.pool.RankPool` or a
:class:`~distcheck.runners.torchrun_world.TorchrunWorld`.

This module does not import torch at import time; :attr:`RankContext.group`
imports ``torch.distributed`` when first read (inside a rank, torch is loaded).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from distcheck.core.errors import DistributedError
from distcheck.core.validate import check_type

if TYPE_CHECKING:
    import torch

__all__ = ["LaunchedWorld", "RankContext", "World", "check_same_shape"]


@dataclass
class RankContext:
    """The identity of one rank of a world.

    Attributes:
        rank: this rank, ``0 <= rank < world_size``.
        world_size: ranks in the world.
        backend: ``"gloo"``, ``"nccl"``, ``"threaded"``, ``"fake"`` or the
            backend a torchrun launch initialised.
        device: the ``torch.device`` tensors of this rank live on
            (``cpu``, or ``cuda:<local_rank>`` for NCCL).
        local_rank: rank within the node (equal to ``rank`` for a single-node pool).
        scratch: a dict that persists on this rank across ``run`` calls of the same
            world (cache models or buffers here; it is lost when the world restarts).
    """

    rank: int
    world_size: int
    backend: str
    device: Any
    local_rank: int = 0
    scratch: dict = field(default_factory=dict, repr=False)

    @property
    def group(self) -> Any:
        """The default (world) process group, ``torch.distributed.group.WORLD``."""
        import torch.distributed as dist

        return dist.group.WORLD

    @property
    def is_main(self) -> bool:
        """True on rank 0."""
        return self.rank == 0


class World(Protocol):
    """A world a check driver runs rank functions on: a :class:`~distcheck.runners.pool.RankPool`,
    a :class:`~distcheck.runners.torchrun_world.TorchrunWorld`, or any object like them.

    ``run(fn, *args)`` calls ``fn(ctx, *args)`` on every rank and returns
    ``[rank 0's result, rank 1's, ...]``; ``run_on(fn, args_per_rank)`` gives each rank
    its own arguments.
    """

    @property
    def world_size(self) -> int: ...

    @property
    def backend(self) -> str: ...

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> list[Any]: ...

    def run_on(self, fn: Callable[..., Any], args_per_rank: Sequence[Sequence[Any]],
               timeout_s: float | None = None) -> list[Any]: ...


class LaunchedWorld(World, Protocol):
    """A world this process is one rank of: :class:`~distcheck.runners.torchrun_world.TorchrunWorld`.

    ``start()`` joins it, ``close()`` leaves it, and ``rank0_broadcaster(timeout_s)`` (a
    collective) returns ``share(obj)``, which gives every rank rank 0's ``obj``.
    """

    @property
    def rank(self) -> int: ...

    def start(self) -> Any: ...

    def close(self) -> None: ...

    def rank0_broadcaster(self, timeout_s: float = ...) -> Callable[[Any], Any]: ...


def check_same_shape(ctx: RankContext, tensor: torch.Tensor, what: str = "tensor") -> None:
    """Raise unless ``tensor`` has the same shape and dtype on every rank.

    Collectives whose inputs differ in size between ranks can "succeed" on some
    ranks with garbage (gloo copies what fits), so a property that feeds a
    collective with computed shapes should call this first. It costs one
    ``all_gather_object`` (a collective: call it on every rank).

    Raises:
        DistributedError: naming every rank's shape, when they differ.
    """
    import torch.distributed as dist

    check_type("what", what, str, "must be a string naming the tensor")
    mine = (tuple(tensor.shape), str(tensor.dtype))
    seen: list = [None] * ctx.world_size
    dist.all_gather_object(seen, mine, group=ctx.group)
    if any(s != mine for s in seen):
        listing = ", ".join(f"rank {r}: {s[0]} {s[1]}" for r, s in enumerate(seen))
        raise DistributedError(f"{what} differs between ranks ({listing})")
