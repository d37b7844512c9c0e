"""pytorch/pytorch#88955: "[FSDP] Fix FSDP.clip_grad_norm_() for NO_SHARD".

``FSDP.clip_grad_norm_()`` summed every rank's local squared norm over the process group; under NO_SHARD each
rank holds the whole (replicated) gradient, so each was counted world_size times. Re-created in plain torch:
local squares all-reduced over the whole world under dp_replicate = 2 (FSDP2 replicating, as NO_SHARD / DDP)."""

from __future__ import annotations

from distcheck.parallel.step.hooks import StepTarget
from distcheck.zoo import Entry
from zoo._step import FIXED, clip_with, local_squares, parallelize


def world_summed_clip(parameters, max_norm, info):
    """Local squares all-reduced over every rank, replicas included."""
    import torch.distributed as dist

    grads, sq = local_squares(parameters)
    dist.all_reduce(sq)
    return clip_with(grads, sq.sqrt(), max_norm)


BUG = StepTarget(parallelize, clip_grad_norm=world_summed_clip)

ENTRY = Entry(
    reference="pytorch/pytorch#88955",
    url="https://github.com/pytorch/pytorch/pull/88955",
    library="torch (FSDP, NO_SHARD)", versions="before the fix of November 2022 (1.13)",
    bug_class="gradient clipping under replicated DP",
    contract="training-step", property="grad_norm",
    bug=BUG, fixed=FIXED,
    summary="replicated gradients counted once per replica in the global grad norm",
    reproduction="plain torch re-creation",
    options={"layout": "dp_replicate=2"},
)
