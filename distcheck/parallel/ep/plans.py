"""A target of the ``moe-layer`` contract in plain torch.distributed: the GShard layer with padded buffers.

``ALL_TO_ALL_MOE`` is a factory ``make(ctx, spec) -> layer`` (the contract's protocol,
:mod:`distcheck.parallel.ep.contracts`): rank r holds its tokens (T/ep, h), the replicated router ``wg``
(h, E) and its experts ``r E/ep .. (r+1) E/ep - 1``. ``layer(x)``:

1. routes: logits ``x @ wg``, ``torch.topk`` (the contract's cases have no ties), the gates under
   ``spec.router`` (:class:`distcheck.core.vocab.Router`);
2. gives every expert ``C = ceil(k (T/ep) capacity_factor / E)`` slots on this rank
   (:func:`distcheck.parallel.ep.reference.expert_capacity`, GShard §2.2), filled choice by choice, then in token
   order (GShard, Algorithm 1); a choice over capacity is dropped;
3. dispatches the (E, C, h) buffer with ``all_to_all_single`` (block j, the experts of rank j, to rank j),
   runs each local expert on its (ep C, h) received slots, and returns the outputs with a second
   ``all_to_all_single`` (an ``autograd.Function``: the backward is the same all-to-all of the gradient);
4. combines ``x + sum_kept g_j out_j`` in choice order; returns it with the aux loss ``E sum_e f_e P_e``
   over the whole batch (the counts and probability sums all-reduced, 2 E numbers; no gradient).

``layer.grads()`` all-reduces the router's gradient (the data-parallel sum DDP would make) and returns it with
this rank's experts' gradients. It is ``distcheck check``'s ep row (:mod:`distcheck.parallel.ep.checks`); the
MoE of ``examples/my_moe.py`` is certified by ``distcheck certify`` (``tests/test_ep_contract.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["all_to_all_moe", "ALL_TO_ALL_MOE", "all_to_all_function", "fairscale_moe", "FAIRSCALE_MOE",
           "FAIRSCALE_OPTIONS", "layer_grads"]

#: the moe-layer options that name fairscale 0.4's conventions (``fairscale/nn/moe/top2gate.py``, ``moe_layer.py``)
FAIRSCALE_OPTIONS = {"k": 2, "residual": False, "renormalise": True, "aux_scope": "per_rank",
                     "aux_counts": "first_choice", "aux_scale": "1/E", "router_grad": "local", "capacity_factor": "1",
                     "tokens_multiple_of_experts": True}

_FUNCTIONS: list[Any] = []


def all_to_all_function() -> Any:
    """The differentiable ``all_to_all_single`` of equal chunks of dim 0 (built on first use: torch)."""
    if _FUNCTIONS:
        return _FUNCTIONS[0]
    import torch
    import torch.distributed as dist

    class AllToAll(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            x = x.contiguous()                  # empty_like keeps a strided tensor's strides
            out = torch.empty_like(x)
            dist.all_to_all_single(out, x)
            return out

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            g = g.contiguous()
            out = torch.empty_like(g)
            dist.all_to_all_single(out, g)
            return out

    _FUNCTIONS.append(AllToAll)
    return AllToAll


def _layer_class() -> Any:
    import torch
    import torch.distributed as dist

    from distcheck.core.vocab import Router
    from distcheck.parallel.ep.reference import expert_capacity

    class AllToAllMoE(torch.nn.Module):
        """The MoE layer of the module doc on this rank."""

        def __init__(self, spec: Any) -> None:
            super().__init__()
            self.wg = torch.nn.Parameter(spec.wg.clone())
            self.w1 = torch.nn.Parameter(spec.w1.clone())
            self.w2 = torch.nn.Parameter(spec.w2.clone())
            self.k, self.cf, self.router, self.ep = spec.k, spec.capacity_factor, spec.router, spec.ep
            self.E = spec.num_experts

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            n, h = x.shape
            E, k, ep = self.E, self.k, self.ep
            logits = x @ self.wg
            probs = logits.softmax(dim=-1)
            top, experts = torch.topk(logits, k, dim=-1)
            gates = top.softmax(dim=-1) if self.router == Router.TOPK_THEN_SOFTMAX else probs.gather(1, experts)
            C = expert_capacity(n, E, k, self.cf)
            fill = torch.zeros(E, dtype=torch.long, device=x.device)
            slots = []
            for j in range(k):                               # choice by choice, then token order
                onehot = torch.nn.functional.one_hot(experts[:, j], E)
                place = (torch.cumsum(onehot, dim=0) - 1 + fill) * onehot
                slots.append(place.sum(dim=1))
                fill = fill + onehot.sum(dim=0)
            slot = torch.stack(slots, dim=1)                 # (n, k)
            kept = slot < C
            flat = torch.where(kept, experts * C + slot, E * C)   # dropped choices to a scratch row
            buf = x.new_zeros(E * C + 1, h).index_add(0, flat.reshape(-1), x.repeat_interleave(k, dim=0))
            send = buf[:E * C].reshape(E, C, h)
            a2a = all_to_all_function()
            recv = a2a.apply(send).reshape(ep, E // ep, C, h)
            outs = []
            for i in range(E // ep):
                xs = recv[:, i].reshape(ep * C, h)
                outs.append((torch.relu(xs @ self.w1[i]) @ self.w2[i]).reshape(ep, C, h))
            back = a2a.apply(torch.stack(outs, dim=1).reshape(E, C, h).contiguous()).reshape(E * C, h)
            back = torch.cat([back, back.new_zeros(1, h)])
            y = x
            for j in range(k):
                y = y + torch.where(kept[:, j:j + 1], gates[:, j:j + 1] * back[flat[:, j]], 0.0)
            with torch.no_grad():
                sums = torch.stack([torch.bincount(experts.reshape(-1), minlength=E).to(x.dtype), probs.sum(dim=0)])
                dist.all_reduce(sums)
                aux = E * torch.sum(sums[0] / (ep * n * k) * sums[1] / (ep * n))
            return y, aux

        def grads(self) -> dict[str, torch.Tensor | None]:
            g = self.wg.grad
            if g is not None:
                g = g.clone()
                dist.all_reduce(g)
            return {"wg": g, "w1": self.w1.grad, "w2": self.w2.grad}

    return AllToAllMoE


_CLASSES: list[Any] = []


def all_to_all_moe(ctx: Any, spec: Any) -> Any:
    """The layer of the module doc for this rank (``make(ctx, spec)`` of the ``moe-layer`` contract)."""
    if not _CLASSES:
        _CLASSES.append(_layer_class())
    return _CLASSES[0](spec)


ALL_TO_ALL_MOE = all_to_all_moe


def fairscale_moe(ctx: Any, spec: Any) -> Any:
    """fairscale's ``MOELayer(Top2Gate(h, E), experts)`` on the world group, the contract's weights loaded: the
    gate's ``wg.weight`` is ``wg`` transposed (E, h); each local expert ``relu(x @ w1) @ w2`` is a module of its
    own. ``layer(x)`` feeds (T/ep, 1, h) (fairscale wants (s, t, m)) and returns the output with ``moe.l_aux``;
    ``grads()`` reads the gate's and the experts' gradients (the gate's left local: fairscale leaves it to DDP).
    Run with :data:`FAIRSCALE_OPTIONS` (its conventions); ``k`` must be 2 (``Top2Gate``)."""
    import torch
    from fairscale.nn.moe import MOELayer, Top2Gate

    class Expert(torch.nn.Module):
        def __init__(self, w1: torch.Tensor, w2: torch.Tensor) -> None:
            super().__init__()
            self.w1, self.w2 = torch.nn.Parameter(w1.clone()), torch.nn.Parameter(w2.clone())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x @ self.w1) @ self.w2

    class Layer:
        def __init__(self) -> None:
            h, E = spec.wg.shape
            gate = Top2Gate(h, E).to(dtype=spec.dtype, device=spec.device)
            with torch.no_grad():
                gate.wg.weight.copy_(spec.wg.T)
            self.experts = [Expert(spec.w1[i], spec.w2[i]) for i in range(spec.w1.shape[0])]
            self.gate = gate
            self.moe = MOELayer(gate, torch.nn.ModuleList(self.experts))

        def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.moe(x[:, None, :])
            return out.reshape(x.shape), self.moe.l_aux

        def grads(self) -> dict[str, torch.Tensor | None]:
            return layer_grads(self.gate.wg.weight, self.experts)

    return Layer()


FAIRSCALE_MOE = fairscale_moe


def layer_grads(wg: Any, experts: Sequence[Any]) -> dict[str, Any]:
    """The gradients the ``moe-layer`` contract reads from a library's layer: ``wg`` the router's
    ``Linear(h, E)`` weight, whose gradient (E, h) is returned transposed, (h, E); ``experts`` this rank's
    experts, each with ``w1`` (h, f) and ``w2`` (f, h), their gradients stacked to (E_local, h, f) and
    (E_local, f, h). Each entry is None when that weight (or any expert's) has no gradient."""
    import torch

    g = wg.grad
    w1 = [e.w1.grad for e in experts if e.w1.grad is not None]
    w2 = [e.w2.grad for e in experts if e.w2.grad is not None]
    n = len(experts)
    return {"wg": None if g is None else g.T, "w1": torch.stack(w1) if len(w1) == n else None,
            "w2": torch.stack(w2) if len(w2) == n else None}
