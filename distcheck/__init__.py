"""distcheck: certify the mathematics and the implementations of distributed training.

The core (references in numpy, closed forms in sympy, Hypothesis strategies) imports
without torch; only :mod:`distcheck.runners` imports torch, lazily. Every public name has one import path: the
errors are :mod:`distcheck.core.errors`, a parallelism's API is its package ``distcheck.parallel.<name>``.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
