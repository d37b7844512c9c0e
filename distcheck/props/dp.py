"""Data-parallel properties (``dp.*``): public path of :mod:`distcheck.parallel.dp.properties`."""

from distcheck.parallel.dp.properties import (
    any_shards_bounded,
    equal_shards_bitwise,
    plain_combine,
    plain_mean_bias,
    unequal_shards_weighted,
    weighted_combine,
)

__all__ = [
    "weighted_combine", "plain_combine", "equal_shards_bitwise", "unequal_shards_weighted", "plain_mean_bias",
    "any_shards_bounded",
]
