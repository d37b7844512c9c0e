"""Tensor-parallel linear layers written with plain torch.distributed, as a user would write them.

* :class:`ColumnParallelLinear` and :class:`RowParallelLinear` are correct (Megatron-LM's layout,
  Shoeybi et al. 2019, section 3): ``distcheck certify`` certifies them.
* :class:`RowParallelReduceToRank0` reduces the partial outputs to rank 0 instead of all-reducing
  them: rank 0 is right, every other rank keeps its own partial sum.
* :class:`RowParallelBiasEveryRank` adds the bias on every rank before the all-reduce, so the
  output carries tp copies of it.
* :class:`ParallelMLP` (Megatron's MLP) and :class:`ParallelAttention` (grouped-query attention split
  by heads) are built from the same pieces, with one all-reduce each way.

Conventions (fairscale's and Megatron's): ``weight`` in torch's layout (out_features,
in_features), split along dim 0 for the column layer and dim 1 for the row layer; tp must divide
the split width; ``gather_output`` and ``input_is_parallel`` as in those libraries.

    distcheck certify examples.my_tp_layers:RowParallelLinear --contract row-parallel-linear
    distcheck certify examples.my_tp_layers:RowParallelReduceToRank0 --contract row-parallel-linear
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def _tp() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


class _CopyToAll(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient backward (every rank used the whole input)."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        if _tp()[1] > 1:
            dist.all_reduce(grad)
        return grad


class _AllReduce(torch.autograd.Function):
    """All-reduce forward; identity backward (every rank receives the same output gradient)."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        if _tp()[1] > 1:
            dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class _GatherLast(torch.autograd.Function):
    """All-gather along the last dim forward; keep this rank's block of the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        rank, tp = _tp()
        ctx.rank, ctx.width = rank, x.shape[-1]
        if tp == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(tp)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad[..., ctx.rank * ctx.width:(ctx.rank + 1) * ctx.width].contiguous()


class _SplitLast(torch.autograd.Function):
    """Keep this rank's block of the last dim forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x, width):
        rank, _ = _tp()
        return x[..., rank * width:(rank + 1) * width].contiguous()

    @staticmethod
    def backward(ctx, grad):
        return _GatherLast.apply(grad), None


def _local(n: int, what: str) -> int:
    _, tp = _tp()
    if n % tp:
        raise ValueError(f"tp={tp} must divide {what}={n}")
    return n // tp


class ColumnParallelLinear(nn.Module):
    """``y = x W^T + b`` with W's output rows split over the ranks."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, gather_output: bool = True):
        super().__init__()
        self.gather_output = gather_output
        self.weight = nn.Parameter(torch.empty(_local(out_features, "out_features"), in_features))
        self.bias = nn.Parameter(torch.zeros(self.weight.shape[0])) if bias else None
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        y = nn.functional.linear(_CopyToAll.apply(x), self.weight, self.bias)
        return _GatherLast.apply(y) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """``y = x W^T + b`` with W's input columns split over the ranks; the bias is added once."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, input_is_parallel: bool = False):
        super().__init__()
        self.input_is_parallel = input_is_parallel
        self.weight = nn.Parameter(torch.empty(out_features, _local(in_features, "in_features")))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        nn.init.normal_(self.weight, std=0.02)

    def partial(self, x):
        if not self.input_is_parallel:
            x = _SplitLast.apply(x, self.weight.shape[1])
        return x @ self.weight.t()

    def forward(self, x):
        y = _AllReduce.apply(self.partial(x))
        return y if self.bias is None else y + self.bias


class _ReduceToRank0(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        if _tp()[1] > 1:
            dist.reduce(x, dst=0)  # BUG: only rank 0 gets the sum
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class RowParallelReduceToRank0(RowParallelLinear):
    """Broken: ``dist.reduce`` to rank 0 where an all-reduce belongs."""

    def forward(self, x):
        y = _ReduceToRank0.apply(self.partial(x))
        return y if self.bias is None else y + self.bias


class RowParallelBiasEveryRank(RowParallelLinear):
    """Broken: every rank adds the bias before the all-reduce, so the sum holds tp copies of it."""

    def forward(self, x):
        y = self.partial(x)
        if self.bias is not None:
            y = y + self.bias  # BUG: added tp times once summed
        return _AllReduce.apply(y)


class ParallelMLP(nn.Module):
    """``down(relu(up(x)))``: ``up`` column-parallel without gather, ``down`` row-parallel on the split input."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, bias: bool = True):
        super().__init__()
        self.up = ColumnParallelLinear(hidden_size, ffn_hidden_size, bias=bias, gather_output=False)
        self.down = RowParallelLinear(ffn_hidden_size, hidden_size, bias=bias, input_is_parallel=True)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class _Local(nn.Module):
    """This rank's rows of a linear projection (no communication of its own)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(_local(out_features, "out_features"), in_features))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        return x @ self.weight.t()


class ParallelAttention(nn.Module):
    """Causal grouped-query attention: each rank holds num_heads/tp query heads and num_kv_heads/tp kv heads
    (q/k/v rows split by whole heads), and the rows of o_proj's input that its heads produce."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, causal: bool = True):
        super().__init__()
        self.head_dim, self.causal = head_dim, causal
        self.q_proj = _Local(hidden_size, num_heads * head_dim)
        self.k_proj = _Local(hidden_size, num_kv_heads * head_dim)
        self.v_proj = _Local(hidden_size, num_kv_heads * head_dim)
        self.o_proj = RowParallelLinear(num_heads * head_dim, hidden_size, bias=False, input_is_parallel=True)

    def heads(self, x):
        b, s, _ = x.shape
        x = _CopyToAll.apply(x)  # one all-reduce of the input gradient for q, k and v together
        q, k, v = (p(x).view(b, s, -1, self.head_dim).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        return q, k, v

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.heads(x)
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # query head h reads h // group
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.o_proj(a.transpose(1, 2).reshape(b, s, -1))
