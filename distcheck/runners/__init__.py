"""Real torch.distributed worlds for distcheck's properties (the only layer that uses torch).

Importing this package does not import torch; starting a world does.

    from distcheck.runners import RankPool
    with RankPool(world_size=4, backend="gloo", timeout_s=60) as pool:
        results = pool.run(fn, *args)     # fn(ctx, *args) on every rank -> [rank 0, rank 1, ...]

See docs/RUNNERS.md.
"""

from distcheck.runners.context import RankContext, check_same_shape
from distcheck.runners.fake import FakeWorld, run_fake
from distcheck.runners.pool import BACKENDS, RankPool, check_backend_available
from distcheck.runners.torchrun import TorchrunWorld

__all__ = ["RankPool", "RankContext", "BACKENDS", "check_backend_available", "check_same_shape",
           "FakeWorld", "run_fake", "TorchrunWorld"]
