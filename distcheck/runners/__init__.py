"""Real torch.distributed worlds for distcheck's properties (the only layer that uses torch).

Importing this package does not import torch; starting a world does.

    from distcheck.runners import RankPool
    with RankPool(world_size=4, backend="gloo", timeout_s=60) as pool:
        results = pool.run(fn, *args)     # fn(ctx, *args) on every rank -> [rank 0, rank 1, ...]

What a rank function receives (:class:`~distcheck.engine.world.RankContext`), the world a check
driver receives (:class:`~distcheck.engine.world.World`) and the fake backend
(:func:`~distcheck.engine.fake.run_fake`) start nothing and live in the engine, their one path.
See docs/RUNNERS.md.
"""

from distcheck.runners.backends import BACKENDS, check_backend_available
from distcheck.runners.pool import RankPool
from distcheck.runners.torchrun_world import TorchrunWorld

__all__ = ["BACKENDS", "RankPool", "TorchrunWorld", "check_backend_available"]
