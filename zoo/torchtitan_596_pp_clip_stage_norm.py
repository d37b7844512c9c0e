"""pytorch/torchtitan#596: gradient clipping under pipeline parallelism.

torchtitan's train.py called ``torch.nn.utils.clip_grad_norm_`` on each pipeline stage's module: every
parameter DTensor carries placements for FSDP and tp, none for pp, so the norm is the stage's own and each stage
clips with a different factor (fixed by pytorch/torchtitan#649: the stages' squared norms all-reduced over the pp
group). Re-created in plain torch: torch's own ``clip_grad_norm_`` on a stage, under pp = 2."""

from __future__ import annotations

from distcheck.parallel.step.hooks import StepTarget
from distcheck.zoo import Entry
from zoo._step import FIXED, parallelize


def stage_local_clip(parameters, max_norm, info):
    """torch's ``clip_grad_norm_`` as it is, on this pipeline stage's parameters only."""
    import torch

    return torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)


BUG = StepTarget(parallelize, clip_grad_norm=stage_local_clip)

ENTRY = Entry(
    reference="pytorch/torchtitan#596",
    url="https://github.com/pytorch/torchtitan/issues/596",
    library="torchtitan", versions="before pytorch/torchtitan#649 (October 2024)",
    bug_class="gradient clipping under PP",
    contract="training-step", property="grad_norm",
    bug=BUG, fixed=FIXED,
    summary="clip_grad_norm_ on a pipeline stage returns and clips with that stage's norm, not the model's",
    reproduction="plain torch re-creation",
    options={"layout": "pp=2"},
)
