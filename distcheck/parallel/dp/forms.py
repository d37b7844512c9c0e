"""Closed forms for data parallelism (sympy).

Gradient weights: under DDP's plain mean of shard means, an example in shard
``k`` (``n_k`` examples, ``dp`` shards) contributes with weight ``1/(dp n_k)``;
the full-batch mean gives every example ``1/n``. The two agree for every
example exactly when all shards are equal (``n = dp n_k``); their difference
``1/(dp n_k) - 1/n`` is the coefficient of shard ``k``'s gradient sum in the
plain mean's error (lesson, DP section). Shards follow ``np.array_split``:
rank ``k`` of ``dp`` gets ``floor((n + dp - 1 - k)/dp)`` examples.

Gradient accumulation over ``m`` micro-batches with ``c_i`` examples (or valid
tokens) each: normalising the summed gradient by the step's total
``C = sum_i c_i`` gives every example (token) weight ``1/C``, whatever the
split; averaging per-micro-batch means gives the ones of micro-batch ``i``
weight ``1/(m c_i)``, which depends on the split unless all ``c_i`` are equal.
"""

from __future__ import annotations

import sympy as sp

from distcheck.core.closed_form import ClosedForm, Input, register

__all__ = [
    "PLAIN_MEAN_WEIGHT",
    "EXACT_WEIGHT",
    "SHARD_SIZE",
    "PLAIN_MEAN_ERROR_COEFFICIENT",
    "ACCUMULATION_WEIGHT_NORMALIZED",
    "ACCUMULATION_WEIGHT_PER_MICROBATCH_MEAN",
]

_dp = Input("dp", "data-parallel ranks (shards)", unit="GPUs")
_n_k = Input("n_k", "examples in the example's shard k", unit="examples")
_n = Input("n", "examples in the global batch (sum of n_k)", unit="examples")

PLAIN_MEAN_WEIGHT = register(
    ClosedForm(
        name="dp.plain_mean_weight",
        expr=1 / (_dp.symbol * _n_k.symbol),
        inputs=(_dp, _n_k),
        unit="fraction",
        source="lesson 'Scaling and distributed training', 'Data parallelism is exact' and the unequal-shard exercise",
        description="weight of one example of shard k in the plain mean of dp shard-mean gradients: 1/(dp*n_k)",
        constraints=("n_k >= 1",),
    )
)

EXACT_WEIGHT = register(
    ClosedForm(
        name="dp.exact_weight",
        expr=1 / _n.symbol,
        inputs=(_n,),
        unit="fraction",
        source="lesson 'Scaling and distributed training', 'Data parallelism is exact': the full-batch mean loss",
        description="weight of one example in the full-batch mean gradient "
                    "(and in the example-weighted all-reduce): 1/n",
        constraints=("n = sum of n_k over shards",),
    )
)

_rank = Input("rank", "data-parallel rank (shard index), 0-based", unit="", kind="nonnegative_integer", default=0)

SHARD_SIZE = register(
    ClosedForm(
        name="dp.shard_size",
        expr=sp.floor((_n.symbol + _dp.symbol - 1 - _rank.symbol) / _dp.symbol),
        inputs=(_n, _dp, _rank),
        unit="count",
        source="numpy.array_split convention (the first n % dp shards get one extra); "
               "lesson 'Scaling and distributed training', data_parallel_grad",
        description="examples on rank `rank` when n examples are split over dp ranks: floor((n + dp - 1 - rank)/dp)",
        constraints=("0 <= rank < dp <= n",),
    )
)

PLAIN_MEAN_ERROR_COEFFICIENT = register(
    ClosedForm(
        name="dp.plain_mean_error_coefficient",
        expr=1 / (_dp.symbol * _n_k.symbol) - 1 / _n.symbol,
        inputs=(_dp, _n_k, _n),
        unit="fraction",
        source="lesson 'Scaling and distributed training', 'Data parallelism is exact' and the unequal-shard "
               "exercise: plain mean minus full-batch mean",
        description="coefficient of shard k's gradient SUM in (plain mean of shard means - full-batch gradient): "
        "1/(dp*n_k) - 1/n; zero for every shard exactly when all shards are equal",
        constraints=("n = sum of n_k over the dp shards",),
    )
)

_total = Input("total", "examples (or valid tokens) in the whole step: sum of c_i over micro-batches", unit="examples")
_m = Input("m", "micro-batches accumulated in one step", unit="micro-batches")
_c_i = Input("count", "examples (or valid tokens) in the example's micro-batch i: c_i", unit="examples")

ACCUMULATION_WEIGHT_NORMALIZED = register(
    ClosedForm(
        name="dp.accumulation_weight.normalized",
        expr=1 / _total.symbol,
        inputs=(_total,),
        unit="fraction",
        source="derived: the full-batch mean over examples (or valid tokens) is sum_i G_i / sum_i c_i for any "
               "split (lesson 'Scaling and distributed training', 'Global batch size' mentions accumulation)",
        description="weight of one example (or valid token) when accumulated gradient sums are divided by the step's "
        "total count: 1/total, independent of the micro-batch split",
        constraints=("total = sum of c_i over micro-batches",),
    )
)

ACCUMULATION_WEIGHT_PER_MICROBATCH_MEAN = register(
    ClosedForm(
        name="dp.accumulation_weight.per_microbatch_mean",
        expr=1 / (_m.symbol * _c_i.symbol),
        inputs=(_m, _c_i),
        unit="fraction",
        source="derived: (1/m) sum_i G_i / c_i, the common accumulation bug when micro-batches hold different "
               "token counts",
        description="weight of one example (or valid token) of micro-batch i under the mean of m per-micro-batch "
        "means: 1/(m*c_i); equals 1/total only when every c_i is equal",
        constraints=("count >= 1",),
    )
)
