"""Closed forms of ZeRO (bytes per GPU per stage, communication per rank; Rajbhandari et al. 2020): public
path of :mod:`distcheck.parallel.zero.forms`."""

from distcheck.parallel.zero.forms import *  # noqa: F403
from distcheck.parallel.zero.forms import __all__ as __all__
