"""Sharded optimizers that get ZeRO wrong, for the sharded optimizer step contract.

* :class:`ZeroWithoutAllGather`: torch's ``ZeroRedundancyOptimizer`` that steps the parameters
  it owns and never sends them back (no broadcast / all-gather of the updated shards): every
  other rank keeps stale copies, so ``params`` fails, naming those ranks::

      distcheck certify examples.zero_mutants:ZeroWithoutAllGather --contract sharded-optimizer-step

* :class:`StateOnEveryRank`: a wrapper with ZeroRedundancyOptimizer's constructor that steps
  every parameter on every rank: the numbers are right, but each rank keeps the whole
  optimizer state (ZeRO-0), so ``bytes_per_rank`` fails.
"""

from __future__ import annotations

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer


class ZeroWithoutAllGather(ZeroRedundancyOptimizer):
    """ZeRO-1 whose step forgets to send the updated parameters back to the other ranks."""

    def _sync_params(self):
        pass


class StateOnEveryRank(torch.optim.Optimizer):
    """``cls(params, optimizer_class=..., **hyperparameters)`` that shards nothing."""

    def __init__(self, params, optimizer_class, **hyperparameters):
        self.optim = optimizer_class(list(params), **hyperparameters)
        self.defaults, self.param_groups, self.state = self.optim.defaults, self.optim.param_groups, self.optim.state

    def step(self, closure=None):
        return self.optim.step(closure)

    def zero_grad(self, set_to_none: bool = True):
        self.optim.zero_grad(set_to_none)
