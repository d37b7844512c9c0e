"""pytorch/torchtitan#2972: "PP and non-PP produce differently scaled gradients".

Without pipeline parallelism torchtitan divides the summed loss by the step's global token count before the
backward; under PP the schedule runs the backward on the last stage's raw summed loss (``scale_grads=False``,
FSDP's own division off), and the division by ``global_valid_tokens`` comes after ``pp_schedule.step()``, for
the logged loss only: the gradients are ``global_valid_tokens`` times too large while the logged loss looks
right. Re-created in plain torch: under pp = 2 the schedule's ``loss_fn`` is the micro-batch's summed loss (times
the dp degree, FSDP's average undone as the twin does) without the division by the global token count; the
reported loss keeps the division (the default ``report_loss``)."""

from __future__ import annotations

from distcheck.parallel.step.hooks import StepTarget, cross_entropy_sum
from distcheck.zoo import Entry
from zoo._step import FIXED, parallelize


def summed_loss(logits, labels, info):
    """The micro-batch's summed per-token loss (times dp, FSDP's average undone), never divided by the step's
    global token count."""
    loss = info.token_loss or cross_entropy_sum
    return loss(logits, labels, info) * info.layout.dp_cp


BUG = StepTarget(parallelize, loss_fn=summed_loss)

ENTRY = Entry(
    reference="pytorch/torchtitan#2972",
    url="https://github.com/pytorch/torchtitan/issues/2972",
    library="torchtitan (pipeline parallelism)", versions="main as reported (April 2026)",
    bug_class="loss normalization under PP",
    contract="training-step", property="grad_norm",
    bug=BUG, fixed=FIXED,
    summary="under PP the backward runs on the raw summed loss: gradients global-token-count times too large",
    reproduction="plain torch re-creation",
    options={"layout": "pp=2"},
)
