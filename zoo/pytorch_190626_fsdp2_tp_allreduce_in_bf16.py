"""pytorch/pytorch#190626: "[FSDP2] MixedPrecisionPolicy reduce_dtype is not applied to the TP-mesh Partial ->
Replicate gradient all-reduce" (fix proposed in pytorch/pytorch#190627).

Under FSDP2 with tensor parallelism, ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`` applies
``reduce_dtype`` to FSDP's own reduce-scatter only: the all-reduce over tp of the gradients of tp-replicated
parameters (the norm weights under sequence parallelism) runs in the gradient's own dtype, bfloat16, while the
policy promises float32. Re-created in plain torch at the step's own precision (float64 here, as the promised
reduce dtype): the first block's ffn norm is a hand-written sequence-parallel RMSNorm whose weight-gradient
all-reduce over tp runs in bfloat16 (each rank's partial sum rounded to bfloat16, their sum rounded to
bfloat16, as a two-rank bfloat16 all-reduce gives), under tp = 2; the twin is torch's composition (the norm on the
plan, its gradient reduced in the step's dtype)."""

from __future__ import annotations

from distcheck.parallel.step.hooks import StepTarget
from distcheck.zoo import Entry
from examples.my_step import apply_fsdp, apply_tp
from examples.step_mutants import full_norm
from zoo._step import FIXED


def _bf16_tp_norm(norm, group):
    """A sequence-parallel RMSNorm (``norm``'s weight, replicated) whose weight gradient is all-reduced over
    ``group`` in bfloat16."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    class AllReduceInBf16(torch.autograd.Function):
        @staticmethod
        def forward(ctx, w):
            return w.view_as(w)

        @staticmethod
        def backward(ctx, grad):
            low = grad.to(torch.bfloat16).to(grad.dtype)  # this rank's partial sum, sent in bfloat16
            dist.all_reduce(low, group=group)  # two bfloat16 values: their sum is exact here ...
            return low.to(torch.bfloat16).to(grad.dtype)  # ... and rounded to bfloat16 once, as NCCL's would be

    class SequenceParallelRMSNormBf16Reduce(torch.nn.Module):
        def __init__(self):
            super().__init__()
            weight = norm.weight.detach()
            self.eps = norm.eps
            self.weight = torch.nn.Parameter((weight.full_tensor() if hasattr(weight, "full_tensor") else
                                              weight).clone())

        def forward(self, x):
            return F.rms_norm(x, self.weight.shape, AllReduceInBf16.apply(self.weight), self.eps)

    return SequenceParallelRMSNormBf16Reduce()


def parallelize_tp_reduce_in_bf16(model, mesh, layout):
    """torch's composition with ``layers.0.ffn_norm`` replaced, after the plan, by the sequence-parallel norm
    whose weight-gradient all-reduce over tp runs in bfloat16."""
    if layout.tp > 1:
        apply_tp(model, mesh["tp"])
        block = model.layers["0"]
        block.ffn_norm = _bf16_tp_norm(block.ffn_norm, mesh.get_group("tp"))
        if model.config.tied:
            model.output.weight = model.tok_embeddings.weight
    apply_fsdp(model, mesh["dp_replicate", "dp_shard"])
    return model


BUG = StepTarget(parallelize_tp_reduce_in_bf16, clip_grad_norm=full_norm)

ENTRY = Entry(
    reference="pytorch/pytorch#190626",
    url="https://github.com/pytorch/pytorch/issues/190626",
    library="torch (FSDP2 + tensor parallelism)", versions="main as reported (July 2026)",
    bug_class="mixed-precision reduction: the tp all-reduce in bfloat16",
    contract="training-step", property="grad_norm",
    bug=BUG, fixed=FIXED,
    summary="the tp all-reduce of replicated norm weights' gradients runs in bfloat16, not the promised reduce dtype",
    reproduction="plain torch re-creation",
    options={"layout": "tp=2"},
)
