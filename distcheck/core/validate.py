"""The one set of input checks: every boundary of distcheck validates with these.

Every check raises :class:`distcheck.core.errors.ConfigError` naming the argument, its
value and the rule (``field=value rule``, e.g. ``tp=3 must divide num_kv_heads=8``), so a
wrong type, an empty or non-finite array, or a size too large to enumerate never surfaces
as an AttributeError, IndexError, MemoryError or a hang from deep inside numpy.

One rule per kind of value, used everywhere:

- integers: ``int`` or a numpy integer, never a ``bool`` (nor a numpy bool); returned as a
  Python ``int`` (:func:`check_int`, :func:`check_positive_int`, :func:`check_nonnegative_int`);
- booleans: ``bool`` or a numpy bool, returned as ``bool`` (:func:`check_bool`);
- choices: the same type and an equal value, arrays refused rather than compared
  (:func:`check_choice`, :func:`check_subset`);
- arrays: numeric, finite, of the stated rank (:func:`as_array`).

The Hypothesis strategies (:mod:`distcheck.strategies`) check their arguments with these
same functions and re-raise the ConfigError as Hypothesis' ``InvalidArgument``, as
Hypothesis' own strategies do. Their ``min_*``/``max_*`` pairs use :func:`check_interval`,
which words its two rules as Hypothesis does: ``min_tp=0 must be at least 1`` and
``Cannot have max_tp=1 < min_tp=2``.

Size limits (documented here, used by the modules that enumerate):

- :data:`MAX_RANKS` = 2**24 (16,777,216): the most ranks a function that lists
  something per rank (layout groups and grids, ZeRO per-rank shards) enumerates.
  Larger worlds are answered by the O(1) functions (``layout.coords``,
  ``layout.rank_of``, ``ParallelConfig.num_groups``) and the closed forms.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import numpy as np

from distcheck.core.errors import ConfigError, IntervalError

__all__ = [
    "MAX_RANKS",
    "MAX_ELEMENTS",
    "check_type",
    "check_choice",
    "check_subset",
    "check_bool",
    "check_optional_bool",
    "check_callable",
    "check_int",
    "check_positive_int",
    "check_nonnegative_int",
    "check_interval",
    "check_at_least",
    "check_divides",
    "check_float",
    "check_at_most",
    "as_array",
    "as_arrays",
    "as_int_list",
    "check_world_sizes",
    "check_printable",
]

#: the most ranks a per-rank enumeration builds (layout groups/grids, ZeRO shards)
MAX_RANKS = 2**24
#: the most elements a reference allocates for arrays it creates itself (e.g. dp.mlp_init)
MAX_ELEMENTS = 2**24

#: numpy dtype kinds accepted as numbers: bool, signed, unsigned, float
_NUMERIC_KINDS = "biuf"


def check_type(field: str, value: Any, cls: type | tuple[type, ...], hint: str) -> Any:
    """Return ``value`` if it is an instance of ``cls``, else ConfigError(field, value, hint)."""
    if not isinstance(value, cls):
        raise ConfigError(field, _short(value), hint)
    return value


class _TypeOnly:
    """Shows a value by its type alone (``<ndarray>``): for values too big or odd to print."""

    def __init__(self, value: object):
        self.type_name = type(value).__name__

    def __repr__(self) -> str:
        return f"<{self.type_name}>"


def _same(value: object, choice: object) -> bool:
    """``value`` is ``choice``'s type and equal to it (``True`` is not ``1``; an array equals nothing)."""
    try:
        return type(value) is type(choice) and bool(value == choice)
    except Exception:  # noqa: BLE001 - any user object: an __eq__ or __bool__ that raises (numpy's "truth value
        # of an array is ambiguous") means not equal
        return False


def _shown(value: object) -> object:
    return value if isinstance(value, (str, int, float, type(None))) else _TypeOnly(value)


