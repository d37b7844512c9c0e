"""The threaded backend: every rank of a world is a thread of one forked host process.

torch ships an in-memory process group for its own tests
(``torch.testing._internal.distributed.multi_threaded_pg``): collectives are
real (they move and reduce the actual tensors) but go through shared memory
under a lock, about 20x faster than gloo on this machine, and a world of
hundreds of ranks costs only threads. Use it through the pool::

    with RankPool(world_size=64, backend="threaded") as pool:
        pool.run(fn, example)

or :func:`threaded_pool`. Differences from a process world, by design of the
torch backend:

* all ranks share one process, hence one global RNG: build inputs from explicit
  ``torch.Generator`` objects (:func:`rank_generator`) or from numpy seeds;
* no point-to-point ``send``/``recv``;
* autograd's multithreading is disabled in the host (torch requires it);
* when one rank raises while others are blocked in a collective, the backend
  stops the blocked ranks (they are reported as stopped) and the world is rebuilt.

The host lives in its own forked process, so a hung world can be killed and
the caller's process never has torch's threaded world installed in it; what it
runs is :func:`~distcheck.runners.threaded_host.threaded_host`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distcheck.core.validate import check_int
from distcheck.runners.pool import RankPool

if TYPE_CHECKING:
    import torch

    from distcheck.engine.world import RankContext

__all__ = ["rank_generator", "threaded_pool"]


def threaded_pool(world_size: int, timeout_s: float = 60.0) -> RankPool:
    """A :class:`~distcheck.runners.pool.RankPool` on the threaded backend (same argument checks)."""
    return RankPool(world_size, backend="threaded", timeout_s=timeout_s)


def rank_generator(ctx: RankContext, seed: int) -> torch.Generator:
    """A ``torch.Generator`` seeded from ``(seed, ctx.rank)``, independent of the global RNG.

    Under the threaded backend the global RNG is shared by all ranks, so
    ``torch.manual_seed`` on one rank changes the others' draws; draw from this
    generator instead. The seed is ``seed * 1_000_003 + rank`` (distinct per rank).
    ``seed`` is an int in ``[0, 2**32)``; anything else raises ConfigError.
    """
    import torch

    check_int("seed", seed, min_value=0, max_value=2**32 - 1)
    rank = check_int("ctx.rank", getattr(ctx, "rank", None), min_value=0)
    g = torch.Generator(device="cpu")
    g.manual_seed(int(seed) * 1_000_003 + rank)
    return g
