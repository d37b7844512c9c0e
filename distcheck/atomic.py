"""Public path of :func:`~distcheck.core.atomic.write_text_atomic` (a file written whole or not at all)."""

from distcheck.core.atomic import *  # noqa: F403
from distcheck.core.atomic import __all__ as __all__
