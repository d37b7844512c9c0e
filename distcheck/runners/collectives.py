"""Transitional: the driver helpers at their old path, for the real-backend drivers that are still
in ``distcheck/runners/`` (pipelining). They live in :mod:`distcheck.engine.drivers`
(rows, guarded runs, failure lines), :mod:`distcheck.runners.worlds` (:func:`iter_pools`) and
:mod:`distcheck.engine.collectives` (``ByteCounter``); the ring-collective checks are
:mod:`distcheck.parallel.comm.checks`. Delete this module when the last driver has moved.
"""

from distcheck.engine.collectives import ByteCounter
from distcheck.engine.drivers import (
    FAILURE_DETAIL_CHARS,
    describe_failure,
    exception_line,
    is_world,
    result_row,
    run_guarded,
    skip_row,
)
from distcheck.runners.worlds import iter_pools

__all__ = ["FAILURE_DETAIL_CHARS", "ByteCounter", "chunk_bounds", "describe_failure", "exception_line", "is_world",
           "iter_pools", "result_row", "run_guarded", "skip_row"]


def chunk_bounds(count: int, n: int) -> list[tuple[int, int]]:
    """numpy.array_split bounds: the first ``count % n`` chunks get one extra element."""
    from distcheck.engine.contracts.layer import split_bounds

    return split_bounds(count, n, "array_split")
