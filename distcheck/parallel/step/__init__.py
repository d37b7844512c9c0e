"""A whole training step under composed parallelism: FSDP2 (``dp_shard``) x HSDP replicas
(``dp_replicate``) x tensor parallelism (``tp``) x gradient accumulation, with the token-mean loss,
grad-norm clipping and the AdamW state, against the single-device float64 step.

- ``reference``: numpy references: the global token-mean loss under dp x gradient accumulation, the
  global grad norm from any sharding (replicated parameters counted once), torch's clipping
  coefficient, the bytes each composition communicates per step (``StepLayout``, ``Placement``);
- ``forms``: ``step.loss.token_weight``, ``step.loss.mean_of_means_weight``, ``step.grad_norm.copies``,
  ``step.clip.scale``, ``step.comm_bytes_per_rank.{dp,tp}``;
- ``proofs``: the step's bytes are ZeRO-3's and sequence parallelism's, the token weight is the mean of
  means' exactly on equal micro-batches;
- ``strategies``, ``properties``, ``mutants``: the step's reductions on simulated worlds, and one mutant
  per public bug class (the local shard's norm, tp-replicated parameters counted tp times, the mean of
  per-micro-batch means, gradients scaled by the world size, norm gradients not summed across tp, the
  loss of rank 0's shard);
- ``model``: the tiny Llama-style decoder (torch, built on first use);
- ``contracts`` (+ ``harness``, the rank side): the ``training-step`` contract, whose target is a
  torchtitan-style ``parallelize(model, mesh, layout) -> model`` or a :class:`~.hooks.StepTarget`;
- ``hooks``: the step's overridable hooks (loss, reported loss, grad-norm clipping) and their defaults.

Sources: Rajbhandari et al. 2020, "ZeRO" (§7); Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models" (§4.2.2); torch's ``clip_grad_norm_`` and FSDP2
``fully_shard``; torchtitan's ``parallelize_llama`` and ``ParallelDims``; the public bug reports
pytorch/torchtitan#596, pytorch/pytorch#170862, meta-pytorch/torchtune#2420 and Hugging Face's
"Fixing Gradient Accumulation" (2024).

Public path: :mod:`distcheck.parallel.step`; importing it imports nothing (names load on first use).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["StepLayout", "Placement", "token_mean_loss", "global_grad_norm", "sharded_grad_norm", "clip_scale",
           "step_comm_bytes", "TinyConfig", "build_model", "StepTarget", "TrainingStep"]

_HOME = {"StepLayout": "reference", "Placement": "reference", "token_mean_loss": "reference",
         "global_grad_norm": "reference", "sharded_grad_norm": "reference", "clip_scale": "reference",
         "step_comm_bytes": "reference", "TinyConfig": "model", "build_model": "model", "StepTarget": "hooks",
         "TrainingStep": "contracts"}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
