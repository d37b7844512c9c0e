"""Parameter counts of decoder-only transformers, tensor by tensor: public path of
:mod:`distcheck.parallel.params.reference`."""

from distcheck.parallel.params.reference import *  # noqa: F403
from distcheck.parallel.params.reference import __all__ as __all__
