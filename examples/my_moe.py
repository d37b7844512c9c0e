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

``make_dropless`` is the dropless layer (no capacity) as torchtitan's and Megatron-core's all-to-all dispatchers
build it: the per-expert counts are exchanged first (an ``all_to_all_single`` of E int64 counts), the routed rows
sorted by expert go out with ``all_to_all_single(out, rows, output_split_sizes, input_split_sizes)``, each local
expert runs on its rows (every expert runs, on zero rows too, so that a rank whose experts got nothing still
takes part in the backward's all-to-alls), and a second all-to-all with the split sizes swapped brings the
outputs back::

    distcheck certify examples.my_moe:make_dropless --contract moe-layer --option dropless=true \\
        --world-sizes 2,4               # certified, zero-length splits and experts with no tokens included
    distcheck certify examples.my_moe:make_dropless_skip_empty --contract moe-layer --option dropless=true \\
        --world-sizes 2                 # fails: local experts numbered over the non-empty ones only
    distcheck certify examples.my_moe:make_dropless_padded --contract moe-layer --option dropless=true \\
        --world-sizes 2                 # fails the all-to-all rows only: padded to n rows per expert
    distcheck certify examples.my_moe:make_dropless_no_graph --contract moe-layer --option dropless=true \\
        --world-sizes 2 --timeout 10    # hangs: FAIL at the timeout, a rank stuck in the backward's all-to-all
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
    def __init__(self, spec: Any, global_capacity: bool = False, renormalise: bool = False) -> None:
        super().__init__()
        self.wg = torch.nn.Parameter(spec.wg.clone())
        self.w1 = torch.nn.Parameter(spec.w1.clone())
        self.w2 = torch.nn.Parameter(spec.w2.clone())
        self.spec, self.global_capacity, self.renormalise = spec, global_capacity, renormalise

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
        if self.renormalise and weights:                          # GShard's top2gating: gates / their kept sum
            kept = torch.zeros_like(gates).index_put(
                (torch.tensor([w[0] for w in where]), torch.tensor([self._choice(idx, w) for w in where])),
                torch.ones(len(where), dtype=gates.dtype))
            total = (gates * kept).sum(1)
            weights = [w / total[t] for w, (t, _, _) in zip(weights, where, strict=True)]
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

    @staticmethod
    def _choice(idx: torch.Tensor, where: tuple[int, int, int]) -> int:
        """Which of token ``where[0]``'s choices chose expert ``where[1]``."""
        return int((idx[where[0]] == where[1]).nonzero()[0, 0])

    def grads(self) -> dict[str, torch.Tensor | None]:
        g = None if self.wg.grad is None else self.wg.grad.clone()
        if g is not None:
            dist.all_reduce(g)                                   # the router is replicated: DDP's sum
        return {"wg": g, "w1": self.w1.grad, "w2": self.w2.grad}


class _AllToAllV(torch.autograd.Function):
    """``all_to_all_single`` with split sizes; the backward sends the gradient back with the sizes swapped."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> torch.Tensor:
        ctx.splits = (out_splits, in_splits)
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=out_splits, input_split_sizes=in_splits)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        out_splits, in_splits = ctx.splits
        out = g.new_empty((sum(in_splits), *g.shape[1:]))
        dist.all_to_all_single(out, g.contiguous(), output_split_sizes=in_splits, input_split_sizes=out_splits)
        return out, None, None


class DroplessMoE(MoE):
    """No capacity: every choice goes to its expert (module doc). ``bug``: ``"skip_empty"`` numbers the local
    experts over those that received rows only (a rank whose first expert got nothing runs the next one's rows
    through it); ``"padded"`` sends (E, n, h) buffers, every expert padded to the n rows it could get;
    ``"no_graph"`` skips the experts that received no rows, right otherwise, but a rank whose experts all got
    nothing builds its combine's input outside the autograd graph: its backward issues no all-to-all and the
    other ranks wait (a hang, not gloo's: gloo moves zero-length splits)."""

    def __init__(self, spec: Any, bug: str = "") -> None:
        super().__init__(spec)
        self.bug = bug

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.spec
        n, h = x.shape
        E, k, ep = s.num_experts, s.k, s.ep
        m = E // ep
        logits = x @ self.wg
        probs = logits.softmax(-1)
        top, idx = logits.topk(k, dim=-1)
        gates = top.softmax(-1) if s.router == "topk_then_softmax" else probs.gather(1, idx)
        if self.bug == "padded":
            y = self._padded(x, idx, gates)
        else:
            flat = idx.reshape(-1)                                   # choice t k + j
            order = torch.argsort(flat, stable=True)                 # the choices sorted by expert
            counts = torch.bincount(flat, minlength=E)               # int64 (E,)
            got_counts = torch.empty_like(counts)
            dist.all_to_all_single(got_counts, counts)               # rank j's counts of my experts, (ep, m)
            send = counts.view(ep, m).sum(1).tolist()
            recv = got_counts.view(ep, m).sum(1).tolist()
            rows = _AllToAllV.apply(x[order // k], recv, send)       # by source rank, then local expert
            expert_of = torch.arange(ep * m).remainder(m).repeat_interleave(got_counts)
            # the skip_empty twin keeps its rows in the graph (rows * 0): a rank whose experts all got nothing
            # would otherwise build its combine's input outside autograd and issue no backward all-to-all, the
            # no_graph twin's hang
            outs = rows * 0 if self.bug == "skip_empty" else torch.zeros_like(rows)
            ran = 0
            for i in range(m):
                at = (expert_of == i).nonzero().reshape(-1)
                if self.bug in ("skip_empty", "no_graph") and at.numel() == 0:
                    continue
                w = ran if self.bug == "skip_empty" else i
                outs = outs.index_put((at,), torch.relu(rows[at] @ self.w1[w]) @ self.w2[w])
                ran += 1
            back = _AllToAllV.apply(outs, send, recv)                # in `order` again
            weighted = back * gates.reshape(-1)[order].unsqueeze(1)
            y = x + torch.zeros_like(x).index_add(0, order // k, weighted)
        with torch.no_grad():
            sums = torch.stack([torch.bincount(idx.reshape(-1), minlength=E).to(x.dtype), probs.sum(0)])
            dist.all_reduce(sums)
            aux = E * torch.sum(sums[0] / (ep * n * k) * sums[1] / (ep * n))
        return y, aux

    def _padded(self, x: torch.Tensor, idx: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        """Every choice kept in an (E, n, h) buffer: right values, every split padded to n rows per expert."""
        s = self.spec
        n, h = x.shape
        E, k, ep = s.num_experts, s.k, s.ep
        slot = torch.zeros_like(idx)
        for t in range(n):                                           # a token's k experts are distinct
            for j in range(k):
                slot[t, j] = int((idx[:t] == idx[t, j]).sum())
        buf = x.new_zeros(E * n, h).index_add(0, (idx * n + slot).reshape(-1), x.repeat_interleave(k, dim=0))
        got = _AllToAll.apply(buf.reshape(E, n, h)).reshape(ep, E // ep, n, h)
        outs = [(torch.relu(got[:, i].reshape(-1, h) @ self.w1[i]) @ self.w2[i]).reshape(ep, n, h)
                for i in range(E // ep)]
        back = _AllToAll.apply(torch.stack(outs, 1).reshape(E, n, h)).reshape(E * n, h)
        y = x
        for j in range(k):
            y = y + gates[:, j:j + 1] * back[idx[:, j] * n + slot[:, j]]
        return y


def make(ctx: Any, spec: Any) -> MoE:
    """The layer (module doc): certified."""
    return MoE(spec)


def make_renormalised(ctx: Any, spec: Any) -> MoE:
    """GShard's top-2 gating (Lepikhin et al. 2020, Algorithm 1; Mixtral; fairscale's and DeepSpeed's
    ``top2gating``): the kept choices' gates divided by their sum. It fails ``forward`` under the default
    ``renormalise=false``, and the failure names the option that certifies it::

        distcheck certify examples.my_moe:make_renormalised --contract moe-layer --option k=2   # fails, and says
        distcheck certify examples.my_moe:make_renormalised --contract moe-layer --option k=2 \\
            --option renormalise=true                                                   # certified
    """
    return MoE(spec, renormalise=True)


def make_global_capacity(ctx: Any, spec: Any) -> MoE:
    """The known-wrong twin: capacity computed over the global batch (ep T/ep tokens) instead of per rank."""
    return MoE(spec, global_capacity=True)


def make_dropless(ctx: Any, spec: Any) -> DroplessMoE:
    """The dropless layer (module doc): certified with ``--option dropless=true``."""
    return DroplessMoE(spec)


def make_dropless_skip_empty(ctx: Any, spec: Any) -> DroplessMoE:
    """The known-wrong dropless twin: a local expert that received no rows is skipped and the next one's rows run
    through its weights (the experts numbered over the non-empty ones)."""
    return DroplessMoE(spec, bug="skip_empty")


def make_dropless_no_graph(ctx: Any, spec: Any) -> DroplessMoE:
    """Hangs where a rank's experts receive no rows: its backward skips the combine's all-to-all (class doc)."""
    return DroplessMoE(spec, bug="no_graph")


def make_dropless_padded(ctx: Any, spec: Any) -> DroplessMoE:
    """Right values, wrong bytes: every expert's split padded to the n rows it could receive."""
    return DroplessMoE(spec, bug="padded")
