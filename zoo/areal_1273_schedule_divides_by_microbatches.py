"""areal-project/AReaL#1273: "fix(megatron): compensate pipeline schedule's /num_microbatches in grad".

Megatron Core's forward step (``_forward_step_helper`` in ``megatron/core/pipeline_parallel/schedules.py``)
divides a ``(loss, {})`` loss by ``num_microbatches``; AReaL already weighed each micro-batch's loss by its share
of the global batch, so the extra division made every gradient, the reported grad norm and the update
``num_microbatches`` times too small (the reported grad norm was about N times smaller than with its FSDP
engine on the same data). Re-created in plain torch: the default token-mean loss (already global) divided once
more by the number of micro-batches m, under dp_shard = 2; the twin weighs each micro-batch once."""

from __future__ import annotations

from distcheck.parallel.step.hooks import StepTarget, token_mean_loss
from distcheck.zoo import Entry
from zoo._step import FIXED, parallelize


def divided_by_microbatches(logits, labels, info):
    """The global token-mean loss of the micro-batch, divided again by the number of micro-batches."""
    return token_mean_loss(logits, labels, info) / info.num_microbatches


BUG = StepTarget(parallelize, loss_fn=divided_by_microbatches)

ENTRY = Entry(
    reference="areal-project/AReaL#1273",
    url="https://github.com/areal-project/AReaL/pull/1273",
    library="AReaL (Megatron engine) on Megatron Core's pipeline schedules", versions="before April 2026",
    bug_class="loss normalization under gradient accumulation (the schedule's division)",
    contract="training-step", property="grad_norm",
    bug=BUG, fixed=FIXED,
    summary="a loss already weighed by the global batch divided again by num_microbatches: gradients m times too small",
    reproduction="plain torch re-creation",
    options={"layout": "dp_shard=2"},
)
