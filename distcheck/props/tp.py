"""Tensor-parallel properties: public path of :mod:`distcheck.parallel.tp.properties`."""

from distcheck.parallel.tp.properties import *  # noqa: F403
from distcheck.parallel.tp.properties import __all__ as __all__
