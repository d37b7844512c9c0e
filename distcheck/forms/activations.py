"""Closed forms of activation memory (Korthikanti et al. 2022, Table 2): public path of
:mod:`distcheck.parallel.activations.forms`."""

from distcheck.parallel.activations.forms import *  # noqa: F403
from distcheck.parallel.activations.forms import __all__ as __all__
