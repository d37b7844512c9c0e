"""Stated exactness: when sharded and unsharded results must be bit-identical, and
the floating-point bound that holds otherwise.

Two regimes, never an arbitrary ``atol``:

1. **Bitwise.** Inputs are integer-valued floats small enough that every partial
   sum and product the computation forms is an integer of magnitude <= 2**p
   (p = 53 significand bits for float64, 24 for float32, 11 for float16, 8 for
   bfloat16). Such
   integers are exactly representable, so every addition and multiplication is
   exact whatever the order, and the sharded result must equal the unsharded one
   bit for bit. :func:`max_exact_int` derives the magnitude bound from 2**p.
   Division by a power of two is also exact (no underflow at these magnitudes).

2. **Bounded.** Otherwise the error is bounded by the operation (Higham,
   *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §3.1, Lemma 3.1 and
   eq. (3.4)/(3.5)): with unit roundoff u = 2**-p and
   ``gamma_k = k*u / (1 - k*u)``:

   - any ordering of a sum of k terms: ``|fl(sum) - sum| <= gamma_{k-1} * sum|x_i|``;
   - a dot product of length k: ``|fl(x.y) - x.y| <= gamma_k * sum|x_i*y_i|``;
   - a chain of j rounded operations on a value: relative error <= gamma_j.

   Comparisons are made in exact rational arithmetic (:class:`fractions.Fraction`):
   the float results are converted exactly, so the check itself adds no rounding.

A failed check raises :class:`distcheck.core.errors.PropertyFailure` carrying expected,
got, the max error and the bound (0 for bitwise checks).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np

from distcheck.core.errors import ConfigError, PropertyFailure
from distcheck.core.validate import check_int

__all__ = [
    "PRECISION_BITS",
    "BFLOAT16_BITS",
    "precision_bits",
    "unit_roundoff",
    "gamma",
    "max_exact_int",
    "is_exactly_integer",
    "to_exact",
    "abs_sum",
    "sum_bound",
    "dot_bound",
    "chain_bound",
    "assert_bitwise_equal",
    "assert_exact",
    "assert_within",
]

#: significand bits p (including the implicit bit) of each IEEE binary format
PRECISION_BITS = {"float64": 53, "float32": 24, "float16": 11}
#: significand bits of bfloat16 (7 stored + the implicit bit; unit roundoff 2**-8). numpy has no
#: bfloat16 dtype, so it is named by the string ``"bfloat16"`` and is not in :data:`PRECISION_BITS`
BFLOAT16_BITS = 8


def precision_bits(dtype: Any = "float64") -> int:
    """Significand bits p of ``dtype`` (53 float64, 24 float32, 11 float16, 8 for the string
    ``"bfloat16"``, which has no numpy dtype).

    Raises ConfigError for a dtype that is not one of these.
    """
    if isinstance(dtype, str) and dtype == "bfloat16":
        return BFLOAT16_BITS
    try:
        name = np.dtype(dtype).name
    except (TypeError, ValueError):
        raise ConfigError("dtype", dtype, f"must be one of {', '.join(PRECISION_BITS)}, 'bfloat16'") from None
    if name not in PRECISION_BITS:
        raise ConfigError("dtype", dtype, f"must be one of {', '.join(PRECISION_BITS)}, 'bfloat16'")
    return PRECISION_BITS[name]


def unit_roundoff(dtype: Any = "float64") -> Fraction:
    """u = 2**-p, the unit roundoff of round-to-nearest (2**-53 for float64)."""
    return Fraction(1, 2 ** precision_bits(dtype))


def gamma(k: int, dtype: Any = "float64") -> Fraction:
    """Higham's gamma_k = k*u / (1 - k*u) as an exact Fraction (gamma_0 = 0).

    Raises ConfigError if k < 0 or k*u >= 1 (the bound is then meaningless).
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ConfigError("k", k, "must be an integer >= 0")
    ku = int(k) * unit_roundoff(dtype)
    if ku >= 1:
        raise ConfigError("k", k, f"must satisfy k*u < 1 (u = 2**-{precision_bits(dtype)})")
    return ku / (1 - ku)


def _iroot_floor(n: int, r: int) -> int:
    """floor(n ** (1/r)) for integers n >= 0, r >= 1, exactly."""
    if n < 2 or r == 1:
        return n
    if r >= n.bit_length():  # 2**r > n: the root is in [1, 2)
        return 1
    x = int(round(n ** (1.0 / r)))
    while x**r > n:
        x -= 1
    while (x + 1) ** r <= n:
        x += 1
    return x


