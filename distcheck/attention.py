"""Attention split by heads (GQA groups kept whole) under tensor parallelism: public path of
:mod:`distcheck.parallel.tp.heads`."""

from distcheck.parallel.tp.heads import *  # noqa: F403
from distcheck.parallel.tp.heads import __all__ as __all__  # noqa: F401
