"""Tensor parallelism, numpy references (column/row-parallel linear, Megatron MLP, SwiGLU, layer norm,
sharded layer norm): public path of :mod:`distcheck.parallel.tp.reference`."""

from distcheck.parallel.tp.reference import *  # noqa: F403
from distcheck.parallel.tp.reference import __all__ as __all__
