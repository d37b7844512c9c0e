"""Mutants of data parallelism and gradient accumulation.

===========================  ===========================================  ===================================
mutant                       mistake                                      killed by
===========================  ===========================================  ===================================
dp.plain_mean_unequal        plain mean of shard means over unequal       dp.unequal_shards.weighted
                             shards (the lesson: error 0.067, 60 on 8)
accumulation.mean_of_means   a mean per micro-batch, then the mean of     accumulation.tokens.split_invariant
                             those means
===========================  ===========================================  ===================================
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from distcheck.engine.mutants import mutant

__all__ = ["plain_mean_unequal", "mean_of_means"]


@mutant("dp.plain_mean_unequal", "dp.unequal_shards.weighted")
def plain_mean_unequal(grads, sizes):
    """Plain mean of the shard-mean gradients, ignoring unequal shard sizes (what DDP does)."""
    return sum(grads[1:], grads[0]) / len(grads)


@mutant("accumulation.mean_of_means", "accumulation.tokens.split_invariant")
def mean_of_means(grad_fn_sum, params, X, y, microbatch_sizes, mask=None):
    """Per-micro-batch mean loss (over its own tokens), then the mean over micro-batches."""
    bounds = np.cumsum([0, *microbatch_sizes])
    means = []
    for lo, hi in pairwise(bounds):
        if mask is None:
            means.append(grad_fn_sum(params, X[lo:hi], y[lo:hi]) / (hi - lo))
        else:
            means.append(grad_fn_sum(params, X[lo:hi], y[lo:hi], mask[lo:hi]) / np.sum(mask[lo:hi]))
    return sum(means[1:], means[0]) / len(means)
