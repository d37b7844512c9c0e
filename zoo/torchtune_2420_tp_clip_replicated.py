"""meta-pytorch/torchtune#2420: ``clip_grad_norm`` does not work with tensor parallelism.

Under tp the parameters that stay replicated (the norms' weights) sit on every tp rank; a norm whose local
squares are all-reduced over tp counts them tp times. Re-created in plain torch: local squares summed over
dp_shard and tp, under tp = 2; the twin uses torch's DTensor-aware ``clip_grad_norm_``."""

from __future__ import annotations

from distcheck.parallel.step.hooks import StepTarget
from distcheck.zoo import Entry
from zoo._step import FIXED, clip_with, local_squares, parallelize


def tp_summed_clip(parameters, max_norm, info):
    """Local squares all-reduced over dp_shard and tp: a tp-replicated parameter counted tp times."""
    import torch.distributed as dist

    grads, sq = local_squares(parameters)
    for name in ("dp_shard", "tp"):
        if info.mesh[name].size() > 1:
            dist.all_reduce(sq, group=info.mesh.get_group(name))
    return clip_with(grads, sq.sqrt(), max_norm)


BUG = StepTarget(parallelize, clip_grad_norm=tp_summed_clip)

ENTRY = Entry(
    reference="meta-pytorch/torchtune#2420",
    url="https://github.com/meta-pytorch/torchtune/issues/2420",
    library="torchtune", versions="0.5 / 0.6 era distributed recipes (February 2025)",
    bug_class="gradient clipping under TP",
    contract="training-step", property="grad_norm",
    bug=BUG, fixed=FIXED,
    summary="tp-replicated parameters counted tp times in the global grad norm",
    reproduction="plain torch re-creation",
    options={"layout": "tp=2"},
)