def check_choice(field: str, value: Any, choices: Any) -> Any:
    """Return ``value`` if it is one of ``choices`` (same type and equal), else raise ConfigError.

    Safe for any value: arrays and unhashable objects are refused, not compared
    elementwise, and ``True`` does not pass for ``1``. A ``str`` subclass (a
    :class:`distcheck.core.vocab` member) passes for its string value and vice versa.
    """
    if not any(_same(value, c) or (isinstance(value, str) and isinstance(c, str) and value == c) for c in choices):
        raise ConfigError(field, _shown(value), f"must be one of {', '.join(map(repr, map(_plain, choices)))}")
    return value


def _plain(choice: object) -> object:
    """A vocabulary member (a ``str`` subclass) as its plain string, so messages read ``'gpipe'``."""
    return str.__str__(choice) if isinstance(choice, str) else choice


def check_subset(field: str, value: Any, allowed: Sequence[Any]) -> tuple:
    """``value`` (one allowed item, or a non-empty sequence of them) as a tuple of allowed items.

    Raises ConfigError: ``value`` is not a sequence, is empty, or holds an item that is not
    one of ``allowed`` (arrays and unhashables are never allowed)."""
    if isinstance(value, str):
        value = (value,)
    try:
        items = tuple(value)
    except TypeError:
        raise ConfigError(field, _shown(value),
                          f"must be a sequence drawn from {tuple(map(_plain, allowed))!r}") from None
    if not items:
        raise ConfigError(field, value, "must not be empty")
    for x in items:
        if not isinstance(x, (str, int, type(None))) or x not in allowed:
            raise ConfigError(field, value, f"contains {x!r}, which is not one of {tuple(map(_plain, allowed))!r}")
    return items


def check_bool(field: str, value: Any) -> bool:
    """Return ``value`` as a bool if it is one (numpy bools accepted), else ConfigError."""
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(field, _short(value), "must be a bool")
    return bool(value)


def check_optional_bool(field: str, value: Any) -> bool | None:
    """``value`` if it is True, False or None (numpy bools accepted), else ConfigError."""
    if value is None:
        return None
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(field, _short(value), "must be True, False or None")
    return bool(value)


def check_callable(field: str, value: Any) -> Any:
    """Return ``value`` if it is callable, else ConfigError."""
    if not callable(value):
        raise ConfigError(field, _short(value), "must be a callable")
    return value


