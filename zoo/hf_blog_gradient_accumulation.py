"""Hugging Face, "Fixing Gradient Accumulation" (October 2024): the transformers Trainer's accumulation loss.

Each micro-batch's cross-entropy was its own token mean; averaging those means over the accumulation steps
weighs a token of a short micro-batch more than one of a long micro-batch, so accumulating m micro-batches is
not the large batch (fixed by passing num_items_in_batch, the step's token count). Re-created in plain torch:
each micro-batch's token mean divided by the number of micro-batches, under dp_shard = 2 (FSDP2 averages the
ranks)."""

from __future__ import annotations

from distcheck.parallel.step.hooks import StepTarget
from distcheck.parallel.step.model import token_loss_sum
from distcheck.zoo import Entry
from zoo._step import FIXED, parallelize


def mean_of_means(logits, labels, info):
    """The micro-batch's token mean over the number of micro-batches."""
    return token_loss_sum(logits, labels) / info.microbatch_tokens / info.num_microbatches


BUG = StepTarget(parallelize, loss_fn=mean_of_means)

ENTRY = Entry(
    reference="blog: Fixing Gradient Accumulation (Hugging Face, 2024)",
    url="https://huggingface.co/blog/gradient_accumulation",
    library="transformers (Trainer)", versions="before 4.46 (October 2024)",
    bug_class="loss normalization under gradient accumulation",
    contract="training-step", property="params",
    bug=BUG, fixed=FIXED,
    summary="the mean of per-micro-batch token means instead of the step's token mean",
    reproduction="plain torch re-creation",
    options={"layout": "dp_shard=2"},
)
