"""Transitional: the driver helpers ``runners/pipelining.py`` imports, at their old path, until
pipelining moves into ``distcheck/parallel/pp/``; then delete this module.

They live in :mod:`distcheck.engine.drivers` (rows, guarded runs, failure lines) and
:mod:`distcheck.runners.worlds` (:func:`iter_pools`); ``ByteCounter`` is
:mod:`distcheck.engine.collectives` and the ring-collective checks are
:mod:`distcheck.parallel.comm.checks`.
"""

from distcheck.engine.drivers import result_row, run_guarded, skip_row
from distcheck.runners.worlds import iter_pools

__all__ = ["iter_pools", "result_row", "run_guarded", "skip_row"]