def check_int(field: str, value: Any, *, min_value: int | None = None, max_value: int | None = None,
              rule: str | None = None) -> int:
    """``value`` as a Python int: an ``int`` or numpy integer (bools rejected) within
    ``[min_value, max_value]`` (either end optional). Raises ConfigError otherwise:
    ``must be an integer``, ``must be >= min_value``, ``must be <= max_value``; or ``rule``
    for every one of them when given (a rule stated whole: ``"must be an integer >= 0"``)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ConfigError(field, _short(value), rule or "must be an integer")
    value = int(value)
    if min_value is not None and value < min_value:
        raise ConfigError(field, value, rule or f"must be >= {min_value}")
    if max_value is not None and value > max_value:
        raise ConfigError(field, value, rule or f"must be <= {max_value}")
    return value


def check_positive_int(field: str, value: Any) -> int:
    """:func:`check_int` with ``min_value=1``: ``value`` as an int >= 1."""
    return check_int(field, value, min_value=1)


def check_nonnegative_int(field: str, value: Any) -> int:
    """:func:`check_int` with ``min_value=0``: ``value`` as an int >= 0."""
    return check_int(field, value, min_value=0)


def check_interval(low_field: str, low: Any, high_field: str, high: Any, *, at_least: int = 1) -> tuple[int, int]:
    """A strategy's ``min_*``/``max_*`` pair as ints, in Hypothesis' words.

    Both ends are integers as :func:`check_int` has them; each must be ``>= at_least``
    (``min_tp=0 must be at least 1``) and ``high >= low``: otherwise an
    :class:`~distcheck.core.errors.IntervalError` (a ConfigError naming ``high_field``)
    reading ``Cannot have max_tp=1 < min_tp=2``."""
    low = check_at_least(low_field, low, at_least)
    high = check_at_least(high_field, high, at_least)
    if high < low:
        raise IntervalError(low_field, low, high_field, high)
    return low, high


def check_at_least(field: str, value: Any, minimum: int) -> int:
    """:func:`check_int` for one strategy argument, worded as Hypothesis words it:
    ``max_ep=0 must be at least 1``."""
    value = check_int(field, value)
    if value < minimum:
        raise ConfigError(field, value, f"must be at least {minimum}")
    return value


def check_divides(field: str, value: int, other_field: str, other: int) -> None:
    """Raise ConfigError('tp', 3, 'must divide num_kv_heads=8') unless value divides other."""
    if other % value != 0:
        raise ConfigError(field, value, f"must divide {other_field}={other}")


def check_float(field: str, value: Any, *, gt: float | None = None, max_value: float | None = None,
                why: str | None = None) -> float:
    """``value`` as a Python float: an int, float or other real number (bools rejected), finite,
    ``> gt`` and ``<= max_value`` (either end optional; ``why`` explains the upper end).
    Raises ConfigError otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, Decimal)):
        raise ConfigError(field, _short(value), "must be a real number")
    try:
        number = float(value)
    except OverflowError:  # an int or Fraction beyond float range: compared as +-infinity below
        number = float("inf") if value > 0 else float("-inf")  # type: ignore[operator]
    else:
        if not np.isfinite(number):
            raise ConfigError(field, value, "must be finite (no NaN or infinity)")
    if gt is not None and not number > gt:
        raise ConfigError(field, value, f"must be > {gt:g}")
    if max_value is not None and number > max_value:
        raise ConfigError(field, value, f"must be <= {max_value:g}" + (f" ({why})" if why else ""))
    if not np.isfinite(number):
        raise ConfigError(field, value, "must be within the range of a float")
    return number


def check_at_most(field: str, value: int, limit: int, why: str) -> int:
    """Raise ConfigError(field, value, "must be <= limit (why)") when ``value > limit``."""
    if value > limit:
        raise ConfigError(field, value, f"must be <= {limit} ({why})")
    return value


def _short(value: Any) -> Any:
    """A value fit for an error message (large arrays summarised by shape and dtype)."""
    if isinstance(value, np.ndarray) and value.size > 8:
        return f"<array shape={value.shape} dtype={value.dtype}>"
    return value


def as_array(
    field: str,
    value: Any,
    *,
    ndim: int | tuple[int, ...] | None = None,
    min_ndim: int = 0,
    allow_empty: bool = False,
    allow_object: bool = True,
    allow_bool: bool = True,
) -> np.ndarray:
    """``value`` as a numeric numpy array, or ConfigError naming ``field``.

    Accepted: bool (unless ``allow_bool`` is False), integer and float dtypes; with ``allow_object`` also object
    arrays whose entries are all real numbers (``fractions.Fraction``,
    ``decimal.Decimal``: the exact and high-precision inputs of the references).
    Rules: a float entry must be finite (NaN and infinity have no exact value and
    turn every comparison into a false negative); ``ndim`` (an int or a tuple of
    allowed values) and ``min_ndim`` constrain the rank; the array must be
    non-empty unless ``allow_empty``.
    """
    if isinstance(value, (str, bytes, dict)) or value is None:
        raise ConfigError(field, _short(value), "must be a numeric array")
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise ConfigError(field, _short(value), f"must be a numeric array ({exc})") from None
    kind = arr.dtype.kind
    if kind == "O":
        if not allow_object or not all(isinstance(x, (numbers.Real, Decimal)) and not isinstance(x, bool)
                                       for x in arr.reshape(-1).tolist()):
            raise ConfigError(field, _short(value), "must be a numeric array (ints, floats, Fractions or Decimals)")
        if not all(_finite(x) for x in arr.reshape(-1).tolist()):
            raise ConfigError(field, _short(value), "must be finite (no NaN or infinity)")
    elif kind not in _NUMERIC_KINDS or (kind == "b" and not allow_bool):
        raise ConfigError(field, _short(value), f"must be a numeric array (got dtype {arr.dtype})")
    elif kind == "f" and not np.all(np.isfinite(arr)):
        raise ConfigError(field, _short(value), "must be finite (no NaN or infinity)")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if arr.ndim not in allowed:
            raise ConfigError(f"{field}.shape", arr.shape, f"must have {' or '.join(map(str, allowed))} dimensions")
    if arr.ndim < min_ndim:
        raise ConfigError(f"{field}.shape", arr.shape, f"must have at least {min_ndim} dimension(s)")
    if arr.size == 0 and not allow_empty:
        raise ConfigError(f"{field}.shape", arr.shape, "must not be empty (every dimension >= 1)")
    return arr


