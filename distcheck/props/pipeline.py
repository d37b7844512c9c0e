"""Pipeline properties: public path of :mod:`distcheck.parallel.pp.properties`."""

from distcheck.parallel.pp.properties import *  # noqa: F403
from distcheck.parallel.pp.properties import __all__ as __all__
