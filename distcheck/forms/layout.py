"""Closed forms of 3D layouts (world size, group counts, coordinates): public path of
:mod:`distcheck.parallel.layout.forms`."""

from distcheck.parallel.layout.forms import *  # noqa: F403
from distcheck.parallel.layout.forms import __all__ as __all__
