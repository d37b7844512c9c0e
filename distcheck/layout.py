"""3D parallel layouts (ParallelConfig, coordinates, rank groups, node locality): public path of
:mod:`distcheck.parallel.layout.reference`."""

from distcheck.parallel.layout.reference import *  # noqa: F403
from distcheck.parallel.layout.reference import __all__ as __all__  # noqa: F401
