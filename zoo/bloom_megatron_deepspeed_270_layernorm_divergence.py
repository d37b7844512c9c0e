"""bigscience-workshop/Megatron-DeepSpeed#270: "Test different layer norm" (a script to reproduce diverging
layer_norm weights), the BLOOM-176B training's layer-norm divergence under tensor parallelism.

The layer norms are replicated on every tp rank; during BLOOM's training their copies drifted apart because each
tp rank computed a slightly different gradient for them and nothing re-synchronized the copies. Re-created in
plain torch at the level the contracts see: each tp rank's copy of the norm weights gets its own gradient
(torchtitan's tp plan with the norms left off it, each rank's norm on its sequence shard), never summed or
averaged across tp, under tp = 2; the twin keeps the norms on the plan (their gradients summed across tp)."""

from __future__ import annotations

from distcheck.parallel.step.hooks import StepTarget
from distcheck.zoo import Entry
from examples.my_step import apply_fsdp, apply_tp
from zoo._step import FIXED


def parallelize_norm_copies_unsynced(model, mesh, layout):
    """tp without the norms on the plan: each tp rank's norm weight is its own copy, updated with its own
    gradient."""
    if layout.tp > 1:
        apply_tp(model, mesh["tp"], norms=False)
    apply_fsdp(model, mesh["dp_replicate", "dp_shard"])
    return model


def full_norm_clip(parameters, max_norm, info):
    """The norm of every gradient's full tensor (the parameters live on different meshes here)."""
    import torch

    grads = [p.grad for p in parameters if p.grad is not None]
    sq = sum(float(torch.sum((g.full_tensor() if hasattr(g, "full_tensor") else g) ** 2)) for g in grads)
    coef = min(1.0, max_norm / (sq**0.5 + 1e-6))
    for g in grads:
        g.mul_(coef)
    return sq**0.5


BUG = StepTarget(parallelize_norm_copies_unsynced, clip_grad_norm=full_norm_clip)

ENTRY = Entry(
    reference="bigscience-workshop/Megatron-DeepSpeed#270",
    url="https://github.com/bigscience-workshop/Megatron-DeepSpeed/pull/270",
    library="Megatron-DeepSpeed (BLOOM-176B training)", versions="BigScience fork, March 2022",
    bug_class="replicated parameters drifting under TP (layer norm)",
    contract="training-step", property="params",
    bug=BUG, fixed=FIXED,
    summary="the tp copies of the layer-norm weights get different gradients and drift apart",
    reproduction="plain torch re-creation",
    options={"layout": "tp=2"},
)
