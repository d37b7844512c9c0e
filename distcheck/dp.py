"""Data parallelism and gradient accumulation (numpy references): public path of
:mod:`distcheck.parallel.dp.reference` and :mod:`distcheck.parallel.dp.accumulation`."""

from distcheck.parallel.dp import accumulation as _accumulation
from distcheck.parallel.dp import reference as _reference
from distcheck.parallel.dp.accumulation import *  # noqa: F403
from distcheck.parallel.dp.reference import *  # noqa: F403

__all__ = [*_reference.__all__, *_accumulation.__all__]
