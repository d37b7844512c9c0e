"""Vocab-parallel layers written with plain torch.distributed, as a user would write them
(Megatron-LM's layout, Shoeybi et al. 2019, section 3; fairscale's conventions):

* :class:`VocabParallelEmbedding`: the table split by vocabulary rows (tp must divide
  ``num_embeddings``); each rank looks up the ids in its block, zeros the others, and the partial
  lookups are all-reduced.
* :func:`vocab_parallel_cross_entropy`: the loss per token of logits split by vocabulary columns;
  the max, the target logit and the sum of exponentials are all-reduced, the gradient is local.
  :class:`VocabParallelCrossEntropy` is the same as a module.
* :class:`ParallelLMHeadLoss`: the output layer (a column-parallel head whose logits stay split)
  and that loss.

    distcheck certify examples.my_vocab_layers:VocabParallelEmbedding --contract vocab-parallel-embedding
    distcheck certify examples.my_vocab_layers:vocab_parallel_cross_entropy --contract vocab-parallel-cross-entropy
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from examples.my_tp_layers import ColumnParallelLinear, _AllReduce, _local, _tp


def _block(vocab_size: int) -> tuple[int, int]:
    rank, _ = _tp()
    size = _local(vocab_size, "vocab_size")
    return rank * size, (rank + 1) * size


class VocabParallelEmbedding(nn.Module):
    """``weight[ids]`` with the rows of ``weight`` split over the ranks."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.lo, self.hi = _block(num_embeddings)
        self.weight = nn.Parameter(torch.empty(self.hi - self.lo, embedding_dim))
        nn.init.normal_(self.weight, std=0.02)

    def lookup(self, ids):
        outside = (ids < self.lo) | (ids >= self.hi)
        local = (ids - self.lo).masked_fill(outside, 0)
        return nn.functional.embedding(local, self.weight).masked_fill(outside[..., None], 0.0)

    def forward(self, ids):
        return _AllReduce.apply(self.lookup(ids))


def _all_reduce(x, op=dist.ReduceOp.SUM):
    if _tp()[1] > 1:
        dist.all_reduce(x, op=op)
    return x


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, local_max: bool = False, local_softmax: bool = False):
        lo = _tp()[0] * logits.shape[-1]
        m = logits.max(dim=-1).values
        if not local_max:
            m = _all_reduce(m, dist.ReduceOp.MAX)
        shifted = logits - m[..., None]
        outside = (target < lo) | (target >= lo + logits.shape[-1])
        local = (target - lo).masked_fill(outside, 0)
        picked = shifted.gather(-1, local[..., None])[..., 0].masked_fill(outside, 0.0)
        picked = _all_reduce(picked)
        exp = shifted.exp()
        total = exp.sum(dim=-1)
        if not local_softmax:
            total = _all_reduce(total)
        softmax = exp / total[..., None]
        ctx.save_for_backward(softmax, local, outside)
        return total.log() - picked

    @staticmethod
    def backward(ctx, grad):
        softmax, local, outside = ctx.saved_tensors
        onehot = torch.zeros_like(softmax).scatter_(-1, local[..., None], 1.0)
        onehot = onehot.masked_fill(outside[..., None], 0.0)
        return (softmax - onehot) * grad[..., None], None, None, None


def vocab_parallel_cross_entropy(logits_shard, target):
    """Per-token cross-entropy of ``logits_shard`` (..., vocab_size / tp: this rank's columns) and ``target`` (...)."""
    return _CrossEntropy.apply(logits_shard, target)


class VocabParallelCrossEntropy(nn.Module):
    """:func:`vocab_parallel_cross_entropy` as a module."""

    def forward(self, logits_shard, target):
        return vocab_parallel_cross_entropy(logits_shard, target)


class ParallelLMHeadLoss(nn.Module):
    """The output layer and its loss: a column-parallel head that keeps its logits split (its input gradient
    all-reduced in the backward, Megatron's f), then :func:`vocab_parallel_cross_entropy`."""

    def __init__(self, hidden_size: int, vocab_size: int):
        super().__init__()
        self.head = ColumnParallelLinear(hidden_size, vocab_size, bias=False, gather_output=False)

    def forward(self, x, target):
        return vocab_parallel_cross_entropy(self.head(x), target)


__all__ = ["VocabParallelEmbedding", "vocab_parallel_cross_entropy", "VocabParallelCrossEntropy", "ParallelLMHeadLoss"]
