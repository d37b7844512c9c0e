"""meta-pytorch/torchtune#2172: "Fix gradient scaling to account for world_size normalization".

The recipe divided the summed token loss by the tokens of the whole step, but FSDP / DDP average the
gradients over the data-parallel ranks: the result is (loss(A) + loss(B)) / (dp (|A| + |B|)), dp times too
small, unless the averaging is undone. Re-created in plain torch: the token-sum loss over the step's tokens,
without the dp factor, under dp_shard = 2."""

from __future__ import annotations

from distcheck.parallel.step.hooks import StepTarget
from distcheck.parallel.step.model import token_loss_sum
from distcheck.zoo import Entry
from zoo._step import FIXED, parallelize


def dp_average_not_undone(logits, labels, info):
    """sum of the micro-batch's token losses / the step's tokens (FSDP2 then divides by dp once more)."""
    return token_loss_sum(logits, labels) / info.global_tokens


BUG = StepTarget(parallelize, loss_fn=dp_average_not_undone)

ENTRY = Entry(
    reference="meta-pytorch/torchtune#2172",
    url="https://github.com/meta-pytorch/torchtune/pull/2172",
    library="torchtune", versions="distributed recipes before December 2024",
    bug_class="loss normalization under DP",
    contract="training-step", property="grad_norm",
    bug=BUG, fixed=FIXED,
    summary="token-normalized loss with FSDP's dp averaging left in: gradients dp times too small",
    reproduction="plain torch re-creation",
    options={"layout": "dp_shard=2"},
)
