"""Training-state memory per GPU (bytes per parameter, TP/PP splits, GPU counts): public path of
:mod:`distcheck.parallel.memory.reference`."""

from distcheck.parallel.memory.reference import *  # noqa: F403
from distcheck.parallel.memory.reference import __all__ as __all__
