"""allenai/open-instruct#1498: "Fix ZeRO-2 discarding gradients during manual accumulation".

With ``gradient_accumulation_steps=1`` in the DeepSpeed config while the loop accumulated several micro-batches
itself, every ``backward()`` was an accumulation boundary, and ZeRO-2's epilogue (``stage_1_and_2.py``) resets its
gradient accumulator at each boundary: only the last micro-batch's gradient reached ``step()``, silently (ZeRO-3,
counting micro-steps, was unaffected). Re-created in plain torch: under dp_shard = 2 (FSDP2's sharded gradients,
ZeRO-2's partitioning), the ``backward`` hook drops the sharded gradients accumulated so far before each
micro-batch's backward, so the step sees the last micro-batch's gradient only; the twin accumulates them all."""

from __future__ import annotations

from distcheck.parallel.step.hooks import StepTarget
from distcheck.zoo import Entry
from zoo._step import FIXED, parallelize


def backward_resetting_accumulator(loss, model, info):
    """Every backward is a boundary: the gradients accumulated so far are dropped before it."""
    for p in model.parameters():
        p.grad = None
    loss.backward()


BUG = StepTarget(parallelize, backward=backward_resetting_accumulator, axes=("dp_replicate", "dp_shard", "tp"))

ENTRY = Entry(
    reference="allenai/open-instruct#1498",
    url="https://github.com/allenai/open-instruct/pull/1498",
    library="open-instruct on DeepSpeed ZeRO-2", versions="before February 2026",
    bug_class="gradient accumulation under ZeRO-2: the accumulator reset at every boundary",
    contract="training-step", property="params",
    bug=BUG, fixed=FIXED,
    summary="only the last micro-batch's gradient reaches the optimizer step",
    reproduction="plain torch re-creation",
    options={"layout": "dp_shard=2"},
)
