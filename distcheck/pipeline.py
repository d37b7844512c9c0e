"""Tick-level simulator of pipeline-parallel schedules: public path of
:mod:`distcheck.parallel.pp.reference` (with its actions and timeline)."""

from distcheck.parallel.pp.reference import *  # noqa: F403
from distcheck.parallel.pp.reference import __all__ as __all__
