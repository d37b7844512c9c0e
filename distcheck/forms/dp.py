"""Closed forms for data parallelism (sympy).

Gradient weights: under DDP's plain mean of shard means, an example in shard
``k`` (``n_k`` examples, ``dp`` shards) contributes with weight ``1/(dp n_k)``;
the full-batch mean gives every example ``1/n``. The two agree for every
example exactly when all shards are equal (``n = dp n_k``).
"""

from __future__ import annotations

from distcheck.closed_form import ClosedForm, Input, register

__all__ = ["PLAIN_MEAN_WEIGHT", "EXACT_WEIGHT"]

_dp = Input("dp", "data-parallel ranks (shards)", unit="GPUs")
_n_k = Input("n_k", "examples in the example's shard k", unit="examples")
_n = Input("n", "examples in the global batch (sum of n_k)", unit="examples")

PLAIN_MEAN_WEIGHT = register(
    ClosedForm(
        name="dp.plain_mean_weight",
        expr=1 / (_dp.symbol * _n_k.symbol),
        inputs=(_dp, _n_k),
        unit="fraction",
        source="lesson (seed 000), 'Data parallelism is exact' and the unequal-shard exercise",
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
        source="lesson (seed 000), 'Data parallelism is exact': the full-batch mean loss",
        description="weight of one example in the full-batch mean gradient (and in the example-weighted all-reduce): 1/n",
        constraints=("n = sum of n_k over shards",),
    )
)
