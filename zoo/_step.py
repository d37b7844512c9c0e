"""Shared pieces of the ``training-step`` entries: torch's own composition (``examples/my_step.py``: tp with
torchtitan's Llama plan, FSDP2 over ``(dp_replicate, dp_shard)``), which every fixed twin uses with the
contract's default hooks, and the clipping arithmetic the buggy hooks share."""

from __future__ import annotations

from distcheck.parallel.step.hooks import StepTarget
from examples.my_step import parallelize

__all__ = ["FIXED", "clip_with", "local_squares", "parallelize"]

#: the fixed twin of every training-step entry: torch's composition with the contract's default hooks
#: (torch's clip_grad_norm_ on DTensor gradients; under pp, torchtitan's norm summed over the pp group)
FIXED = StepTarget(parallelize)


def local_squares(parameters):
    """The gradients and the sum of squares of each rank's local shards (float64)."""
    import torch

    grads = [p.grad for p in parameters if p.grad is not None]
    local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
    return grads, sum((torch.sum(g.double() * g.double()) for g in local), torch.zeros((), dtype=torch.float64))


def clip_with(grads, total, max_norm):
    """Multiply every gradient by min(1, max_norm / (total + 1e-6)); return ``total``."""
    coef = min(1.0, max_norm / (float(total) + 1e-6))
    for g in grads:
        g.mul_(coef)
    return total