def max_exact_int(num_terms: int, *, factors: int = 1, dtype: Any = "float64") -> int:
    """Largest M such that sums of ``num_terms`` products of ``factors`` integers,
    each of magnitude <= M, stay exactly representable in ``dtype``.

    Condition: ``num_terms * M**factors <= 2**p``. Then every partial sum (in any
    order) is an integer of magnitude <= 2**p, and all such integers are floats.
    For chained reductions pass the product of the reduction lengths as
    ``num_terms`` and the number of factors along the chain (e.g. ``x @ W1 @ W2``
    with inner sizes k1, k2: ``num_terms=k1*k2, factors=3``).

    Raises ConfigError for num_terms < 1 or factors < 1.
    """
    for name, value in (("num_terms", num_terms), ("factors", factors)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ConfigError(name, value, "must be an integer >= 1")
    return _iroot_floor((2 ** precision_bits(dtype)) // int(num_terms), int(factors))


def is_exactly_integer(a: Any, *, dtype: Any = "float64") -> bool:
    """True if every entry of ``a`` is an integer of magnitude <= 2**p (exact in ``dtype``).

    Raises ConfigError when ``a`` is not a number or an array of numbers."""
    try:
        arr = np.asarray(a)
        if arr.dtype.kind not in "biufO":
            raise TypeError(arr.dtype)
        arr = arr.astype(np.float64)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError("a", a, "must be a real number or an array of real numbers") from None
    return bool(np.all(np.isfinite(arr)) and np.all(arr == np.round(arr))
                and np.all(np.abs(arr) <= 2.0 ** precision_bits(dtype)))


def to_exact(a: Any) -> Any:
    """Convert a float, int, Fraction, Decimal or array of them to exact Fractions
    (an object array for arrays).

    Raises PropertyFailure for NaN or infinity (no exact value exists; a computed
    result that is not finite fails the property); ConfigError for anything that is
    not a real number or an array of real numbers (strings, complex, objects).
    """
    if isinstance(a, Fraction):
        return a
    if isinstance(a, (int, np.integer)) and not isinstance(a, bool):
        return Fraction(int(a))
    if isinstance(a, (float, np.floating)):
        if not np.isfinite(a):
            raise PropertyFailure("non-finite value", got=float(a))
        return Fraction(float(a))
    if isinstance(a, Decimal):
        if not a.is_finite():
            raise PropertyFailure("non-finite value", got=a)
        return Fraction(a)
    if isinstance(a, numbers.Rational) and not isinstance(a, bool):
        return Fraction(int(a.numerator), int(a.denominator))
    try:
        arr = np.asarray(a)
    except (TypeError, ValueError):
        raise ConfigError("value", a, "must be a real number or an array of real numbers") from None
    if arr.dtype == object:
        if arr.ndim == 0:  # one object that is not a number (a number was handled above)
            raise ConfigError("value", a, "must be a real number or an array of real numbers")
        return np.vectorize(to_exact, otypes=[object])(arr) if arr.size else arr
    if arr.dtype.kind not in "biuf":
        raise ConfigError("value", a, f"must be a real number or an array of real numbers (got dtype {arr.dtype})")
    if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        raise PropertyFailure("non-finite value", got=arr)
    out = np.empty(arr.shape, dtype=object)
    flat = out.reshape(-1)
    for i, x in enumerate(arr.reshape(-1).tolist()):
        flat[i] = Fraction(x)
    return out


def _abs(x: Any) -> Any:
    return np.abs(x) if isinstance(x, np.ndarray) else abs(x)


def abs_sum(terms: Iterable[Any]) -> Fraction:
    """sum |x_i| in exact arithmetic. Raises ConfigError unless ``terms`` is an iterable of numbers."""
    if isinstance(terms, (str, bytes)) or not isinstance(terms, Iterable):
        raise ConfigError("terms", terms, "must be an iterable of numbers")
    try:
        return sum((abs(to_exact(t)) for t in terms), Fraction(0))
    except ConfigError:
        raise
    except ValueError:  # arrays of different shapes do not add up
        raise ConfigError("terms", terms, "must be numbers, or arrays of one shape (summed elementwise)") from None


def sum_bound(abs_total: Any, k: int, dtype: Any = "float64") -> Fraction:
    """Bound on |fl(sum of k terms) - exact sum| for ANY summation order:
    ``gamma_{k-1} * sum|x_i|`` (Higham eq. (3.4)). Two different orders differ
    by at most twice this."""
    return gamma(max(check_int("k", k, min_value=0) - 1, 0), dtype) * _abs(to_exact(abs_total))


def dot_bound(abs_products: Any, k: int, dtype: Any = "float64") -> Fraction:
    """Bound on |fl(x . y) - x . y| for length-k vectors: ``gamma_k * sum|x_i*y_i|``
    (Higham Lemma 3.1 / eq. (3.5))."""
    return gamma(check_int("k", k, min_value=0), dtype) * _abs(to_exact(abs_products))


def chain_bound(abs_exact: Any, j: int, dtype: Any = "float64") -> Fraction:
    """Bound after j rounded operations (products/quotients) on an exact value:
    ``gamma_j * |value|`` (Higham Lemma 3.1)."""
    return gamma(check_int("j", j, min_value=0), dtype) * _abs(to_exact(abs_exact))


def _asarray(field: str, x: Any) -> np.ndarray:
    try:
        return np.asarray(x)
    except (TypeError, ValueError):
        raise ConfigError(field, x, "must be a number or a (rectangular) array of numbers") from None


def _as_exact_array(x: Any) -> np.ndarray:
    ex = to_exact(x)
    return ex if isinstance(ex, np.ndarray) else np.array(ex, dtype=object)


def _max_error(expected: np.ndarray, got: np.ndarray) -> Fraction:
    if expected.size == 0:
        return Fraction(0)
    return max(abs(e - g) for e, g in zip(expected.reshape(-1), got.reshape(-1), strict=True))


def _check_shapes(what: str, expected: np.ndarray, got: np.ndarray, e_raw: object, g_raw: object) -> None:
    if expected.shape != got.shape:
        raise PropertyFailure(f"{what}: shape {got.shape} differs from expected {expected.shape}",
                              expected=e_raw, got=g_raw)


def assert_bitwise_equal(expected: Any, got: Any, *, what: str = "result") -> None:
    """Require two results to be identical bit for bit: the same dtype, the same shape
    and the same values (+0.0 and -0.0 count as equal, NaN never does).

    The dtype is part of "bitwise": a float32 result is not bitwise equal to a
    float64 reference even when every value happens to round-trip, and the exactness
    arguments of :mod:`distcheck.core.exactness` hold for one format. Python scalars and
    lists are compared as the arrays numpy makes of them (a float becomes float64).

    Raises PropertyFailure: ``"<what>: dtype float32 differs from expected float64"``
    (a dtype mismatch, checked first), a shape mismatch, or differing values (with the
    max error and bound=0.0).
    """
    e, g = _asarray("expected", expected), _asarray("got", got)
    for arr, raw in ((e, expected), (g, got)):
        if arr.dtype == object:  # a dict or a list of mixed things: refused as the other assert_* refuse it
            to_exact(raw)
    if e.dtype != g.dtype:
        raise PropertyFailure(f"{what}: dtype {g.dtype} differs from expected {e.dtype} (a bitwise check "
                              "compares values of one format)", expected=expected, got=got)
    _check_shapes(what, e, g, expected, got)
    if not np.array_equal(e, g):
        err = _max_error(_as_exact_array(e), _as_exact_array(g))
        raise PropertyFailure(f"{what}: not bitwise equal", expected=expected, got=got,
                              max_error=float(err), bound=0.0)


def assert_exact(expected: Any, got: Any, *, what: str = "result") -> None:
    """Require ``got`` (floats or ints) to equal the exact value ``expected`` (ints or
    Fractions, or arrays of them) exactly. Raises PropertyFailure(max error, bound=0.0)."""
    e, g = _as_exact_array(expected), _as_exact_array(got)
    _check_shapes(what, e, g, expected, got)
    err = _max_error(e, g)
    if err != 0:
        raise PropertyFailure(f"{what}: not exact", expected=expected, got=got,
                              max_error=float(err), bound=0.0)


def assert_within(expected: Any, got: Any, bound: Any, *, what: str = "result") -> Fraction:
    """Require ``|got - expected| <= bound`` elementwise, in exact arithmetic.

    ``bound`` is a scalar or an array broadcastable to ``expected`` (exact or float);
    derive it with :func:`sum_bound` / :func:`dot_bound` / :func:`chain_bound`.
    Returns the max error (a Fraction). Raises PropertyFailure(max error, bound).
    """
    e, g = _as_exact_array(expected), _as_exact_array(got)
    _check_shapes(what, e, g, expected, got)
    try:
        b = np.broadcast_to(_as_exact_array(bound), e.shape)
    except ValueError:
        raise ConfigError("bound", bound, f"must broadcast to the expected shape {e.shape}") from None
    rows = [(abs(ei - gi), bi) for ei, gi, bi in zip(e.reshape(-1), g.reshape(-1), b.reshape(-1), strict=True)]
    bad = [(err, bi) for err, bi in rows if err > bi]
    if bad:
        worst, worst_bound = max(bad, key=lambda t: t[0] - t[1])
        raise PropertyFailure(f"{what}: error exceeds the derived bound", expected=expected, got=got,
                              max_error=float(worst), bound=float(worst_bound))
    return max((err for err, _ in rows), default=Fraction(0))
