"""Public path of the exactness rules: :mod:`distcheck.core.exactness` (bitwise where the
inputs make it exact, else a bound derived from the operation)."""

from distcheck.core.exactness import *  # noqa: F403
from distcheck.core.exactness import __all__ as __all__
