"""Mutants of data parallelism and gradient accumulation.

===========================  ===========================================  ===================================
mutant                       mistake                                      killed by
===========================  ===========================================  ===================================
dp.plain_mean_unequal        plain mean of shard means over unequal       dp.unequal_shards.weighted
                             shards (the lesson: error 0.067, 60 on 8)
accumulation.mean_of_means   a mean per micro-batch, then the mean of     accumulation.tokens.split_invariant
                             those means
dp.sum_not_mean              the shard gradients all-reduced (summed) but  dp.equal_shards.bitwise
                             never divided by the world size
dp.mean_over_examples        the plain mean's sum of shard means divided   dp.unequal_shards.plain_mean_bias
                             by the example count, not the rank count
dp.weighted_sum_over_ranks   the example-weighted sum divided by the       dp.any_shards.bounded
                             rank count instead of the example count
accumulation.tokens_for_     example-normalised accumulation divided by    accumulation.examples.split_invariant
examples                     the token count (sequences x length)
===========================  ===========================================  ===================================
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any

import numpy as np

from distcheck.engine.mutants import mutant

__all__ = ["plain_mean_unequal", "mean_of_means", "sum_not_mean", "mean_over_examples", "weighted_sum_over_ranks",
           "token_count_for_examples"]


@mutant("dp.plain_mean_unequal", "dp.unequal_shards.weighted")
def plain_mean_unequal(grads: Sequence[np.ndarray], sizes: Sequence[int]) -> np.ndarray:
    """Plain mean of the shard-mean gradients, ignoring unequal shard sizes (what DDP does)."""
    return sum(grads[1:], grads[0]) / len(grads)


@mutant("accumulation.mean_of_means", "accumulation.tokens.split_invariant")
def mean_of_means(grad_fn_sum: Callable[..., np.ndarray], params: Any, X: np.ndarray, y: np.ndarray,
                  microbatch_sizes: Sequence[int], mask: np.ndarray | None = None) -> np.ndarray:
    """Per-micro-batch mean loss (over its own tokens), then the mean over micro-batches."""
    bounds = np.cumsum([0, *microbatch_sizes])
    means = []
    for lo, hi in pairwise(bounds):
        if mask is None:
            means.append(grad_fn_sum(params, X[lo:hi], y[lo:hi]) / (hi - lo))
        else:
            means.append(grad_fn_sum(params, X[lo:hi], y[lo:hi], mask[lo:hi]) / np.sum(mask[lo:hi]))
    return sum(means[1:], means[0]) / len(means)


@mutant("dp.sum_not_mean", "dp.equal_shards.bitwise")
def sum_not_mean(grads: Sequence[np.ndarray], sizes: Sequence[int]) -> np.ndarray:
    """The shard gradients all-reduced with SUM and never divided by the world size."""
    return sum(grads[1:], grads[0])


@mutant("dp.mean_over_examples", "dp.unequal_shards.plain_mean_bias")
def mean_over_examples(grads: Sequence[np.ndarray], sizes: Sequence[int]) -> np.ndarray:
    """A plain mean whose sum of shard-mean gradients is divided by the example count, not the rank count."""
    return sum(grads[1:], grads[0]) / sum(sizes)


@mutant("dp.weighted_sum_over_ranks", "dp.any_shards.bounded")
def weighted_sum_over_ranks(grads: Sequence[np.ndarray], sizes: Sequence[int]) -> np.ndarray:
    """The example-weighted sum sum_k n_k g_k divided by the number of ranks instead of the examples."""
    return sum((n * g for g, n in zip(grads, sizes, strict=True)), np.zeros_like(grads[0])) / len(grads)


@mutant("accumulation.tokens_for_examples", "accumulation.examples.split_invariant")
def token_count_for_examples(grad_fn_sum: Callable[..., np.ndarray], params: Any, X: np.ndarray, y: np.ndarray,
                             microbatch_sizes: Sequence[int], mask: np.ndarray | None = None) -> np.ndarray:
    """Example-normalised accumulation that divides the summed gradient by the token count
    (sequences x sequence length) instead of the number of sequences."""
    bounds = np.cumsum([0, *microbatch_sizes])
    total = sum(grad_fn_sum(params, X[lo:hi], y[lo:hi]) for lo, hi in pairwise(bounds))
    return total / (X.shape[0] * X.shape[1])
