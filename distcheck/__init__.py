"""distcheck: certify the mathematics and the implementations of distributed training.

The core (references in numpy, closed forms in sympy, Hypothesis strategies) imports
without torch; only :mod:`distcheck.runners` imports torch, lazily.
"""

__version__ = "0.1.0"

from distcheck.core.errors import ConfigError, DistcheckError

__all__ = ["__version__", "ConfigError", "DistcheckError"]
