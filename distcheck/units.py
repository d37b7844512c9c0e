"""Public path of the byte units: :mod:`distcheck.core.units` (GB = 1e9 bytes, GiB = 2**30 bytes)."""

from distcheck.core.units import *  # noqa: F403
from distcheck.core.units import __all__ as __all__
