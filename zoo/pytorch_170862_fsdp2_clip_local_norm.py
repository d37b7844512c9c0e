"""pytorch/pytorch#170862: ``clip_grad_norm_`` does not work with FSDP2.

The report: under FSDP2 the norm returned is that of the rank's local (partial) parameters, not of all of
them. Re-created in plain torch: the norm of each rank's local shards (``to_local()``), never all-reduced over
the FSDP group, under dp_shard = 2; the twin uses torch's DTensor-aware ``clip_grad_norm_``."""

from __future__ import annotations

from distcheck.parallel.step.hooks import StepTarget
from distcheck.zoo import Entry
from zoo._step import FIXED, clip_with, local_squares, parallelize


def local_shard_clip(parameters, max_norm, info):
    """The norm of this rank's local shards only."""
    grads, sq = local_squares(parameters)
    return clip_with(grads, sq.sqrt(), max_norm)


BUG = StepTarget(parallelize, clip_grad_norm=local_shard_clip)

ENTRY = Entry(
    reference="pytorch/pytorch#170862",
    url="https://github.com/pytorch/pytorch/issues/170862",
    library="torch (FSDP2)", versions="2.9.1 (as reported)",
    bug_class="gradient clipping under FSDP",
    contract="training-step", property="grad_norm",
    bug=BUG, fixed=FIXED,
    summary="the grad norm of the local FSDP2 shards, not of the whole model",
    reproduction="plain torch re-creation",
    options={"layout": "dp_shard=2"},
)
