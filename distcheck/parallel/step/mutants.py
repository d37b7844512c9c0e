"""Mutants of the step's reductions, one per public bug class (the torch targets carrying the same mistakes
are in ``examples/step_mutants.py``, certified under the ``training-step`` contract).

==================================  ====================================================  =========================
mutant                              mistake (public report)                               killed by
==================================  ====================================================  =========================
step.norm_of_local_stage            the grad norm of pipeline stage 0 only                step.grad_norm.global
                                    (pytorch/torchtitan#596)
step.norm_of_local_shard            the grad norm of rank 0's FSDP / tp shards only       step.grad_norm.global
                                    (pytorch/pytorch#170862)
step.norm_tp_replicated_tp_times    tp-replicated parameters counted tp times             step.grad_norm.global
                                    (meta-pytorch/torchtune#2420)
step.mean_of_microbatch_means       the mean of per-micro-batch means (transformers'      step.loss.token_mean
                                    gradient-accumulation loss, 2024)
step.loss_of_rank0_shard            the loss reported from rank 0's shard only            step.loss.token_mean
step.grads_scaled_by_world_size     gradients scaled by the world size instead of the     step.grads.dp_scale
                                    dp size (meta-pytorch/torchtune#2420)
step.norm_weight_not_summed_tp      replicated norm-weight gradients not summed across    step.grads.norm_weight_tp
                                    tp (sequence parallelism)
step.clip_without_clamp             max_norm / (norm + eps) applied above 1               step.clip.scale
step.tokens_with_padding            padded positions counted as tokens                    step.tokens.total
==================================  ====================================================  =========================
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from distcheck.core.vocab import Axis
from distcheck.engine.mutants import mutant
from distcheck.parallel.step.reference import Placement, StepLayout, copies

__all__ = ["norm_of_local_stage", "norm_of_local_shard", "norm_tp_replicated_tp_times", "mean_of_microbatch_means",
           "loss_of_rank0_shard", "grads_scaled_by_world_size", "norm_weight_not_summed_tp", "clip_without_clamp",
           "tokens_with_padding"]


def _norm(shards: Sequence[Sequence[np.ndarray | None]], placements: Sequence[Placement], layout: StepLayout,
          keep: Callable[[dict], bool], divisor: Callable[[Placement, StepLayout], int]) -> float:
    total = 0.0
    for r, rank_shards in enumerate(shards):
        if not keep(layout.coordinates(r)):
            continue
        for g, p in zip(rank_shards, placements, strict=True):
            if g is not None:
                total += float(np.sum(np.square(g))) / divisor(p, layout)
    return float(np.sqrt(total))


@mutant("step.norm_of_local_stage", "step.grad_norm.global")
def norm_of_local_stage(shards: Sequence[Sequence[np.ndarray | None]], placements: Sequence[Placement],
                        layout: StepLayout) -> float:
    """The norm over pipeline stage 0's ranks only (every shard of the stage, replicas counted once)."""
    return _norm(shards, placements, layout, lambda c: c[Axis.PP] == 0, copies)


@mutant("step.norm_of_local_shard", "step.grad_norm.global")
def norm_of_local_shard(shards: Sequence[Sequence[np.ndarray | None]], placements: Sequence[Placement],
                        layout: StepLayout) -> float:
    """The norm of rank 0's local shards, never all-reduced."""
    return _norm(shards, placements, layout, lambda c: not any(c.values()), lambda p, lay: 1)


@mutant("step.norm_tp_replicated_tp_times", "step.grad_norm.global")
def norm_tp_replicated_tp_times(shards: Sequence[Sequence[np.ndarray | None]], placements: Sequence[Placement],
                                layout: StepLayout) -> float:
    """Local squares summed over dp_shard, tp and pp without dividing a tp-replicated parameter by tp."""
    return _norm(shards, placements, layout, lambda c: c[Axis.DP_REPLICATE] == 0, lambda p, lay: 1)


@mutant("step.mean_of_microbatch_means", "step.loss.token_mean")
def mean_of_microbatch_means(losses: Sequence[Sequence[np.ndarray]], masks: Sequence[Sequence[np.ndarray]]) -> float:
    """Each micro-batch's token mean, averaged over the micro-batches and dp ranks."""
    means = [float(np.sum(lk[mk])) / int(np.count_nonzero(mk)) for rl, rm in zip(losses, masks, strict=True)
             for lk, mk in zip(rl, rm, strict=True)]
    return sum(means) / len(means)


@mutant("step.loss_of_rank0_shard", "step.loss.token_mean")
def loss_of_rank0_shard(losses: Sequence[Sequence[np.ndarray]], masks: Sequence[Sequence[np.ndarray]]) -> float:
    """The token mean of dp rank 0's micro-batches only (what rank 0 logs without an all-reduce)."""
    kept = sum(float(np.sum(lk[mk])) for lk, mk in zip(losses[0], masks[0], strict=True))
    return kept / sum(int(np.count_nonzero(mk)) for mk in masks[0])


@mutant("step.grads_scaled_by_world_size", "step.grads.dp_scale")
def grads_scaled_by_world_size(layout: StepLayout) -> int:
    """The loss factor is the world size (tp and pp ranks included) instead of dp."""
    return layout.world_size


@mutant("step.norm_weight_not_summed_tp", "step.grads.norm_weight_tp")
def norm_weight_not_summed_tp(partials: Sequence[np.ndarray], layout: StepLayout) -> np.ndarray:
    """Each tp rank keeps its own partial gradient of the replicated norm weight (rank 0's shown)."""
    return partials[0]


@mutant("step.clip_without_clamp", "step.clip.scale")
def clip_without_clamp(norm: float, max_norm: float) -> float:
    """``max_norm / (norm + 1e-6)`` even when it exceeds 1 (the gradients scaled up)."""
    return max_norm / (norm + 1e-6)


@mutant("step.tokens_with_padding", "step.tokens.total")
def tokens_with_padding(masks: Sequence[Sequence[Any]]) -> int:
    """Every position counted, the padding's included."""
    return sum(int(np.size(m)) for rank in masks for m in rank)
