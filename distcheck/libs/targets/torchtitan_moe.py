"""torchtitan's dropless expert parallelism under the ``moe-layer`` contract (``dropless=true``), on gloo worlds.

``MOE`` is a factory ``make(ctx, spec) -> layer`` (:mod:`distcheck.parallel.ep.contracts`). It runs torchtitan's
own router and token dispatcher (``torchtitan/models/common/moe.py``, ``token_dispatcher.py``, torchtitan 0.3):

* ``TokenChoiceTopKRouter(score_func="softmax", top_k=k, route_norm=True)`` with its gate ``Linear(h, E)`` (no
  bias) loaded with ``wg`` transposed: the softmax over all experts, the top-k, the kept scores divided by their
  sum (``route_norm``): the contract's ``renormalise=true`` (with nothing dropped, either router convention);
* ``AllToAllTokenDispatcher`` on a one-axis ``ep`` device mesh of the world: the tokens sorted by expert, the
  per-expert counts exchanged first (a functional ``all_to_all_single`` of the E int64 counts), the routed rows
  sent with ``all_to_all_single(rows, output_splits, input_splits)`` (autograd's), regrouped expert-major
  (``_permute``), and the reverse in ``combine``: ``_unpermute``, the all-to-all back, the rows scaled by their
  scores (in float32) and ``scatter_add`` into the tokens. torchtitan's SPMD type checker is switched off
  (``set_spmd_backend("dtensor")``): the plain functional-collective path.

torchtitan's ``GroupedExperts`` are SwiGLU experts computed in bfloat16 with ``torch._grouped_mm``; the contract's
expert is ``relu(x @ w1) @ w2``, so each local expert here is that MLP on its segment of the dispatched rows (the
segments ``num_global_tokens_per_local_expert`` gives), where torchtitan would run its grouped GEMM. The layer
returns ``x + out`` (torchtitan's ``MoE`` has no residual: the decoder block adds it; the contract's
``residual=true``) and the Switch aux loss ``E sum_e f_e P_e`` over the batch (torchtitan balances by an expert
bias instead; the loss is computed here from its router's scores). float32 only: the combine scales the rows in
float32, so a float64 run is rounded there at 2^-24::

    distcheck certify distcheck.libs.targets.torchtitan_moe:MOE --contract moe-layer --dtypes float32 \\
        --option dropless=true --option renormalise=true --world-sizes 2,4
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["TORCHTITAN_OPTIONS", "torchtitan_moe", "MOE"]

#: the moe-layer options that name torchtitan's conventions (module doc)
TORCHTITAN_OPTIONS: dict[str, Any] = {"dropless": True, "renormalise": True}


def torchtitan_moe(ctx: Any, spec: Any) -> Any:
    """torchtitan's router and all-to-all token dispatcher with the contract's experts (module doc). ``layer(x)``
    takes (T/ep, h) and returns ``(x + out, aux)``; ``grads()`` the gate's (h, E) and the local experts' gradients
    (None where one is missing)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.distributed.utils import set_spmd_backend
    from torchtitan.models.common.linear import Linear
    from torchtitan.models.common.moe import TokenChoiceTopKRouter
    from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher

    set_spmd_backend("dtensor")
    E, k, ep = spec.num_experts, spec.k, spec.ep
    h = spec.wg.shape[0]
    router = TokenChoiceTopKRouter(TokenChoiceTopKRouter.Config(
        num_experts=E, gate=Linear.Config(in_features=h, out_features=E, bias=False), top_k=k,
        score_func="softmax", route_norm=True)).to(dtype=spec.dtype, device=spec.device)
    with torch.no_grad():
        router.gate.weight.copy_(spec.wg.T)
    dispatcher = AllToAllTokenDispatcher(AllToAllTokenDispatcher.Config(num_experts=E, top_k=k))
    dispatcher.wire_meshes(ep_mesh=init_device_mesh(spec.device.type, (ep,), mesh_dim_names=("ep",)))
    w1 = torch.nn.Parameter(spec.w1.clone())
    w2 = torch.nn.Parameter(spec.w2.clone())

    class Layer:
        def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            n = x.shape[0]
            with warnings.catch_warnings():  # its float32 autocast of the gate is refused on CPU (a UserWarning)
                warnings.filterwarnings("ignore", message="In CPU autocast")
                scores, experts, probs = router(x[None])
            scores, experts, probs = scores[0], experts[0], probs[0]
            counts = torch.zeros(E, dtype=torch.int64, device=x.device).scatter_add_(
                0, experts.reshape(-1), torch.ones(experts.numel(), dtype=torch.int64, device=x.device))
            rows, per_expert, meta = dispatcher.dispatch(x, scores, experts, counts)
            outs, start = [], 0
            for i, c in enumerate(per_expert.tolist()):               # expert-major segments
                seg = rows[start:start + c]
                outs.append(torch.relu(seg @ w1[i]) @ w2[i])
                start += c
            out = dispatcher.combine(torch.cat(outs) if outs else rows[:0], meta, x)
            with torch.no_grad():
                sums = torch.stack([counts.to(x.dtype), probs.sum(0).to(x.dtype)])
                dist.all_reduce(sums)
                aux = E * torch.sum(sums[0] / (ep * n * k) * sums[1] / (ep * n))
            return x + out, aux

        def grads(self) -> dict[str, torch.Tensor | None]:
            g = router.gate.weight.grad
            if g is not None:
                g = g.T.clone()
                dist.all_reduce(g)                                   # the replicated router: DDP's sum
            return {"wg": g, "w1": w1.grad, "w2": w2.grad}

    return Layer()


MOE = torchtitan_moe
