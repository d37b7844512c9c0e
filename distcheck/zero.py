"""ZeRO stages 0-3 and FSDP: shards per rank, bytes per GPU, communication: public path of
:mod:`distcheck.parallel.zero.reference`."""

from distcheck.parallel.zero.reference import *  # noqa: F403
from distcheck.parallel.zero.reference import __all__ as __all__