def _finite(x: Any) -> bool:
    try:
        return bool(np.isfinite(float(x)))
    except (OverflowError, ValueError, TypeError):
        return False


def as_arrays(field: str, values: Any, *, min_len: int = 1, max_len: int | None = None,
              **array_kw: Any) -> list[np.ndarray]:
    """A non-string sequence of arrays, each checked by :func:`as_array` as ``field[i]``;
    at least ``min_len`` and at most ``max_len`` of them."""
    if isinstance(values, (str, bytes, dict, np.ndarray)) or not isinstance(values, Sequence):
        if not (isinstance(values, np.ndarray) and values.ndim >= 1):
            raise ConfigError(field, _short(values), "must be a list of arrays")
    n = len(values)
    if n < min_len:
        raise ConfigError(field, _short(values),
                          "must be non-empty" if min_len == 1 else f"must hold at least {min_len} arrays")
    if max_len is not None and n > max_len:
        raise ConfigError(f"len({field})", n, f"must be <= {max_len}")
    return [as_array(f"{field}[{i}]", v, **array_kw) for i, v in enumerate(values)]


def as_int_list(field: str, values: Any, *, min_value: int = 1, min_len: int = 1) -> list[int]:
    """A sequence (or 1-D integer array) of integers >= ``min_value`` as a list of ints."""
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise ConfigError(field, _short(values), "must be a 1-D list of integers")
        values = values.tolist()
    if isinstance(values, (str, bytes, dict)) or not isinstance(values, Sequence):
        raise ConfigError(field, _short(values), "must be a list of integers")
    if len(values) < min_len:
        raise ConfigError(field, _short(values),
                          "must be non-empty" if min_len == 1 else f"must hold at least {min_len} integers")
    return [check_int(f"{field}[{i}]", v, min_value=min_value) for i, v in enumerate(values)]


def check_world_sizes(field: str, values: Any) -> tuple[int, ...]:
    """World sizes (``--world-sizes``, ``world-sizes = [...]``) as a tuple of ints: a non-empty list of
    integers >= 1, none repeated. Raises ConfigError naming ``field`` with the rule the flag states:
    ``must not be empty``, ``must be integers >= 1``, ``must be distinct``."""
    if isinstance(values, (str, bytes, dict)) or not isinstance(values, Sequence):
        raise ConfigError(field, _short(values), "must be a list of integers >= 1")
    if not values:
        raise ConfigError(field, list(values), "must not be empty")
    sizes = tuple(check_int(field, v, min_value=1, rule="must be integers >= 1") for v in values)
    if len(set(sizes)) != len(sizes):
        raise ConfigError(field, list(sizes), "must be distinct")
    return sizes


def check_printable(field: str, value: Any) -> str:
    """``value`` if it is a ``str`` with no control or format character (``\\n``, ESC, a zero-width
    space: Unicode categories Cc, Cf, Cs, Co, Cn), else ConfigError. For names a user types (a model
    preset), which are echoed to the terminal."""
    import unicodedata

    check_type(field, value, str, "must be a string")
    bad = next((ch for ch in value if unicodedata.category(ch).startswith("C")), None)
    if bad is not None:
        raise ConfigError(field, value, f"must not hold control characters (holds {bad!r})")
    return value
