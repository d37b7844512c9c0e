"""Communication-volume properties: public path of :mod:`distcheck.parallel.comm.properties`."""

from distcheck.parallel.comm.properties import *  # noqa: F403
from distcheck.parallel.comm.properties import __all__ as __all__
