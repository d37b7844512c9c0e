"""ZeRO properties: public path of :mod:`distcheck.parallel.zero.properties`."""

from distcheck.parallel.zero.properties import *  # noqa: F403
from distcheck.parallel.zero.properties import __all__ as __all__
