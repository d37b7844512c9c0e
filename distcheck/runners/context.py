"""Public path of :class:`RankContext`, :class:`World` and :func:`check_same_shape`:
:mod:`distcheck.engine.world` (the engine layer, where the packages' checks can name them)."""

from distcheck.engine.world import *  # noqa: F403
from distcheck.engine.world import __all__ as __all__
