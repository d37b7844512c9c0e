"""Deprecated (goes in the next release): a property is reached by its name, ``distcheck.props.get(NAME)``.

Every property function this module served still resolves, with a DeprecationWarning naming its path.
"""

from distcheck.core.face import moved
from distcheck.props import _property_path

__getattr__ = moved(__name__, _property_path("distcheck.parallel.comm.properties"), "distcheck.props.get(NAME)")
