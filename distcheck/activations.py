"""Activation memory per transformer layer, tensor by tensor (Korthikanti et al. 2022): public path of
:mod:`distcheck.parallel.activations.reference`."""

from distcheck.parallel.activations.reference import *  # noqa: F403
from distcheck.parallel.activations.reference import __all__ as __all__
