"""Simulated collectives and the bytes each rank sends (nccl-tests conventions): public path of
:mod:`distcheck.parallel.comm.reference` (which re-exports :mod:`distcheck.parallel.comm.ideal`)."""

from distcheck.parallel.comm.reference import *  # noqa: F403
from distcheck.parallel.comm.reference import __all__ as __all__  # noqa: F401
