"""The mutant catalogue's tensor-parallel mistakes (``distcheck.mutants``), written as torch layers.

Each must fail its contract with a shrunk counterexample:

* :class:`RowParallelEvenSplitOnly` (``tp.row.even_split_only``): every rank takes
  ``in_features // tp`` input columns, so the last ``in_features % tp`` are dropped. Certify it
  with ``--option divisible=false`` (it is right when tp divides the width).
* :func:`row_then_column_mlp` (``tp.mlp.row_then_column``): a factory building an MLP whose
  ``up`` is split by input rows and ``down`` by output columns, with no all-reduce in between:
  each rank applies the ReLU to its partial sum.
* :class:`AttentionWrongKVHead`: grouped-query attention whose query head h reads kv head
  ``h % num_kv_heads`` (``repeat``) instead of ``h // group`` (``repeat_interleave``).
* ``RowParallelBiasEveryRank`` (``tp.row.bias_every_rank``) is in ``examples/my_tp_layers.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from examples.my_tp_layers import ParallelAttention, RowParallelLinear, _AllReduce, _tp


class RowParallelEvenSplitOnly(RowParallelLinear):
    """Row-parallel linear that takes ``in_features // tp`` columns per rank, whatever the remainder."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, input_is_parallel: bool = False):
        nn.Module.__init__(self)
        _, tp = _tp()
        self.input_is_parallel = input_is_parallel
        self.weight = nn.Parameter(torch.zeros(out_features, in_features // tp))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None


class _RowThenColumnMLP(nn.Module):
    def __init__(self, up_rows, up_bias, down_cols, down_bias, cols):
        super().__init__()
        self.up, self.down = nn.Module(), nn.Module()
        self.up.weight = nn.Parameter(up_rows)      # (ffn, this rank's input columns): split the wrong way
        self.down.weight = nn.Parameter(down_cols)  # (this rank's output rows, ffn)
        self.up.bias = None if up_bias is None else nn.Parameter(up_bias)
        self.down.bias = None if down_bias is None else nn.Parameter(down_bias)
        self.cols = cols

    def forward(self, x):
        lo, hi = self.cols
        h = x[..., lo:hi] @ self.up.weight.t()
        if self.up.bias is not None:
            h = h + self.up.bias
        h = torch.relu(h)  # BUG: ReLU of a partial sum, no all-reduce first
        y = x.new_zeros(*x.shape[:-1], x.shape[-1])
        y[..., lo:hi] = h @ self.down.weight.t()
        y = _AllReduce.apply(y)  # concatenates the ranks' output columns (zero elsewhere)
        return y if self.down.bias is None else y + self.down.bias


def row_then_column_mlp(ctx, case):
    """Factory: the catalogue's row-then-column MLP, loaded with the case's weights (numpy.array_split
    blocks of the hidden size, as the catalogue's mutant takes them)."""
    rank, tp = _tp()
    d = case.dims["hidden_size"]
    lo, hi = rank * (d // tp) + min(rank, d % tp), (rank + 1) * (d // tp) + min(rank + 1, d % tp)
    p = case.params
    up_bias, down_bias = p.get("up.bias"), p.get("down.bias")
    return _RowThenColumnMLP(p["up.weight"][:, lo:hi].clone(), None if up_bias is None else up_bias.clone(),
                             p["down.weight"][lo:hi, :].clone(), None if down_bias is None else down_bias.clone(),
                             (lo, hi))


class AttentionWrongKVHead(ParallelAttention):
    """Query head h reads kv head h % num_kv_heads (``repeat``): wrong whenever a rank holds two kv heads or more."""

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.heads(x)
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)  # BUG: should be repeat_interleave
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.o_proj(a.transpose(1, 2).reshape(b, s, -1))


__all__ = ["RowParallelEvenSplitOnly", "row_then_column_mlp", "AttentionWrongKVHead"]
