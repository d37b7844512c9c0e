"""Attention split by heads (GQA groups kept whole) under tensor parallelism: public path of
:mod:`distcheck.parallel.tp.attention`."""

from distcheck.parallel.tp.attention import *  # noqa: F403
from distcheck.parallel.tp.attention import __all__ as __all__
