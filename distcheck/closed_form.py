"""Public path of the closed forms: named sympy formulas with their sources, and the catalogue.

``get(name)`` and ``catalogue()`` find every parallelism package's ``forms`` module first
(:mod:`distcheck.engine.catalogue`); :class:`ClosedForm`, :class:`Input` and ``register``
are :mod:`distcheck.core.closed_form`'s.
"""

from distcheck.core.closed_form import INPUT_KINDS, ClosedForm, Input, register
from distcheck.engine.catalogue import catalogue, get

__all__ = ["Input", "ClosedForm", "register", "get", "catalogue", "INPUT_KINDS"]
