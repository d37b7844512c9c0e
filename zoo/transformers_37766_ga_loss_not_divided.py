"""huggingface/transformers#37766: "As gradient_accumulation_steps increases, the loss also increases".

When the model does not accept ``loss_kwargs`` the Trainer does not divide the loss by the number of items in
the whole accumulated batch but by those of a single forward pass, and nothing warns: each micro-batch
contributes its own token mean, so the accumulated gradient grows with the number of micro-batches.
Re-created in plain torch: each micro-batch's token mean, not divided by anything else, under dp_shard = 2."""

from __future__ import annotations

from distcheck.parallel.step.hooks import StepTarget
from distcheck.parallel.step.model import token_loss_sum
from distcheck.zoo import Entry
from zoo._step import FIXED, parallelize


def microbatch_mean(logits, labels, info):
    """The micro-batch's own token mean (the forward pass's items only)."""
    return token_loss_sum(logits, labels) / info.microbatch_tokens


BUG = StepTarget(parallelize, loss_fn=microbatch_mean)

ENTRY = Entry(
    reference="huggingface/transformers#37766",
    url="https://github.com/huggingface/transformers/issues/37766",
    library="transformers (Trainer)", versions="4.47.1 (as reported; 4.51.3 still without a warning)",
    bug_class="loss normalization under gradient accumulation",
    contract="training-step", property="grad_norm",
    bug=BUG, fixed=FIXED,
    summary="each micro-batch's loss normalized by its own tokens, not the accumulated batch's",
    reproduction="plain torch re-creation",
    options={"layout": "dp_shard=2"},
)
