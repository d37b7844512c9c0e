"""DeepSpeed's ``deepspeed.moe.layer.MoE`` under the ``moe-layer`` contract, on gloo worlds (CPU).

``MOE`` is a factory ``make(ctx, spec) -> layer`` (:mod:`distcheck.parallel.ep.contracts`): it builds
``MoE(hidden_size=h, expert=Expert, num_experts=E, ep_size=ep, k=2, capacity_factor=spec.capacity_factor,
min_capacity=0, noisy_gate_policy=None, drop_tokens=True, use_rts=False, top2_2nd_expert_sampling=False)`` on
the world group (``set_deepspeed_parallelism()``: one expert-parallel group of every rank), loads the gate's
``wg.weight`` (E, h) as ``wg`` transposed and each local expert ``relu(x @ w1) @ w2`` (no biases), and returns
``(out, l_aux)``. ``deepspeed.comm`` wraps the pool's process group with the CPU shared-memory all-reduce
extension marked unavailable (it is compiled on first use; the all-to-alls never use it).

DeepSpeed's conventions, read from ``deepspeed/moe/sharded_moe.py`` (``top2gating``, ``MOELayer``) and
``layer.py``, and the contract options that name them (:data:`DEEPSPEED_OPTIONS`):

* the softmax over all experts, in float32 (``TopKGate.forward`` casts the tokens and ``wg`` to float32);
  top-1 its argmax, top-2 the argmax of the logits with the top-1 masked (``top2_2nd_expert_sampling=False``;
  the default True adds Gumbel noise first: a sampled second expert, :data:`MOE_SAMPLED`);
* capacity ``ceil((S / E) * 2 capacity_factor)`` per rank (``_capacity``; ``min_capacity=0``, the default 4 or
  8 raises it), first choices filling the slots in token order before any second choice, a choice at or over
  capacity dropped (``drop_tokens=True``; False sizes the buffer to the largest count, nothing dropped);
* the kept gates divided by their sum (``gates1_s /= denom_s``): ``renormalise=true``;
* ``l_aux = mean(me * ce) * E * E`` on each rank, ``ce`` the share of first choices: ``aux_scope=per_rank``,
  ``aux_counts=first_choice``, ``aux_scale=E``;
* the output is the combine alone (``use_residual=False``: no PR-MoE MLP): ``residual=false``; the gate's
  gradient is left to data parallelism: ``router_grad=local``.

``use_rts`` (random token selection) and ``noisy_gate_policy`` act only in ``top1gating`` (k = 1); ``k`` is
fixed at 2 here because DeepSpeed's top-1 gate is the softmax probability itself, which the contract's
``renormalise=false`` matches only under the ``softmax_then_topk`` router, while its cases draw the router.
float32 only: in float64 the gates are still float32 (rounded at 2^-24), so ``forward``, ``grads`` and
``aux_loss`` FAIL beyond the float64 bound (e.g. an output error of 6.8e-10 over a bound of 3.4e-16).

    distcheck certify distcheck.libs.targets.deepspeed_moe:MOE --contract moe-layer --dtypes float32 \\
        --option k=2 --option residual=false --option renormalise=true --option aux_scope=per_rank \\
        --option aux_counts=first_choice --option router_grad=local
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

__all__ = ["DEEPSPEED_OPTIONS", "deepspeed_moe", "MOE", "MOE_SAMPLED"]

#: the moe-layer options that name DeepSpeed's ``MoE`` conventions (module doc)
DEEPSPEED_OPTIONS: dict[str, Any] = {"k": 2, "residual": False, "renormalise": True, "aux_scope": "per_rank",
                                     "aux_counts": "first_choice", "aux_scale": "E", "router_grad": "local"}

_WORLDS: set[tuple[int, int]] = set()


def _init_comm() -> None:
    """``deepspeed.comm`` over the default gloo group, once per world and rank, without the shared-memory op."""
    import torch.distributed as dist

    key = (id(dist.group.WORLD), dist.get_rank())
    if key in _WORLDS:
        return
    with contextlib.redirect_stdout(io.StringIO()):
        import deepspeed.comm as ds_dist
        import deepspeed.ops
    # the CPU accelerator's shared-memory all-reduce is a C++ extension compiled on first use (minutes on two
    # cores); the all-to-alls never use it, so it is marked unavailable before deepspeed.comm wraps the group
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    ds_dist.init_distributed(dist_backend="gloo")
    _WORLDS.add(key)


def deepspeed_moe(ctx: Any, spec: Any, *, sampling: bool = False) -> Any:
    """DeepSpeed's ``MoE`` with ``TopKGate(k=2)`` on the world group, the contract's weights loaded (module doc);
    ``sampling``: DeepSpeed's default ``top2_2nd_expert_sampling=True`` (the second expert drawn with Gumbel
    noise). ``layer(x)`` takes (T/ep, h), returns ``(out (T/ep, h), l_aux)``; ``grads()`` the gate's (h, E)
    and the local experts' (E/ep, h, f), (E/ep, f, h) gradients, None where one is missing."""
    import torch

    _init_comm()
    with contextlib.redirect_stdout(io.StringIO()):
        from deepspeed.moe.layer import MoE

    class Expert(torch.nn.Module):
        def __init__(self, h: int, f: int) -> None:
            super().__init__()
            self.w1 = torch.nn.Parameter(torch.zeros(h, f, dtype=spec.dtype))
            self.w2 = torch.nn.Parameter(torch.zeros(f, h, dtype=spec.dtype))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x @ self.w1) @ self.w2

    class Layer:
        def __init__(self) -> None:
            h, E = spec.wg.shape
            with contextlib.redirect_stdout(io.StringIO()):
                moe = MoE(hidden_size=h, expert=Expert(h, spec.w1.shape[2]), num_experts=E, ep_size=spec.ep,
                          k=spec.k, capacity_factor=spec.capacity_factor, eval_capacity_factor=spec.capacity_factor,
                          min_capacity=0, noisy_gate_policy=None, drop_tokens=True, use_rts=False,
                          top2_2nd_expert_sampling=sampling)
                moe.set_deepspeed_parallelism()
            moe = moe.to(dtype=spec.dtype, device=spec.device)
            self.gate = moe.deepspeed_moe.gate
            self.experts = list(moe.deepspeed_moe.experts.deepspeed_experts)
            with torch.no_grad():
                self.gate.wg.weight.copy_(spec.wg.T)
                for i, e in enumerate(self.experts):
                    e.w1.copy_(spec.w1[i])
                    e.w2.copy_(spec.w2[i])
            self.moe = moe

        def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out, l_aux, _ = self.moe(x)
            return out, l_aux

        def grads(self) -> dict[str, torch.Tensor | None]:
            from distcheck.parallel.ep.plans import layer_grads

            return layer_grads(self.gate.wg.weight, self.experts)

    return Layer()


def deepspeed_moe_sampled(ctx: Any, spec: Any) -> Any:
    """:func:`deepspeed_moe` with DeepSpeed's default ``top2_2nd_expert_sampling=True``."""
    return deepspeed_moe(ctx, spec, sampling=True)


#: DeepSpeed's MoE, second expert the second-largest logit (moe-layer contract, :data:`DEEPSPEED_OPTIONS`)
MOE = deepspeed_moe
#: DeepSpeed's MoE with its default sampled second expert
MOE_SAMPLED = deepspeed_moe_sampled
