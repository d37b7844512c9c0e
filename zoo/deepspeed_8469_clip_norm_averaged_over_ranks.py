"""deepspeedai/DeepSpeed#8469: "AutoEP FP32 gradient clipping averages norms across ranks with different expert
ownership".

DeepSpeed's FP32 clipping path combined the ranks' local gradient norms by averaging them, as if every rank held
the same parameters; under AutoEP the ranks own different experts, so the global norm (and the clipping factor)
changes with how the same gradients are distributed. Re-created in plain torch on the ranks' own shards
(FSDP2, dp_shard = 2: each rank owns different parameter elements, as each owns different experts): each rank's
local norm, averaged over the ranks, clips the gradients."""

from __future__ import annotations

from distcheck.parallel.step.hooks import StepTarget
from distcheck.zoo import Entry
from zoo._step import FIXED, clip_with, local_squares, parallelize


def averaged_local_norms(parameters, max_norm, info):
    """The mean over the ranks of each rank's local norm."""
    import torch.distributed as dist

    grads, sq = local_squares(parameters)
    norm = sq.sqrt()
    dist.all_reduce(norm)
    return clip_with(grads, norm / dist.get_world_size(), max_norm)


BUG = StepTarget(parallelize, clip_grad_norm=averaged_local_norms)

ENTRY = Entry(
    reference="deepspeedai/DeepSpeed#8469",
    url="https://github.com/deepspeedai/DeepSpeed/issues/8469",
    library="DeepSpeed (AutoEP, FP32 clipping, ZeRO-0)", versions="commit cf44300 (September 2026)",
    bug_class="gradient clipping with rank-owned parameters",
    contract="training-step", property="grad_norm",
    bug=BUG, fixed=FIXED,
    summary="the global grad norm taken as the mean of rank-local norms, though the ranks own different parameters",
    reproduction="plain torch re-creation",
    options={"layout": "dp_shard=2"},
)
