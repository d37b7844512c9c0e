"""The machinery the parallelism packages' Hypothesis strategies share, and the generic ones.

Conventions (Hypothesis' own): every argument is keyword-only, bounds are
``min_*``/``max_*`` pairs, the defaults always generate, bad arguments raise
:class:`hypothesis.errors.InvalidArgument` (a ``TypeError``) when the strategy is
built, with a message like ``Cannot have max_tp=1 < min_tp=2``, and the repr of a
strategy is the call that built it (``shard_sizes(max_shards=4)``). :func:`defines`
gives a ``@st.composite`` body all of that: its validator runs the checks of
:mod:`distcheck.core.validate`, whose ConfigError becomes InvalidArgument.

Array-valued cases hold integer-valued floats bounded by
:func:`distcheck.core.exactness.max_exact_int` (:func:`exact_bound`), drawn by
:func:`draw_ints` at the largest shape the arguments allow, so shapes and values shrink
independently.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from math import prod
from types import ModuleType
from typing import Any, TypeVar

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.extra import numpy as hnp
from hypothesis.strategies import SearchStrategy

from distcheck.core.errors import ConfigError
from distcheck.core.exactness import PRECISION_BITS, max_exact_int
from distcheck.core.validate import check_at_least, check_choice, check_int, check_subset

__all__ = ["float_dtypes", "integer_valued_arrays", "defines", "draw_ints", "draw_ints_from_bytes", "exact_bound",
           "powers_of_two",
           "check_dtype", "MAGNITUDE_CAP", "BLOCK_LIMIT", "GENERIC", "public_names"]

#: the public strategies defined here (the rest of the module is machinery)
_T = TypeVar("_T")

GENERIC = ("float_dtypes", "integer_valued_arrays")

MAGNITUDE_CAP = 2**6  # keep counterexamples readable and shrinking fast; the derived exact bound is usually far larger
BLOCK_LIMIT = 512  # entries: up to this, an array is drawn at its largest shape and sliced (see draw_ints)


# ----------------------------------------------------------------------------------------------
# validation: the checks of distcheck.core.validate, whose ConfigError the strategy factory
# re-raises as Hypothesis' InvalidArgument (see defines)


def check_dtype(name: str, value: object) -> str:
    try:
        dt = np.dtype(value).name  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise ConfigError(name, value, "is not a dtype") from None
    check_choice(name, dt, tuple(PRECISION_BITS))
    return dt


def defines(validate: Callable[..., None]) -> Callable[[Callable[..., _T]], Callable[..., SearchStrategy[_T]]]:
    """Turn a ``@st.composite`` body into a public strategy that validates eagerly.

    The arguments are bound to the body's signature (so defaults apply), passed to
    ``validate`` (which raises InvalidArgument), and only then is the lazy
    strategy built; its repr is the call with the non-default arguments.
    """

    def decorate(body: Callable[..., _T]) -> Callable[..., SearchStrategy[_T]]:
        comp = st.composite(body)
        sig = inspect.signature(comp)

        @functools.wraps(comp)
        def factory(*args: Any, **kwargs: Any) -> SearchStrategy[_T]:
            if args:
                raise InvalidArgument(f"{body.__name__}() takes keyword arguments only, got positional {args!r}")
            try:
                bound = sig.bind(**kwargs)
            except TypeError as e:
                raise InvalidArgument(f"{body.__name__}(): {e}") from None
            bound.apply_defaults()
            try:
                validate(**bound.arguments)
            except ConfigError as e:  # Hypothesis' convention: a bad strategy argument is InvalidArgument
                raise InvalidArgument(str(e)) from None
            return comp(**kwargs)

        factory.__qualname__ = body.__qualname__
        return factory

    return decorate


def powers_of_two(low: int, high: int) -> list[int]:
    out, x = [], 1
    while x <= high:
        if x >= low:
            out.append(x)
        x *= 2
    return out


def _v_float_dtypes(*, allowed: tuple[str, ...]) -> None:
    check_subset("allowed", allowed, tuple(PRECISION_BITS))


@defines(_v_float_dtypes)
def float_dtypes(draw: st.DrawFn, *, allowed: tuple[str, ...] = ("float64", "float32")) -> np.dtype:
    """A numpy float dtype from ``allowed`` (names from float64, float32, float16)."""
    return np.dtype(draw(st.sampled_from(tuple(allowed))))


def _v_integer_valued_arrays(*, shape: Any, dtype: Any, max_magnitude: int) -> None:  # shape: user input
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise ConfigError("shape", shape, "must be an int or a tuple of ints") from None
    for i, d in enumerate(dims):
        check_at_least(f"shape[{i}]", d, 0)
    dt = check_dtype("dtype", dtype)
    check_at_least("max_magnitude", max_magnitude, 0)
    if max_magnitude > 2 ** PRECISION_BITS[dt]:
        raise InvalidArgument(
            f"max_magnitude={max_magnitude} exceeds 2**{PRECISION_BITS[dt]}, the largest exact integer run of {dt}"
        )


@defines(_v_integer_valued_arrays)
def integer_valued_arrays(draw: st.DrawFn, *, shape: int | tuple[int, ...], dtype: Any = "float64",
                          max_magnitude: int = 16) -> np.ndarray:
    """A float array of ``shape`` whose entries are integers in [-max_magnitude, max_magnitude].

    - ``shape``: int or tuple of ints >= 0 (required).
    - ``dtype``: float64 (default), float32 or float16.
    - ``max_magnitude``: >= 0 and <= 2**p of the dtype; default 16. Use
      :func:`distcheck.core.exactness.max_exact_int` to pick one that keeps sums exact.
    """
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    return draw(hnp.arrays(np.int64, dims, elements=st.integers(-max_magnitude, max_magnitude))).astype(np.dtype(dtype))


def exact_bound(num_terms: int, factors: int, dtype: str = "float64") -> int:
    """Magnitude for entries so every partial sum stays exact; capped for readability."""
    return max(1, min(MAGNITUDE_CAP, max_exact_int(max(num_terms, 1), factors=factors, dtype=dtype)))


def draw_ints(draw: st.DrawFn, shape: Sequence[int], bound: int, dtype: str = "float64", *,
              max_shape: Sequence[int] | None = None) -> np.ndarray:
    """Integer-valued array of ``shape`` with entries in [-bound, bound].

    With ``max_shape`` (every dim >= the matching dim of ``shape``) holding at most
    ``BLOCK_LIMIT`` entries, the values are drawn for ``max_shape`` and the leading
    block of ``shape`` is kept. The draw then has the same length whatever the
    shape, so when Hypothesis shrinks a dimension the remaining values stay where
    they were: shapes and values shrink independently, and counterexamples come out
    small (e.g. ``tp=2, x=[[1.0, 0.0]]`` rather than a 7 x 3 x 2 array of zeros).
    """
    use = tuple(max_shape) if max_shape is not None and prod(max_shape) <= BLOCK_LIMIT else tuple(shape)
    # hypothesis.extra.numpy.arrays draws a fill value plus a few explicit entries: several
    # times faster than a list of integers, and it shrinks entries towards the fill (0)
    arr = draw(hnp.arrays(np.int64, use, elements=st.integers(-bound, bound))).astype(np.dtype(dtype))
    return np.ascontiguousarray(arr[tuple(slice(0, d) for d in shape)])


def draw_ints_from_bytes(draw: st.DrawFn, shape: Sequence[int], bound: int, dtype: str = "float64") -> np.ndarray:
    """Integer-valued array of ``shape`` with entries in [-bound, bound] (bound <= 127), drawn as ONE
    byte string of ``prod(shape)`` bytes: byte b gives ``u = b mod (2 bound + 1)`` and the entry
    ``0, 1, -1, 2, -2, ...`` for ``u = 0, 1, 2, 3, 4, ...``.

    About ten times cheaper than :func:`draw_ints` (one draw instead of one per explicit entry: 0.07
    against 0.62 ms for a 2 x 8 array in a batch of 16, ``benchmarks/bench_certify.py``). Shrinking
    works byte by byte towards 0, so counterexamples come out as zeros with the few entries the failure
    needs, each as small as it can be (``[[0, 0], [0, 1]]``). The generated arrays are uniform rather
    than :func:`draw_ints`' fill-plus-few-entries, so they hold fewer repeated values: use it where
    the parent's drawing is the bottleneck (one-collective contracts on fast worlds).
    Raises ConfigError for a bound outside [0, 127].
    """
    bound = check_int("bound", bound, min_value=0, max_value=127)
    dims = tuple(shape)
    n = prod(dims)
    raw = draw(st.binary(min_size=n, max_size=n))
    u = np.frombuffer(raw, dtype=np.uint8).astype(np.int64) % (2 * bound + 1)
    values = (u + 1) // 2 * np.where(u % 2 == 1, 1, -1)
    return values.reshape(dims).astype(np.dtype(dtype))


def public_names(module: ModuleType) -> tuple[str, ...]:
    """``module.__all__``, checked against what the module defines: every public function or
    class whose ``__module__`` is the module must be listed, and every listed name must be
    defined there. Raises ImportError naming the missing and the extra names otherwise."""
    declared = tuple(getattr(module, "__all__", ()))
    defined = {n for n, v in vars(module).items()
               if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__}
    missing, extra = sorted(defined - set(declared)), sorted(set(declared) - defined)
    if missing or extra:
        raise ImportError(f"{module.__name__}.__all__ does not list what the module defines: "
                          f"missing {missing}, extra {extra}")
    return declared
