"""Real torch.distributed worlds for distcheck's properties (the only layer that uses torch).

Importing this package does not import torch; starting a world does.

    from distcheck.runners import RankPool
    with RankPool(world_size=4, backend="gloo", timeout_s=60) as pool:
        results = pool.run(fn, *args)     # fn(ctx, *args) on every rank -> [rank 0, rank 1, ...]

See docs/RUNNERS.md.
"""

from distcheck.runners.backends import BACKENDS, check_backend_available
from distcheck.runners.context import RankContext, World, check_same_shape
from distcheck.runners.fake import FakeWorld, run_fake
from distcheck.runners.pool import RankPool
from distcheck.runners.torchrun_world import TorchrunWorld

__all__ = ["BACKENDS", "FakeWorld", "RankContext", "RankPool", "TorchrunWorld", "World", "check_backend_available",
           "check_same_shape", "run_fake"]
