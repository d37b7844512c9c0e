"""Public path of the fake backend (:func:`run_fake`, :class:`FakeWorld`): :mod:`distcheck.engine.fake`
(the engine layer: it starts nothing, so the packages' world-free checks use it directly)."""

from distcheck.engine.fake import *  # noqa: F403
from distcheck.engine.fake import __all__ as __all__
