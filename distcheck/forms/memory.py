"""Closed forms of training-state memory (bytes per parameter conventions, per-GPU bytes, GPU counts):
public path of :mod:`distcheck.parallel.memory.forms`."""

from distcheck.parallel.memory.forms import *  # noqa: F403
from distcheck.parallel.memory.forms import __all__ as __all__
