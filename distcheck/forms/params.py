"""Closed forms of parameter counts (``params.decoder_only`` and its components): public path of
:mod:`distcheck.parallel.params.forms`."""

from distcheck.parallel.params.forms import *  # noqa: F403
from distcheck.parallel.params.forms import __all__ as __all__
