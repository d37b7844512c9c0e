"""A sequence-parallel MLP block written with plain torch.distributed, as a user would write it
(Megatron-LM's layout: Korthikanti et al. 2022, §4.2.2, Figure 5), for the ``sequence-parallel-mlp``
contract.

Rank r holds its tokens ``x[:, rows_r]`` (batch first, (b, s, h)). The layer norm runs on them, an
all-gather along the sequence (Megatron's g) feeds the column-parallel ``up``, and the row-parallel
``down`` reduce-scatters its partial outputs back to the sequence shards (g-bar) before adding its bias
once and the residual. The layer norm's weight and bias and ``down``'s bias are replicated, and each
rank's gradients of them cover only its own tokens: they must be summed over the ranks (Megatron
all-reduces the gradients of parameters marked ``sequence_parallel``).

* :func:`sequence_parallel_mlp` does that sum (an all-reduce of each gradient as it is accumulated):
  ``distcheck certify`` certifies it.
* :func:`sequence_parallel_mlp_no_grad_sums` forgets it: outputs and input gradients are right, those
  three gradients are each rank's partial sums, and no all-reduce is issued. (A first version of
  :func:`sequence_parallel_mlp` summed only the layer norm's: the contract failed it on ``down.bias``.)

Both are factories ``make(ctx, case) -> module`` (the contract loads no weights into a user's module:
the factory takes rank r's shards from ``case.params``):

    distcheck certify examples.my_sp_layers:sequence_parallel_mlp --contract sequence-parallel-mlp
    distcheck certify examples.my_sp_layers:sequence_parallel_mlp_no_grad_sums --contract sequence-parallel-mlp
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class _GatherSequence(torch.autograd.Function):
    """All-gather along the sequence (dim 1) forward; reduce-scatter of the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        tp = dist.get_world_size()
        if tp == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(tp)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_sequence(grad)


class _ReduceScatterSequence(torch.autograd.Function):
    """Reduce-scatter along the sequence (dim 1) forward; all-gather of the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return _reduce_scatter_sequence(x)

    @staticmethod
    def backward(ctx, grad):
        return _GatherSequence.forward(None, grad)


def _reduce_scatter_sequence(x):
    tp = dist.get_world_size()
    if tp == 1:
        return x
    chunks = torch.stack(x.chunk(tp, dim=1)).contiguous()  # (tp, b, s / tp, h): rank r's block is chunk r
    out = torch.empty_like(chunks[0])
    # reduce_scatter_single in torch 2.13 (reduce_scatter_tensor is deprecated there), the old name before
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, chunks.flatten(0, 1))
    return out


class _RowParallelToSequence(nn.Module):
    """``down``: rank r's columns of the weight; partial outputs reduce-scattered to the sequence shards,
    then the (replicated) bias added once."""

    def __init__(self, in_local: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_local))
        self.bias = nn.Parameter(torch.empty(out_features))

    def forward(self, a):
        return _ReduceScatterSequence.apply(a @ self.weight.T) + self.bias


class SequenceParallelMLP(nn.Module):
    """``x + down(relu(up(norm(x))))`` on rank r's tokens (see the module doc)."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, tp: int, sum_grads: bool = True):
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size, eps=0.0)
        self.up = nn.Linear(hidden_size, ffn_hidden_size // tp)
        self.down = _RowParallelToSequence(ffn_hidden_size // tp, hidden_size)
        if sum_grads and tp > 1:  # the replicated parameters applied to each rank's tokens only
            for p in (self.norm.weight, self.norm.bias, self.down.bias):
                p.register_post_accumulate_grad_hook(lambda p: dist.all_reduce(p.grad))

    def forward(self, x):
        return x + self.down(torch.relu(self.up(_GatherSequence.apply(self.norm(x)))))


def _build(ctx, case, sum_grads: bool) -> SequenceParallelMLP:
    h, f, tp, r = case.dims["hidden_size"], case.dims["ffn_hidden_size"], case.tp, case.rank
    block = f // tp
    module = SequenceParallelMLP(h, f, tp, sum_grads).to(device=case.device, dtype=case.dtype)
    p = case.params
    with torch.no_grad():
        module.norm.weight.copy_(p["norm.weight"])
        module.norm.bias.copy_(p["norm.bias"])
        module.up.weight.copy_(p["up.weight"][r * block:(r + 1) * block])
        module.up.bias.copy_(p["up.bias"][r * block:(r + 1) * block])
        module.down.weight.copy_(p["down.weight"][:, r * block:(r + 1) * block])
        module.down.bias.copy_(p["down.bias"])
    return module


def sequence_parallel_mlp(ctx, case) -> SequenceParallelMLP:
    """The sequence-parallel block with the replicated parameters' gradients summed over the ranks."""
    return _build(ctx, case, sum_grads=True)


def sequence_parallel_mlp_no_grad_sums(ctx, case) -> SequenceParallelMLP:
    """The same block that leaves each rank's partial gradients of the layer norm and of down's bias (wrong)."""
    return _build(ctx, case, sum_grads=False)
