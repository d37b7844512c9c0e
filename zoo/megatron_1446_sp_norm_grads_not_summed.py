"""NVIDIA/Megatron-LM#1446: "final_layernorm gradient mismatch when TP+SP enabled".

Under sequence parallelism each tp rank runs the norms on its own sequence shard, so each computes a partial
gradient of the replicated norm weight; unless those are summed across tp, the copies get different gradients
and the replicated weights drift apart (the same symptom as the layer-norm divergence under TP of
NVIDIA/TransformerEngine#441 and BLOOM-176B). Re-created in plain torch: torchtitan's tp plan with the norms left
off it (each rank's norm weight a local tensor on its sequence shard), under tp = 2."""

from __future__ import annotations

from distcheck.parallel.step.hooks import StepTarget
from distcheck.zoo import Entry
from examples.my_step import apply_fsdp, apply_tp
from zoo._step import FIXED


def parallelize_norms_off_plan(model, mesh, layout):
    """torch's composition with every RMSNorm left off the tp plan (gradients never summed across tp)."""
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


BUG = StepTarget(parallelize_norms_off_plan, clip_grad_norm=full_norm_clip)

ENTRY = Entry(
    reference="NVIDIA/Megatron-LM#1446",
    url="https://github.com/NVIDIA/Megatron-LM/issues/1446",
    library="Megatron-LM", versions="main at fdfcef8 (March 2025), PyTorch 2.4.1",
    bug_class="replicated parameters drifting under TP + SP",
    contract="training-step", property="params",
    bug=BUG, fixed=FIXED,
    summary="sequence-parallel norm weight gradients not summed across tp: the replicas drift apart",
    reproduction="plain torch re-creation",
    options={"layout": "tp=2"},
)
