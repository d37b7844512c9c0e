"""A mixture-of-experts layer in plain torch.distributed, GShard's einsum form (Lepikhin et al. 2020, "GShard",
§2.2 and Algorithm 1), for the ``moe-layer`` contract.

Each rank holds its tokens, the replicated router and E/ep experts (the contract's ``make(ctx, spec)``
protocol). The router's top-k choices fill each expert's C = ceil(k n capacity_factor / E) slots choice by
choice, then in token order; the one-hot dispatch tensor (n, E, C) scatters the tokens into the (E, C, h)
buffer (``einsum("tec,th->ech")``), ``all_to_all_single`` sends expert block j to rank j, the experts run on
their slots, a second ``all_to_all_single`` brings the outputs back, and the combine tensor (the dispatch
tensor weighted by the gates) adds them to the residual. The aux loss, E sum_e f_e P_e, is all-reduced over
the ranks.

::

    distcheck certify examples.my_moe:make --contract moe-layer --backend gloo --world-sizes 2,4   # certified
    distcheck certify examples.my_moe:make_global_capacity --contract moe-layer --backend gloo \\
        --world-sizes 2                 # fails: capacity from the whole batch's T instead of this rank's T/ep
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import torch
import torch.distributed as dist


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()                      # empty_like keeps a strided tensor's strides
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        g = g.contiguous()
        out = torch.empty_like(g)
        dist.all_to_all_single(out, g)
        return out


class MoE(torch.nn.Module):
    def __init__(self, spec: Any, global_capacity: bool = False) -> None:
        super().__init__()
        self.wg = torch.nn.Parameter(spec.wg.clone())
        self.w1 = torch.nn.Parameter(spec.w1.clone())
        self.w2 = torch.nn.Parameter(spec.w2.clone())
        self.spec, self.global_capacity = spec, global_capacity

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.spec
        n, h = x.shape
        E, k, ep = s.num_experts, s.k, s.ep
        logits = x @ self.wg
        probs = logits.softmax(-1)
        top, idx = logits.topk(k, dim=-1)
        gates = top.softmax(-1) if s.router == "topk_then_softmax" else probs.gather(1, idx)
        tokens = n * ep if self.global_capacity else n          # the twin sizes capacity from the whole batch
        C = math.ceil(Fraction(k * tokens) * Fraction(s.capacity_factor) / E)
        where: list[tuple[int, int, int]] = []                  # (token, expert, slot) of each kept choice
        weights = []
        used = [0] * E
        for j in range(k):                                       # choice by choice, then token order
            for t in range(n):
                e = int(idx[t, j])
                if used[e] < C:
                    where.append((t, e, used[e]))
                    weights.append(gates[t, j])
                    used[e] += 1
        at = tuple(torch.tensor([w[i] for w in where], dtype=torch.long) for i in range(3))
        dispatch = x.new_zeros(n, E, C).index_put(at, x.new_ones(len(where)))
        combine = x.new_zeros(n, E, C).index_put(at, torch.stack(weights) if weights else x.new_zeros(0))
        buf = torch.einsum("tec,th->ech", dispatch, x)
        got = _AllToAll.apply(buf).reshape(ep, E // ep, C, h)
        outs = [(torch.relu(got[:, i].reshape(-1, h) @ self.w1[i]) @ self.w2[i]).reshape(ep, C, h)
                for i in range(E // ep)]
        back = _AllToAll.apply(torch.stack(outs, 1).reshape(E, C, h))
        y = x + torch.einsum("tec,ech->th", combine, back)
        with torch.no_grad():
            sums = torch.stack([torch.bincount(idx.reshape(-1), minlength=E).to(x.dtype), probs.sum(0)])
            dist.all_reduce(sums)
            aux = E * torch.sum(sums[0] / (ep * n * k) * sums[1] / (ep * n))
        return y, aux

    def grads(self) -> dict[str, torch.Tensor | None]:
        g = None if self.wg.grad is None else self.wg.grad.clone()
        if g is not None:
            dist.all_reduce(g)                                   # the router is replicated: DDP's sum
        return {"wg": g, "w1": self.w1.grad, "w2": self.w2.grad}


def make(ctx: Any, spec: Any) -> MoE:
    """The layer (module doc): certified."""
    return MoE(spec)


def make_global_capacity(ctx: Any, spec: Any) -> MoE:
    """The known-wrong twin: capacity computed over the global batch (ep T/ep tokens) instead of per rank."""
    return MoE(spec, global_capacity=True)
