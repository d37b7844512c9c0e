"""modelscope/FunASR#3472: "align DDP no_sync with gradient accumulation".

The trainer entered ``model.no_sync()`` when ``batch_idx % accum_grad != 0``: the first micro-batch of each
step was all-reduced and the later ones, the optimizer-step micro-batch included, were not, so every rank
stepped with its own accumulated gradient (4.0 against 7.0 in the PR's two-rank reproduction) and the
replicas drifted apart; the fix syncs on ``(batch_idx + 1) % accum_grad == 0``. Re-created in plain torch on
torch's DDP (dp_replicate = 2): ``no_sync()`` on every micro-batch but the first."""

from __future__ import annotations

import contextlib

from distcheck.parallel.step.hooks import StepTarget
from distcheck.parallel.step.plans import ddp
from distcheck.zoo import Entry


def sync_first_microbatch(model, info):
    """``no_sync()`` unless this is the step's first micro-batch (the reported condition)."""
    return model.no_sync() if info.microbatch % info.num_microbatches != 0 else contextlib.nullcontext()


def sync_last_microbatch(model, info):
    """``no_sync()`` on every micro-batch but the last (the fix)."""
    return model.no_sync() if (info.microbatch + 1) % info.num_microbatches != 0 else contextlib.nullcontext()


BUG = StepTarget(ddp, accumulate=sync_first_microbatch, axes=("dp_replicate",))
FIXED = StepTarget(ddp, accumulate=sync_last_microbatch, axes=("dp_replicate",))

ENTRY = Entry(
    reference="modelscope/FunASR#3472",
    url="https://github.com/modelscope/FunASR/pull/3472",
    library="FunASR (trainer_ds.py, torch DDP)", versions="main before August 2026",
    bug_class="gradient accumulation under DP: the last micro-batch not synchronized",
    contract="training-step", property="params",
    bug=BUG, fixed=FIXED,
    summary="the optimizer-step micro-batch runs under no_sync: each replica steps with its own gradient",
    reproduction="plain torch re-creation",
    examples=8,
)
