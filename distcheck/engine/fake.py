"""The fake backend: run a rank function as one rank of a world of any size, in this process.

torch's fake process group (``torch.testing._internal.distributed.fake_pg``)
accepts every collective and computes nothing: tensors are left as they are.
What it is good for is *layout*: building a ``DeviceMesh`` of 16,384 ranks takes
milliseconds, and a rank function can read which ranks share its groups, what
shard of a tensor it owns, and how many collectives of each kind it issues
(for example under ``torch.distributed.tensor.debug.CommDebugMode``). Never
compare the numbers a collective returns under this backend.

    from distcheck.engine.fake import run_fake
    coords = run_fake(mesh_coordinates, world_size=16_384, rank=9_000)

The process group is created in the calling process and destroyed afterwards;
a process that already has a default process group is refused.

Its one path is this module. It lives in the engine
layer because it starts nothing: a parallelism package's world-free checks use it directly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from distcheck.core.errors import ConfigError, DistributedError
from distcheck.core.validate import MAX_RANKS, check_callable, check_int, check_type
from distcheck.engine.world import RankContext

__all__ = ["run_fake", "FakeWorld"]

_lock = threading.Lock()


def run_fake(fn: Callable[..., Any], *args: Any, world_size: int, rank: int = 0) -> Any:
    """Call ``fn(ctx, *args)`` as ``rank`` of a fake world of ``world_size`` ranks; return its result.

    Arguments:
        fn: a rank function ``fn(ctx, *args)`` (need not be picklable: it runs here).
        world_size: ranks in the fake world, ``1 <= world_size <= MAX_RANKS``
            (2**24; nothing is started, but torch's fake group and a ``DeviceMesh``
            still allocate per rank: 2**31 ranks exhaust the memory of a large host).
        rank: the rank to impersonate, ``0 <= rank < world_size``.

    Raises:
        ConfigError: ``fn`` not callable, bad ``world_size`` or ``rank``.
        DistributedError: this process already has a default process group.
        Whatever ``fn`` raises, unchanged.
    """
    check_callable("fn", fn)
    world_size = _check_world_size(world_size)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ConfigError("rank", rank, f"must be an integer in [0, world_size={world_size})")
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    with _lock:
        if dist.is_initialized():
            raise DistributedError("this process already has a default process group; run_fake needs none")
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
        try:
            ctx = RankContext(rank=rank, world_size=world_size, backend="fake",
                              device=torch.device("cpu"), local_rank=rank)
            return fn(ctx, *args)
        finally:
            dist.destroy_process_group()


def _check_world_size(world_size: object) -> int:
    return check_int("world_size", world_size, min_value=1, max_value=MAX_RANKS)


class FakeWorld:
    """A fake world of ``world_size`` ranks whose :meth:`run` impersonates chosen ranks in turn.

    ``FakeWorld(16_384).run(fn, x, ranks=[0, 8_191])`` returns
    ``[fn(ctx_of_rank_0, x), fn(ctx_of_rank_8191, x)]``; ``ranks=None`` means every
    rank (only sensible for small worlds). Same contract as :func:`run_fake`;
    ``ranks`` is a list, tuple or range of ints in ``[0, world_size)``, checked
    before any rank runs (``ConfigError`` naming ``ranks[i]``).
    """

    backend = "fake"

    def __init__(self, world_size: int):
        self.world_size = _check_world_size(world_size)

    def run(self, fn: Callable, *args: Any, ranks: Sequence[int] | None = None) -> list:
        check_callable("fn", fn)
        if ranks is None:
            chosen: Sequence[int] = range(self.world_size)
        else:
            seq = check_type("ranks", ranks, (list, tuple, range), "must be a list of ranks (or None for every rank)")
            chosen = [check_int(f"ranks[{i}]", r, min_value=0, max_value=self.world_size - 1)
                      for i, r in enumerate(seq)]
        return [run_fake(fn, *args, world_size=self.world_size, rank=r) for r in chosen]
