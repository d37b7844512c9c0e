"""Data-parallel gradient reducers written as a user would, for the data-parallel reducer contract.

* :func:`weighted_bucketed_allreduce`: your own reducer, called after the backward of the
  un-wrapped model, ``reduce(module, n_local)``. It all-reduces every gradient in one flat
  bucket together with the rank's example count and divides by the total: the full-batch
  gradient on any shards. Certified::

      distcheck certify examples.dp_reducers:weighted_bucketed_allreduce --contract data-parallel-reducer

* :func:`plain_mean_hook` (the catalogue's ``dp.plain_mean_unequal``, as a DDP comm hook): sums
  the ranks' gradients and divides by the world size, as DDP does by default. It is the
  full-batch gradient only on equal shards, so it fails the contract on unequal ones with a
  shrunk counterexample naming the ranks::

      distcheck certify examples.dp_reducers:plain_mean_hook --contract data-parallel-reducer --option shards=unequal
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def weighted_bucketed_allreduce(module: torch.nn.Module, n_local: int) -> None:
    """All-reduce ``[n_k g_k for every parameter, n_k]`` as one bucket; every ``.grad`` becomes
    ``sum_k n_k g_k / sum_k n_k``."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) * n_local for g in grads] + [grads[0].new_tensor([float(n_local)])])
    dist.all_reduce(flat)
    total, offset = flat[-1], 0
    for g in grads:
        g.copy_((flat[offset:offset + g.numel()] / total).reshape(g.shape))
        offset += g.numel()


def plain_mean_hook(state, bucket):
    """A DDP comm hook that averages unweighted: ``(1/N) sum_k g_k`` (wrong on unequal shards)."""
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0] / dist.get_world_size())
