"""Deprecated: the public path is :mod:`distcheck.parallel.memory` (this module goes in the next release).

Every name it served still resolves, with a DeprecationWarning naming its new path.
"""

from distcheck.core.face import moved, to_face

__getattr__ = moved(__name__, to_face("distcheck.parallel.memory"), "distcheck.parallel.memory")
