"""Hypothesis strategies of data parallelism and gradient accumulation: shard counts and sizes,
least-squares batches split into shards, sequences split into micro-batches two ways.

Public path: :mod:`distcheck.strategies` (Hypothesis' conventions are listed there).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from distcheck.core.errors import ConfigError
from distcheck.core.validate import MAX_ELEMENTS, check_interval, check_optional_bool
from distcheck.engine.strategies import defines, draw_ints, exact_bound
from distcheck.engine.strategies import powers_of_two as _powers_of_two

__all__ = ["shard_counts", "shard_sizes", "DPCase", "dp_cases", "AccumulationCase", "accumulation_cases"]


def _v_shard_counts(*, min_shards: int, max_shards: int) -> None:
    check_interval("min_shards", min_shards, "max_shards", max_shards)


@defines(_v_shard_counts)
def shard_counts(draw: st.DrawFn, *, min_shards: int = 1, max_shards: int = 8) -> int:
    """Number of shards (ranks) N.

    - ``min_shards``: >= 1, default 1.
    - ``max_shards``: >= ``min_shards``, default 8.

    >>> shard_counts(max_shards=4).example()  # doctest: +SKIP
    3
    """
    return draw(st.integers(min_shards, max_shards))


def _v_shard_sizes(*, min_shards: int, max_shards: int, min_size: int, max_size: int, equal: bool | None,
                   powers_of_two: bool | None) -> None:
    check_interval("min_shards", min_shards, "max_shards", max_shards)
    check_interval("min_size", min_size, "max_size", max_size)
    check_optional_bool("equal", equal)
    check_optional_bool("powers_of_two", powers_of_two)
    if not powers_of_two and max_size - min_size >= MAX_ELEMENTS:  # the sizes are listed to draw from
        raise ConfigError("max_size", max_size, f"must be < min_size + {MAX_ELEMENTS} (min_size={min_size})")
    count = len(_powers_of_two(min_size, max_size)) if powers_of_two else max_size - min_size + 1
    if not count:
        raise InvalidArgument(f"no power of two lies in [min_size={min_size}, max_size={max_size}]")
    if equal is False:
        if max_shards < 2:
            raise InvalidArgument(f"equal=False needs max_shards >= 2, got max_shards={max_shards}")
        if count < 2:
            raise InvalidArgument(
                f"equal=False needs two different sizes in [min_size={min_size}, max_size={max_size}]"
                + (" (powers of two)" if powers_of_two else "")
            )


@defines(_v_shard_sizes)
def shard_sizes(
    draw: st.DrawFn,
    *,
    min_shards: int = 1,
    max_shards: int = 8,
    min_size: int = 1,
    max_size: int = 8,
    equal: bool | None = None,
    powers_of_two: bool = False,
) -> tuple[int, ...]:
    """Per-shard example counts ``(n_0, ..., n_{N-1})`` with N in [min_shards, max_shards].

    - ``min_size``/``max_size``: bounds on each n_k (>= 1; defaults 1 and 8).
    - ``equal``: True: all equal; False: at least two differ (needs max_shards >= 2);
      None (default): either.
    - ``powers_of_two``: every n_k a power of two (then division by n_k is exact).
    """
    pool = _powers_of_two(min_size, max_size) if powers_of_two else list(range(min_size, max_size + 1))
    if equal is False:
        n = draw(st.integers(max(min_shards, 2), max_shards))
        sizes = draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n))
        if len(set(sizes)) == 1:  # force a difference without filtering
            i = draw(st.integers(0, n - 1))
            others = [x for x in pool if x != sizes[0]]
            sizes[i] = draw(st.sampled_from(others))
        return tuple(sizes)
    n = draw(st.integers(min_shards, max_shards))
    if equal:
        return (draw(st.sampled_from(pool)),) * n
    return tuple(draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n)))




@dataclass(frozen=True)
class DPCase:
    """A least-squares batch split into data-parallel shards.

    ``X``: (n, features) inputs; ``y``: (n,) targets; ``w``: (features,) weights;
    ``shard_sizes``: examples per shard (sum n), shard k holds the next n_k rows.
    Entries are integers bounded so the per-example gradients 2 x_i (x_i . w - y_i)
    and every sum of them are exact in float64 (``max_exact_int(2 n (f+1), factors=3)``).
    """

    X: np.ndarray
    y: np.ndarray
    w: np.ndarray
    shard_sizes: tuple[int, ...]

    @property
    def num_shards(self) -> int:
        return len(self.shard_sizes)

    def __repr__(self) -> str:
        return (f"DPCase(shard_sizes={self.shard_sizes}, X={self.X.tolist()}, "
                f"y={self.y.tolist()}, w={self.w.tolist()})")


def _v_dp_cases(*, min_shards: int, max_shards: int, min_shard_size: int, max_shard_size: int, min_features: int,
                max_features: int,
                equal_shards: bool | None, powers_of_two: bool | None) -> None:
    _v_shard_sizes(min_shards=min_shards, max_shards=max_shards, min_size=min_shard_size, max_size=max_shard_size,
                   equal=equal_shards, powers_of_two=powers_of_two)
    check_interval("min_features", min_features, "max_features", max_features)


@defines(_v_dp_cases)
def dp_cases(
    draw: st.DrawFn,
    *,
    min_shards: int = 1,
    max_shards: int = 8,
    min_shard_size: int = 1,
    max_shard_size: int = 8,
    min_features: int = 1,
    max_features: int = 4,
    equal_shards: bool | None = None,
    powers_of_two: bool = False,
) -> DPCase:
    """A :class:`DPCase`: shard sizes as :func:`shard_sizes`, integer-valued X, y, w.

    - ``min_features``/``max_features``: width of X (>= 1; defaults 1 and 4).
    - ``equal_shards``, ``powers_of_two``: as ``equal`` / ``powers_of_two`` of :func:`shard_sizes`.
    """
    sizes = draw(shard_sizes(min_shards=min_shards, max_shards=max_shards, min_size=min_shard_size,
                             max_size=max_shard_size, equal=equal_shards, powers_of_two=powers_of_two))
    f = draw(st.integers(min_features, max_features))
    n = sum(sizes)
    # |G_k| <= 2 n (f+1) M^3; the extra factor N * max n_k keeps G_k / (N n_k) exact too.
    # Taken at the largest sizes, so the bound (and each drawn value) does not move while shrinking.
    n_max = max_shards * max_shard_size
    bound = exact_bound(2 * n_max * (max_features + 1) * max_shards * max_shard_size, factors=3)
    return DPCase(X=draw_ints(draw, (n, f), bound, max_shape=(n_max, max_features)),
                  y=draw_ints(draw, (n,), bound, max_shape=(n_max,)),
                  w=draw_ints(draw, (f,), bound, max_shape=(max_features,)),
                  shard_sizes=tuple(sizes))


@dataclass(frozen=True)
class AccumulationCase:
    """Sequences of tokens split into micro-batches two different ways.

    ``X``: (num_sequences, seq_len, features); ``y``: (num_sequences, seq_len);
    ``w``: (features,); ``mask``: (num_sequences, seq_len) of 0/1 floats (which
    tokens count; every sequence keeps at least one); ``split_a``/``split_b``:
    micro-batch sizes in sequences, each summing to num_sequences.
    """

    X: np.ndarray
    y: np.ndarray
    w: np.ndarray
    mask: np.ndarray
    split_a: tuple[int, ...]
    split_b: tuple[int, ...]

    def __repr__(self) -> str:
        return (f"AccumulationCase(split_a={self.split_a}, split_b={self.split_b}, "
                f"mask={self.mask.astype(int).tolist()}, "
                f"X={self.X.tolist()}, y={self.y.tolist()}, w={self.w.tolist()})")


def _v_accumulation_cases(*, min_sequences: int, max_sequences: int, min_seq_len: int, max_seq_len: int,
                          min_features: int, max_features: int) -> None:
    check_interval("min_sequences", min_sequences, "max_sequences", max_sequences)
    check_interval("min_seq_len", min_seq_len, "max_seq_len", max_seq_len)
    check_interval("min_features", min_features, "max_features", max_features)


def _split(draw: st.DrawFn, total: int) -> tuple[int, ...]:
    cuts = sorted(draw(st.sets(st.integers(1, total - 1), max_size=total - 1))) if total > 1 else []
    edges = [0, *cuts, total]
    return tuple(b - a for a, b in pairwise(edges))


@defines(_v_accumulation_cases)
def accumulation_cases(
    draw: st.DrawFn,
    *,
    min_sequences: int = 1,
    max_sequences: int = 8,
    min_seq_len: int = 1,
    max_seq_len: int = 4,
    min_features: int = 1,
    max_features: int = 3,
) -> AccumulationCase:
    """An :class:`AccumulationCase`: integer-valued data, a token mask, two micro-batch splits."""
    b = draw(st.integers(min_sequences, max_sequences))
    s = draw(st.integers(min_seq_len, max_seq_len))
    f = draw(st.integers(min_features, max_features))
    bound = exact_bound(2 * max_sequences * max_seq_len * (max_features + 1), factors=3)
    big = (max_sequences, max_seq_len)
    mask = np.abs(draw_ints(draw, (b, s), 1, max_shape=big))
    mask[~mask.any(axis=1), 0] = 1.0  # every sequence keeps at least one token (its first)
    return AccumulationCase(X=draw_ints(draw, (b, s, f), bound, max_shape=(*big, max_features)),
                            y=draw_ints(draw, (b, s), bound, max_shape=big),
                            w=draw_ints(draw, (f,), bound, max_shape=(max_features,)),
                            mask=mask, split_a=_split(draw, b), split_b=_split(draw, b))
