"""Public path of the input checks: :mod:`distcheck.core.validate`, re-exported whole."""

from distcheck.core.validate import *  # noqa: F403
from distcheck.core.validate import __all__ as __all__
