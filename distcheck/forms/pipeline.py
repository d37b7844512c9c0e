"""Closed forms of pipeline schedules (step ticks, bubble fraction and ratio, peak in flight): public path of
:mod:`distcheck.parallel.pp.forms`."""

from distcheck.parallel.pp.forms import *  # noqa: F403
from distcheck.parallel.pp.forms import __all__ as __all__
