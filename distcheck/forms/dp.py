"""Closed forms of data parallelism and gradient accumulation (shard weights, shard sizes, the plain mean's
error): public path of :mod:`distcheck.parallel.dp.forms`."""

from distcheck.parallel.dp.forms import *  # noqa: F403
from distcheck.parallel.dp.forms import __all__ as __all__
