"""Public path of the Hypothesis settings profiles (dev, ci, thorough): :mod:`distcheck.engine.profiles`.

Importing it imports neither Hypothesis, torch, sympy nor numpy (the pytest plugin imports it
when pytest starts)."""

from distcheck.engine.profiles import *  # noqa: F403
from distcheck.engine.profiles import __all__ as __all__
