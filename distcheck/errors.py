"""Public path of distcheck's exceptions and integer checks.

The exceptions live in :mod:`distcheck.core.errors` and the checks in
:mod:`distcheck.core.validate` (the one set of validation helpers); this module
re-exports both under the name users import: ``from distcheck.errors import ConfigError``.
"""

from distcheck.core.errors import (
    AnswerKeyError,
    BackendUnavailable,
    ConfigError,
    DistcheckError,
    DistributedError,
    GoldenError,
    ImplementationError,
    IntervalError,
    PropertyFailure,
    RankFailure,
    UnknownQuantityError,
    WorldTimeout,
)
from distcheck.core.validate import check_choice, check_divides, check_nonnegative_int, check_positive_int

__all__ = [
    "DistcheckError",
    "ConfigError",
    "IntervalError",
    "UnknownQuantityError",
    "GoldenError",
    "AnswerKeyError",
    "PropertyFailure",
    "ImplementationError",
    "DistributedError",
    "RankFailure",
    "WorldTimeout",
    "BackendUnavailable",
    "check_positive_int",
    "check_nonnegative_int",
    "check_divides",
    "check_choice",
]
