"""meta-pytorch/torchtune#2436 (for #2420): gradients scaled by the world size instead of the dp size.

torchtune's recipe undid FSDP's averaging with ``scale_grads(model, world_size / num_tokens)``; under tp the
world is dp x tp, so the gradients came out tp times too large (the PR: "scale with DP size, not world size").
Re-created in plain torch: the global token-sum loss multiplied by the world size, under tp = 2."""

from __future__ import annotations

from distcheck.parallel.step.hooks import StepTarget
from distcheck.parallel.step.model import token_loss_sum
from distcheck.zoo import Entry
from zoo._step import FIXED, parallelize


def world_size_scaled_loss(logits, labels, info):
    """The token-sum loss over the step's tokens, times the world size (FSDP2 then averages over dp only)."""
    return token_loss_sum(logits, labels) * info.layout.world_size / info.global_tokens


BUG = StepTarget(parallelize, loss_fn=world_size_scaled_loss)

ENTRY = Entry(
    reference="meta-pytorch/torchtune#2436",
    url="https://github.com/meta-pytorch/torchtune/pull/2436",
    library="torchtune", versions="distributed recipes with tensor parallelism (February 2025)",
    bug_class="loss normalization under DP x TP",
    contract="training-step", property="grad_norm",
    bug=BUG, fixed=FIXED,
    summary="gradients scaled by the world size (dp x tp), not the dp size: tp times too large under tp",
    reproduction="plain torch re-creation",
    options={"layout": "tp=2"},
)
