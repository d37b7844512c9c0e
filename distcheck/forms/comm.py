"""Closed forms of the bytes each rank sends per collective (``comm.bytes_per_rank.*``): public path of
:mod:`distcheck.parallel.comm.forms`."""

from distcheck.parallel.comm.forms import *  # noqa: F403
from distcheck.parallel.comm.forms import __all__ as __all__
