"""accelerate's guide, "Gradient accumulation on training samples of variable size": the basic loop.

accelerate's basic accumulation loop (``Accelerator.accumulate``, a mean-reduced cross-entropy per
micro-batch, ``Accelerator.backward`` dividing by gradient_accumulation_steps, DDP averaging the ranks) weighs
a token of a micro-batch with n_k tokens 1 / (dp m n_k) instead of 1 / T; the guide's token-weighted loop is the
fix. This entry runs accelerate's own code (``distcheck.libs.targets.accelerate``: needs the ``libs`` extra),
under DDP (dp_replicate = 2)."""

from __future__ import annotations

from distcheck.zoo import Entry

ENTRY = Entry(
    reference="docs: accelerate, Performing gradient accumulation, variable-size samples",
    url="https://huggingface.co/docs/accelerate/usage_guides/gradient_accumulation",
    library="accelerate", versions="1.16.0 (checked)",
    bug_class="loss normalization under DP and gradient accumulation",
    contract="training-step", property="params",
    bug="distcheck.libs.targets.accelerate:GA_MEAN_LOSS", fixed="distcheck.libs.targets.accelerate:GA_TOKEN_SUM",
    summary="the mean of per-micro-batch, per-rank means instead of the step's token mean",
    reproduction="library code",
    requires=("accelerate",),
)
