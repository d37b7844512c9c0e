"""huggingface/transformers#13681: "Make sure shown loss in distributed training is correctly averaged over all
workers".

The Trainer showed the loss of the first worker only: each data-parallel rank's loss is that of its own shard,
and rank 0's was the one logged, although ranks' losses can differ widely (CTC speech recognition in the PR).
Re-created in plain torch: the reported loss is each rank's own micro-batches' token mean (the token counts
still all-reduced), under dp_shard = 2."""

from __future__ import annotations

from distcheck.parallel.step.hooks import StepTarget, all_reduce_dp
from distcheck.zoo import Entry
from zoo._step import FIXED, parallelize


def loss_of_own_shard(loss_sum, tokens, info):
    """This rank's own loss (what rank 0 logs), with the step's tokens all-reduced."""
    _, seen = all_reduce_dp(loss_sum, tokens, info)
    return loss_sum / tokens, seen


BUG = StepTarget(parallelize, report_loss=loss_of_own_shard)

ENTRY = Entry(
    reference="huggingface/transformers#13681",
    url="https://github.com/huggingface/transformers/pull/13681",
    library="transformers (Trainer)", versions="before 4.11 (September 2021)",
    bug_class="loss reporting under DP",
    contract="training-step", property="loss",
    bug=BUG, fixed=FIXED,
    summary="the logged loss is the first worker's own shard's, not the mean over every data-parallel rank",
    reproduction="plain torch re-creation",
    options={"layout": "dp_shard=2"},
)
