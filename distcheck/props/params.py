"""Parameter-count properties: public path of :mod:`distcheck.parallel.params.properties`."""

from distcheck.parallel.params.properties import *  # noqa: F403
from distcheck.parallel.params.properties import __all__ as __all__
