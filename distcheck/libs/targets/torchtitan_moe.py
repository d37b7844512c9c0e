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

:func:`moe_step_row` is the row of torchtitan's MoE debug model under its own parallelize (the ``training-step``
contract): a skip whose reason it probes on CPU, where ``distcheck libs`` runs. torchtitan's DeepSeek-V3
``debugmodel`` (``model_registry("debugmodel", attn_backend=...)``: 6 layers, 8 routed experts top-3 and 2 shared,
``parallelize_deepseekv3``: EP, FSDP2, TP) is built under each attention backend its language models accept
(:data:`ATTENTION_BACKENDS`, ``torchtitan/models/common/config_utils.py``'s ``get_attention_config``) and one
forward and backward of 8 tokens is run: torchtitan 0.3 on torch 2.13 refuses every one on CPU (FlexAttention has no
CPU backward, varlen calls the CUDA flash-attention op, flex_flash asks for a Hopper GPU, sdpa is refused for
language models), so no training step of the model runs on a gloo world. And its ``GroupedExperts`` compute in
bfloat16 whatever the model's dtype (``x.bfloat16()``, ``torch._grouped_mm``): a float64 expert's output is
probed against the float64 product, the error the float64 step's bound (2^-32 of the scale) cannot hold, while
the contract's bf16 criterion leaves MoE layers out (:data:`distcheck.parallel.step.axes.LOW_PRECISION_AXES`).
Where a backend trains on CPU (a later torchtitan) the row FAILs, asking for the adapter.
"""

from __future__ import annotations

import warnings
from typing import Any

#: the distribution the rows name
DIST = "torchtitan"

__all__ = ["TORCHTITAN_OPTIONS", "ATTENTION_BACKENDS", "torchtitan_moe", "MOE", "moe_step_row", "backward_refusal",
           "expert_precision"]

#: the moe-layer options that name torchtitan's conventions (module doc)
TORCHTITAN_OPTIONS: dict[str, Any] = {"dropless": True, "renormalise": True}
#: the attention backends torchtitan 0.3's language models accept (``get_attention_config``)
ATTENTION_BACKENDS = ("flex", "flex_flash", "varlen", "sdpa")


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


def backward_refusal(backend: str) -> str | None:
    """One forward and backward of torchtitan's DeepSeek-V3 ``debugmodel`` under ``attn_backend=backend`` on CPU
    (float32, its own initialisation, 8 tokens of one document): None when it runs, else torchtitan's or torch's
    refusal, ``"ExceptionType: its first sentence"``."""
    import torch
    from torchtitan.models.deepseek_v3 import model_registry

    try:
        model = model_registry("debugmodel", attn_backend=backend).model.build()
        model.init_states(buffer_device=torch.device("cpu"))
        tokens = torch.randint(0, 2048, (1, 8), generator=torch.Generator().manual_seed(0))
        positions = torch.arange(8)[None]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = model(tokens, positions=positions, attention_masks=model.get_attention_masks(positions=positions))
            out.float().sum().backward()
    except (NotImplementedError, ValueError, RuntimeError, AssertionError, TypeError) as exc:  # the refusal, named
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"{type(exc).__name__}: {first.split('. ')[0].rstrip('.')}"
    return None


def expert_precision() -> float:
    """log2 of the relative error of torchtitan's ``GroupedExperts`` (2 experts of 8 x 8, SwiGLU) on float64 weights
    and inputs against the float64 product: about -8 (bfloat16 arithmetic), where float64's would be below -50."""
    import math

    import torch
    from torch.nn import functional as F
    from torchtitan.models.common.moe import GroupedExperts

    gen = torch.Generator().manual_seed(0)
    experts = GroupedExperts(GroupedExperts.Config(dim=8, hidden_dim=8, num_experts=2)).to(torch.float64)
    with torch.no_grad():
        for p in experts.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
        x = torch.randn(16, 8, generator=gen, dtype=torch.float64)
        got = experts(x, torch.tensor([8, 8]))
        rows = [x[8 * e:8 * e + 8] for e in range(2)]
        want = torch.cat([(F.silu(r @ experts.w1_EFD[e].T) * (r @ experts.w3_EFD[e].T)) @ experts.w2_EDF[e].T
                          for e, r in enumerate(rows)])
    return math.log2(float((got - want).abs().max() / want.abs().max()))


def moe_step_row() -> Any:
    """``libs.torchtitan.moe_step`` (module doc): skip with the probed reasons when no attention backend trains on
    CPU, FAIL naming the backend that does (the adapter is then to be written)."""
    from distcheck.core.results import FAIL, SKIP, CheckResult
    from distcheck.libs.targets import library

    refusals = {b: backward_refusal(b) for b in ATTENTION_BACKENDS}
    what = ("torchtitan's DeepSeek-V3 debugmodel (8 experts top-3, 2 shared) with its own parallelize_deepseekv3 "
            "(EP, FSDP2, TP) under training-step on gloo")
    trains = [b for b, why in refusals.items() if why is None]
    if trains:
        return CheckResult(check="libs.torchtitan.moe_step", backend=library(DIST), verdict=FAIL,
                           detail=f"{what}: trains on CPU under attn_backend {', '.join(trains)}, which this row "
                                  "says it does not: certify it (a StepTarget of the model and its parallelize)")
    refused = "; ".join(f"{b}: {why}" for b, why in refusals.items())
    return CheckResult(check="libs.torchtitan.moe_step", backend=library(DIST), verdict=SKIP,
                       detail=f"{what}: not run: on CPU its backward is refused under every attention backend "
                              f"({refused}); and its GroupedExperts compute in bf16 whatever the model's dtype "
                              f"(a float64 expert 2^{expert_precision():.1f} off the float64 product), which the "
                              "float64 bound cannot hold and the bf16 criterion leaves out (MoE layers)")
