"""3D-layout properties: public path of :mod:`distcheck.parallel.layout.properties`."""

from distcheck.parallel.layout.properties import *  # noqa: F403
from distcheck.parallel.layout.properties import __all__ as __all__
