"""Closed forms of tensor parallelism (shards, collective counts, communication per layer): public path
of the ``tp.*`` forms of :mod:`distcheck.parallel.tp.forms`."""

from distcheck.parallel.tp.forms import (
    ATTENTION_ALLREDUCE_PER_FORWARD,
    COMM_BYTES_PER_LAYER,
    COMM_ELEMENTS_PER_LAYER,
    INPUT_ROWS_PER_SHARD,
    MLP_ALLREDUCE_PER_FORWARD,
    OUTPUT_COLS_PER_SHARD,
    ROW_ALLREDUCE_COUNT,
)

__all__ = [
    "OUTPUT_COLS_PER_SHARD",
    "INPUT_ROWS_PER_SHARD",
    "ROW_ALLREDUCE_COUNT",
    "MLP_ALLREDUCE_PER_FORWARD",
    "ATTENTION_ALLREDUCE_PER_FORWARD",
    "COMM_ELEMENTS_PER_LAYER",
    "COMM_BYTES_PER_LAYER",
]
