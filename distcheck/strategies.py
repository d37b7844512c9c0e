"""Hypothesis strategies for distributed-training inputs, usable in your own ``@given`` tests.

Conventions (Hypothesis' own): every argument is keyword-only, bounds are
``min_*``/``max_*`` pairs, the defaults always generate, bad arguments raise
:class:`hypothesis.errors.InvalidArgument` (a ``TypeError``) when the strategy is
built, with a message like ``Cannot have max_tp=1 < min_tp=2``, and the repr of a
strategy is the call that built it (``shard_sizes(max_shards=4)``).

Array-valued cases hold integer-valued floats bounded by
:func:`distcheck.exactness.max_exact_int`, so a correct sharded computation must
agree with the unsharded one bit for bit (see :mod:`distcheck.exactness`).

Example::

    from hypothesis import given
    from distcheck import strategies as ds

    @given(ds.parallel_configs(max_world_size=64))
    def test_my_mesh(cfg):
        assert my_world_size(cfg) == cfg.tp * cfg.cp * cfg.pp * cfg.dp

Reference modules (``distcheck.layout``, ``distcheck.params``) are imported when
a strategy draws, so importing this module stays cheap.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from math import prod
from typing import Any, Callable

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.extra import numpy as hnp

from distcheck.core.errors import ConfigError
from distcheck.core.exactness import PRECISION_BITS, max_exact_int
from distcheck.core.validate import (
    check_at_least,
    check_choice,
    check_int,
    check_interval,
    check_optional_bool,
    check_subset,
)
from distcheck.core.vocab import LAYOUT_ORDER, Collective, Schedule, names
from distcheck.engine.strategies import BLOCK_LIMIT as _BLOCK_LIMIT  # noqa: F401
from distcheck.engine.strategies import MAGNITUDE_CAP as _MAGNITUDE_CAP  # noqa: F401
from distcheck.engine.strategies import defines as _defines
from distcheck.engine.strategies import draw_ints as _ints
from distcheck.engine.strategies import exact_bound as _exact_bound
from distcheck.engine.strategies import float_dtypes, integer_valued_arrays
from distcheck.engine.strategies import powers_of_two as _powers_of_two

for _public in (float_dtypes, integer_valued_arrays):  # their public path is this module
    _public.__module__ = __name__

__all__ = [
    # shapes and values
    "shard_counts",
    "shard_sizes",
    "float_dtypes",
    "integer_valued_arrays",
    # data-parallel and accumulation
    "DPCase",
    "dp_cases",
    "AccumulationCase",
    "accumulation_cases",
    # tensor parallel
    "LinearCase",
    "linear_cases",
    "MLPCase",
    "mlp_cases",
    "NormCase",
    "norm_cases",
    "AttentionCase",
    "attention_cases",
    # configs
    "parallel_configs",
    "InvalidParallelConfig",
    "invalid_parallel_configs",
    "PipelineParams",
    "pipeline_params",
    "transformer_configs",
    "ZeroCase",
    "zero_cases",
    "CollectiveCase",
    "collective_cases",
]

SCHEDULES = names(Schedule)
COLLECTIVES = names(Collective)
AXIS_NAMES = tuple(axis.value for axis in LAYOUT_ORDER)
# ----------------------------------------------------------------------------------------------
# shard counts, shard sizes, dtypes, arrays


def _v_shard_counts(*, min_shards, max_shards):
    check_interval("min_shards", min_shards, "max_shards", max_shards)


@_defines(_v_shard_counts)
def shard_counts(draw, *, min_shards: int = 1, max_shards: int = 8) -> int:
    """Number of shards (ranks) N.

    - ``min_shards``: >= 1, default 1.
    - ``max_shards``: >= ``min_shards``, default 8.

    >>> shard_counts(max_shards=4).example()  # doctest: +SKIP
    3
    """
    return draw(st.integers(min_shards, max_shards))


def _v_shard_sizes(*, min_shards, max_shards, min_size, max_size, equal, powers_of_two):
    check_interval("min_shards", min_shards, "max_shards", max_shards)
    check_interval("min_size", min_size, "max_size", max_size)
    check_optional_bool("equal", equal)
    check_optional_bool("powers_of_two", powers_of_two)
    sizes = _powers_of_two(min_size, max_size) if powers_of_two else list(range(min_size, max_size + 1))
    if not sizes:
        raise InvalidArgument(f"no power of two lies in [min_size={min_size}, max_size={max_size}]")
    if equal is False:
        if max_shards < 2:
            raise InvalidArgument(f"equal=False needs max_shards >= 2, got max_shards={max_shards}")
        if len(sizes) < 2:
            raise InvalidArgument(
                f"equal=False needs two different sizes in [min_size={min_size}, max_size={max_size}]"
                + (" (powers of two)" if powers_of_two else "")
            )


@_defines(_v_shard_sizes)
def shard_sizes(
    draw,
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


# ----------------------------------------------------------------------------------------------
# data parallelism and gradient accumulation


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


def _v_dp_cases(*, min_shards, max_shards, min_shard_size, max_shard_size, min_features, max_features,
                equal_shards, powers_of_two):
    _v_shard_sizes(min_shards=min_shards, max_shards=max_shards, min_size=min_shard_size, max_size=max_shard_size,
                   equal=equal_shards, powers_of_two=powers_of_two)
    check_interval("min_features", min_features, "max_features", max_features)


@_defines(_v_dp_cases)
def dp_cases(
    draw,
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
    bound = _exact_bound(2 * n_max * (max_features + 1) * max_shards * max_shard_size, factors=3)
    return DPCase(X=_ints(draw, (n, f), bound, max_shape=(n_max, max_features)),
                  y=_ints(draw, (n,), bound, max_shape=(n_max,)),
                  w=_ints(draw, (f,), bound, max_shape=(max_features,)),
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
        return (f"AccumulationCase(split_a={self.split_a}, split_b={self.split_b}, mask={self.mask.astype(int).tolist()}, "
                f"X={self.X.tolist()}, y={self.y.tolist()}, w={self.w.tolist()})")


def _v_accumulation_cases(*, min_sequences, max_sequences, min_seq_len, max_seq_len, min_features, max_features):
    check_interval("min_sequences", min_sequences, "max_sequences", max_sequences)
    check_interval("min_seq_len", min_seq_len, "max_seq_len", max_seq_len)
    check_interval("min_features", min_features, "max_features", max_features)


def _split(draw, total: int) -> tuple[int, ...]:
    cuts = sorted(draw(st.sets(st.integers(1, total - 1), max_size=total - 1))) if total > 1 else []
    edges = [0, *cuts, total]
    return tuple(b - a for a, b in zip(edges, edges[1:]))


@_defines(_v_accumulation_cases)
def accumulation_cases(
    draw,
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
    bound = _exact_bound(2 * max_sequences * max_seq_len * (max_features + 1), factors=3)
    big = (max_sequences, max_seq_len)
    mask = np.abs(_ints(draw, (b, s), 1, max_shape=big))
    mask[~mask.any(axis=1), 0] = 1.0  # every sequence keeps at least one token (its first)
    return AccumulationCase(X=_ints(draw, (b, s, f), bound, max_shape=(*big, max_features)),
                            y=_ints(draw, (b, s), bound, max_shape=big),
                            w=_ints(draw, (f,), bound, max_shape=(max_features,)),
                            mask=mask, split_a=_split(draw, b), split_b=_split(draw, b))


# ----------------------------------------------------------------------------------------------
# tensor parallelism


@dataclass(frozen=True)
class LinearCase:
    """``x`` (batch, in_features) @ ``W`` (in_features, out_features) ``+ b`` (out_features,
    or None) over ``tp`` shards (``tp`` need not divide either width: shards then follow
    numpy.array_split)."""

    x: np.ndarray
    W: np.ndarray
    tp: int
    b: np.ndarray | None = None

    def __repr__(self) -> str:
        bias = "" if self.b is None else f", b={self.b.tolist()}"
        return f"LinearCase(tp={self.tp}, x={self.x.tolist()}, W={self.W.tolist()}{bias})"


def _v_tp(min_tp, max_tp, min_batch, max_batch):
    check_interval("min_tp", min_tp, "max_tp", max_tp)
    check_interval("min_batch", min_batch, "max_batch", max_batch)


def _v_linear_cases(*, min_tp, max_tp, min_batch, max_batch, min_features, max_features, divisible, bias):
    _v_tp(min_tp, max_tp, min_batch, max_batch)
    check_interval("min_features", min_features, "max_features", max_features)
    check_optional_bool("divisible", divisible)
    check_optional_bool("bias", bias)


def _width(draw, tp: int, low: int, high: int, divisible: bool | None) -> int:
    if divisible:
        k_low, k_high = max(1, -(-low // tp)), max(1, high // tp)
        return tp * draw(st.integers(k_low, max(k_low, k_high)))
    return draw(st.integers(low, high))


@_defines(_v_linear_cases)
def linear_cases(
    draw,
    *,
    min_tp: int = 1,
    max_tp: int = 8,
    min_batch: int = 1,
    max_batch: int = 4,
    min_features: int = 1,
    max_features: int = 8,
    divisible: bool | None = None,
    bias: bool | None = None,
) -> LinearCase:
    """A :class:`LinearCase` with both widths >= tp (every shard non-empty; a width is
    raised to tp when ``max_features < tp``). ``divisible=True`` makes tp divide both
    widths; None/False (default None): any widths, so shards may be uneven.
    ``bias``: include a bias ``b`` (out_features,) (True), never (False), either (None)."""
    tp = draw(st.integers(min_tp, max_tp))
    low, high = max(min_features, tp), max(max_features, tp)  # every shard gets >= 1 row/column
    k = _width(draw, tp, low, high, divisible)
    n = _width(draw, tp, low, high, divisible)
    wide = max(max_features, max_tp)  # the largest width any draw can have
    bound = _exact_bound(wide + 1, factors=2)
    use_bias = draw(st.booleans()) if bias is None else bias
    batch = draw(st.integers(min_batch, max_batch))
    return LinearCase(x=_ints(draw, (batch, k), bound, max_shape=(max_batch, wide)),
                      W=_ints(draw, (k, n), bound, max_shape=(wide, wide)),
                      tp=tp, b=_ints(draw, (n,), bound, max_shape=(wide,)) if use_bias else None)


@dataclass(frozen=True)
class MLPCase:
    """A transformer MLP ``act(x @ W_up [* gate]) @ W_down`` over ``tp`` shards.

    ``x``: (batch, hidden); ``W_up``: (hidden, ffn); ``W_down``: (ffn, hidden);
    ``W_gate``: (hidden, ffn) for SwiGLU, else None; ``b_down``: (hidden,) bias of
    the down projection or None. Integer-valued, bounded so ``relu(x W_up) W_down``
    is exact (``max_exact_int(hidden*ffn, factors=3)``).
    """

    x: np.ndarray
    W_up: np.ndarray
    W_down: np.ndarray
    tp: int
    W_gate: np.ndarray | None = None
    b_down: np.ndarray | None = None

    def __repr__(self) -> str:
        parts = [f"tp={self.tp}", f"x={self.x.tolist()}", f"W_up={self.W_up.tolist()}", f"W_down={self.W_down.tolist()}"]
        if self.W_gate is not None:
            parts.append(f"W_gate={self.W_gate.tolist()}")
        if self.b_down is not None:
            parts.append(f"b_down={self.b_down.tolist()}")
        return f"MLPCase({', '.join(parts)})"


def _v_mlp_cases(*, min_tp, max_tp, min_batch, max_batch, min_hidden, max_hidden, min_ffn, max_ffn, swiglu, bias):
    _v_tp(min_tp, max_tp, min_batch, max_batch)
    check_interval("min_hidden", min_hidden, "max_hidden", max_hidden)
    check_interval("min_ffn", min_ffn, "max_ffn", max_ffn)
    check_optional_bool("swiglu", swiglu)
    check_optional_bool("bias", bias)


@_defines(_v_mlp_cases)
def mlp_cases(
    draw,
    *,
    min_tp: int = 1,
    max_tp: int = 8,
    min_batch: int = 1,
    max_batch: int = 3,
    min_hidden: int = 1,
    max_hidden: int = 6,
    min_ffn: int = 1,
    max_ffn: int = 8,
    swiglu: bool | None = False,
    bias: bool | None = None,
) -> MLPCase:
    """An :class:`MLPCase`. ``tp`` need not divide ``ffn`` (uneven shards); ffn >= tp.

    - ``swiglu``: True: a gate matrix is included; False (default): plain MLP; None: either.
    - ``bias``: include a down-projection bias (True), never (False), either (None, default).
    """
    tp = draw(st.integers(min_tp, max_tp))
    h = draw(st.integers(min_hidden, max_hidden))
    f = draw(st.integers(max(min_ffn, tp), max(max_ffn, tp)))  # ffn >= tp: every shard non-empty
    use_gate = draw(st.booleans()) if swiglu is None else swiglu
    use_bias = draw(st.booleans()) if bias is None else bias
    # relu(x W_up) * (x W_gate) @ W_down: products of up to 5 entries along h*h*f terms
    # (bound taken at the largest sizes, so it does not move while shrinking)
    H, F = max_hidden, max(max_ffn, max_tp)
    bound = _exact_bound(H * H * F + 1, factors=5) if use_gate else _exact_bound(H * F + 1, factors=3)
    batch = draw(st.integers(min_batch, max_batch))
    return MLPCase(
        x=_ints(draw, (batch, h), bound, max_shape=(max_batch, H)),
        W_up=_ints(draw, (h, f), bound, max_shape=(H, F)),
        W_down=_ints(draw, (f, h), bound, max_shape=(F, H)),
        tp=tp,
        W_gate=_ints(draw, (h, f), bound, max_shape=(H, F)) if use_gate else None,
        b_down=_ints(draw, (h,), bound, max_shape=(H,)) if use_bias else None,
    )


@dataclass(frozen=True)
class NormCase:
    """Layer norm of ``x`` (batch, hidden) whose hidden dim is sharded over ``tp`` ranks."""

    x: np.ndarray
    tp: int

    def __repr__(self) -> str:
        return f"NormCase(tp={self.tp}, x={self.x.tolist()})"


def _v_norm_cases(*, min_tp, max_tp, min_batch, max_batch, min_hidden, max_hidden):
    _v_tp(min_tp, max_tp, min_batch, max_batch)
    check_interval("min_hidden", min_hidden, "max_hidden", max_hidden)


@_defines(_v_norm_cases)
def norm_cases(draw, *, min_tp: int = 1, max_tp: int = 4, min_batch: int = 1, max_batch: int = 3,
               min_hidden: int = 1, max_hidden: int = 8) -> NormCase:
    """A :class:`NormCase`: ``hidden`` is a power of two >= tp (so the mean and the
    variance of a row of small integers are exact dyadic numbers and layer norm is
    deterministic to the bit), entries integers in [-16, 16]."""
    tp = draw(st.integers(min_tp, max_tp))
    h = draw(st.sampled_from(_powers_of_two(max(min_hidden, tp), max(max_hidden, 2 * tp))))
    batch = draw(st.integers(min_batch, max_batch))
    return NormCase(x=_ints(draw, (batch, h), 16, max_shape=(max_batch, max(max_hidden, 2 * max_tp))), tp=tp)


@dataclass(frozen=True)
class AttentionCase:
    """Self-attention inputs: ``x`` (seq, hidden); ``Wq`` (hidden, heads*head_dim);
    ``Wk``/``Wv`` (hidden, kv_heads*head_dim); ``Wo`` (heads*head_dim, hidden); ``tp``
    divides ``num_kv_heads`` (heads are never split across ranks). Small integer values."""

    x: np.ndarray
    Wq: np.ndarray
    Wk: np.ndarray
    Wv: np.ndarray
    Wo: np.ndarray
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tp: int

    def __repr__(self) -> str:
        return (f"AttentionCase(tp={self.tp}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, x={self.x.tolist()}, Wq={self.Wq.tolist()}, Wk={self.Wk.tolist()}, "
                f"Wv={self.Wv.tolist()}, Wo={self.Wo.tolist()})")


def _v_attention_cases(*, min_tp, max_tp, max_kv_heads, max_group, min_seq, max_seq, max_head_dim, max_hidden):
    check_interval("min_tp", min_tp, "max_tp", max_tp)
    check_at_least("max_kv_heads", max_kv_heads, 1)
    check_at_least("max_group", max_group, 1)
    check_interval("min_seq", min_seq, "max_seq", max_seq)
    check_at_least("max_head_dim", max_head_dim, 1)
    check_at_least("max_hidden", max_hidden, 1)
    if not any(kv % t == 0 for t in range(min_tp, max_tp + 1) for kv in range(1, max_kv_heads + 1)):
        raise InvalidArgument(f"no tp in [min_tp={min_tp}, max_tp={max_tp}] divides a kv head count <= max_kv_heads={max_kv_heads}")


@_defines(_v_attention_cases)
def attention_cases(
    draw,
    *,
    min_tp: int = 1,
    max_tp: int = 4,
    max_kv_heads: int = 4,
    max_group: int = 3,
    min_seq: int = 1,
    max_seq: int = 4,
    max_head_dim: int = 3,
    max_hidden: int = 6,
) -> AttentionCase:
    """An :class:`AttentionCase` (GQA when num_heads > num_kv_heads)."""
    pairs = [(t, kv) for t in range(min_tp, max_tp + 1) for kv in range(1, max_kv_heads + 1) if kv % t == 0]
    tp, kv = draw(st.sampled_from(pairs))
    H = kv * draw(st.integers(1, max_group))
    e = draw(st.integers(1, max_head_dim))
    h = draw(st.integers(1, max_hidden))
    s = draw(st.integers(min_seq, max_seq))
    q_max = max(k for _, k in pairs) * max_group * max_head_dim  # widest q projection any draw can have
    kv_max = max(k for _, k in pairs) * max_head_dim
    return AttentionCase(x=_ints(draw, (s, h), 3, max_shape=(max_seq, max_hidden)),
                         Wq=_ints(draw, (h, H * e), 2, max_shape=(max_hidden, q_max)),
                         Wk=_ints(draw, (h, kv * e), 2, max_shape=(max_hidden, kv_max)),
                         Wv=_ints(draw, (h, kv * e), 2, max_shape=(max_hidden, kv_max)),
                         Wo=_ints(draw, (H * e, h), 2, max_shape=(q_max, max_hidden)),
                         num_heads=H, num_kv_heads=kv, head_dim=e, tp=tp)


# ----------------------------------------------------------------------------------------------
# parallel configs


def _v_parallel_configs(*, min_tp, max_tp, min_pp, max_pp, min_dp, max_dp, min_cp, max_cp, max_ep,
                        max_world_size, min_gpus_per_node, max_gpus_per_node, any_order):
    for a in AXIS_NAMES:
        check_interval(f"min_{a}", locals()[f"min_{a}"], f"max_{a}", locals()[f"max_{a}"])
    check_at_least("max_ep", max_ep, 1)
    check_at_least("max_world_size", max_world_size, 1)
    check_interval("min_gpus_per_node", min_gpus_per_node, "max_gpus_per_node", max_gpus_per_node)
    check_optional_bool("any_order", any_order)
    least = min_tp * min_pp * min_dp * min_cp
    if least > max_world_size:
        raise InvalidArgument(
            f"Cannot have max_world_size={max_world_size} < min_tp*min_cp*min_pp*min_dp = "
            f"{min_tp}*{min_cp}*{min_pp}*{min_dp} = {least}"
        )


@_defines(_v_parallel_configs)
def parallel_configs(
    draw,
    *,
    min_tp: int = 1, max_tp: int = 8,
    min_pp: int = 1, max_pp: int = 8,
    min_dp: int = 1, max_dp: int = 16,
    min_cp: int = 1, max_cp: int = 1,
    max_ep: int = 1,
    max_world_size: int = 256,
    min_gpus_per_node: int = 1, max_gpus_per_node: int = 8,
    any_order: bool = False,
):
    """A valid :class:`distcheck.layout.ParallelConfig` with ``world_size <= max_world_size``.

    - ``min_<axis>``/``max_<axis>`` for tp, pp, dp, cp: degree bounds (>= 1);
      defaults tp 1..8, pp 1..8, dp 1..16, cp 1..1.
    - ``max_ep``: ep is drawn among the divisors of dp*cp up to this (default 1).
    - ``max_world_size``: >= the product of the minimum degrees; default 256.
    - ``min_gpus_per_node``/``max_gpus_per_node``: default 1..8.
    - ``any_order``: False (default): Llama 3's order tp-cp-pp-dp; True: a random permutation.
    """
    from distcheck.layout import ParallelConfig

    mins = {"tp": min_tp, "cp": min_cp, "pp": min_pp, "dp": min_dp}
    maxs = {"tp": max_tp, "cp": max_cp, "pp": max_pp, "dp": max_dp}
    degrees: dict[str, int] = {}
    budget = max_world_size
    for i, a in enumerate(AXIS_NAMES):
        rest = prod(mins[b] for b in AXIS_NAMES[i + 1:])
        high = min(maxs[a], budget // rest)
        degrees[a] = draw(st.integers(mins[a], max(mins[a], high)))
        budget //= degrees[a]
    data = degrees["dp"] * degrees["cp"]
    ep = draw(st.sampled_from([e for e in range(1, min(max_ep, data) + 1) if data % e == 0]))
    gpn = draw(st.integers(min_gpus_per_node, max_gpus_per_node))
    order = tuple(draw(st.permutations(AXIS_NAMES))) if any_order else None
    return ParallelConfig(**degrees, ep=ep, gpus_per_node=gpn, order=order)


@dataclass(frozen=True)
class InvalidParallelConfig:
    """Keyword arguments that ParallelConfig must reject, and the field its ConfigError must name."""

    kwargs: dict = field(hash=False)
    field: str
    reason: str


def _v_invalid_parallel_configs():
    pass


@_defines(_v_invalid_parallel_configs)
def invalid_parallel_configs(draw) -> InvalidParallelConfig:
    """An :class:`InvalidParallelConfig`: one rule of ParallelConfig broken, the others kept.

    Kinds: a degree < 1 or not an int (field = that degree), ``world_size`` not the
    product of the degrees, ``ep`` not dividing ``dp*cp``, an unknown or repeated axis
    in ``order``, ``order`` omitting an axis of degree > 1, an unknown ``ep_placement``.
    """
    base = {a: draw(st.integers(1, 4)) for a in AXIS_NAMES}
    kind = draw(st.sampled_from(["degree", "not_int", "world_size", "ep", "order_unknown", "order_repeat",
                                 "order_missing", "ep_placement", "gpus_per_node"]))
    if kind == "degree":
        a = draw(st.sampled_from(AXIS_NAMES + ("ep",)))
        return InvalidParallelConfig({**base, a: draw(st.integers(-3, 0))}, a, "degree < 1")
    if kind == "not_int":
        a = draw(st.sampled_from(AXIS_NAMES))
        return InvalidParallelConfig({**base, a: draw(st.sampled_from([True, 2.0, "2", None]))}, a, "degree not an int")
    if kind == "world_size":
        product = prod(base.values())
        wrong = draw(st.integers(1, 4 * product).filter(lambda w: w != product))
        return InvalidParallelConfig({**base, "world_size": wrong}, "world_size", "world_size != product of degrees")
    if kind == "ep":
        data = base["dp"] * base["cp"]
        ep = draw(st.integers(2, 2 * data + 2).filter(lambda e: data % e != 0))
        return InvalidParallelConfig({**base, "ep": ep}, "ep", "ep does not divide dp*cp")
    if kind == "order_unknown":
        bad = draw(st.sampled_from(["xp", "sp", "fsdp", "TP"]))
        return InvalidParallelConfig({**base, "order": ("tp", bad, "pp", "dp")}, "order", "unknown axis")
    if kind == "order_repeat":
        a = draw(st.sampled_from(AXIS_NAMES))
        return InvalidParallelConfig({**base, "order": (a, a)}, "order", "repeated axis")
    if kind == "order_missing":
        a = draw(st.sampled_from(AXIS_NAMES))
        base[a] = max(base[a], 2)
        return InvalidParallelConfig({**base, "order": tuple(b for b in AXIS_NAMES if b != a)}, "order",
                                     f"order omits {a} of degree > 1")
    if kind == "ep_placement":
        return InvalidParallelConfig({**base, "ep_placement": draw(st.sampled_from(["inside", "dp", ""]))},
                                     "ep_placement", "unknown placement")
    return InvalidParallelConfig({**base, "gpus_per_node": draw(st.integers(-2, 0))}, "gpus_per_node", "gpus_per_node < 1")


# ----------------------------------------------------------------------------------------------
# pipeline


@dataclass(frozen=True)
class PipelineParams:
    """Inputs of :func:`distcheck.pipeline.simulate` and the ``pipeline.*`` closed forms."""

    schedule: str
    p: int
    m: int
    v: int = 1
    t_f: int = 1
    t_b: int = 2

    def as_kwargs(self) -> dict:
        return dict(schedule=self.schedule, p=self.p, m=self.m, v=self.v, t_f=self.t_f, t_b=self.t_b)


def _interleaved_stages(min_stages, max_stages, min_microbatches, max_microbatches) -> list[int]:
    return [p for p in range(min_stages, max_stages + 1) if -(-min_microbatches // p) * p <= max_microbatches]


def _v_pipeline_params(*, schedules, min_stages, max_stages, min_microbatches, max_microbatches, min_v, max_v,
                       min_t_f, max_t_f, min_t_b, max_t_b):
    chosen = check_subset("schedules", schedules, SCHEDULES)
    check_interval("min_stages", min_stages, "max_stages", max_stages)
    check_interval("min_microbatches", min_microbatches, "max_microbatches", max_microbatches)
    check_interval("min_v", min_v, "max_v", max_v, at_least=2)
    check_interval("min_t_f", min_t_f, "max_t_f", max_t_f)
    check_interval("min_t_b", min_t_b, "max_t_b", max_t_b)
    if chosen == (Schedule.INTERLEAVED,) and not _interleaved_stages(min_stages, max_stages, min_microbatches, max_microbatches):
        raise InvalidArgument(
            f"the interleaved schedule needs m to be a multiple of p, and no m in [min_microbatches={min_microbatches}, "
            f"max_microbatches={max_microbatches}] is a multiple of any p in [min_stages={min_stages}, max_stages={max_stages}]"
        )


@_defines(_v_pipeline_params)
def pipeline_params(
    draw,
    *,
    schedules: tuple[str, ...] = SCHEDULES,
    min_stages: int = 1, max_stages: int = 8,
    min_microbatches: int = 1, max_microbatches: int = 16,
    min_v: int = 2, max_v: int = 4,
    min_t_f: int = 1, max_t_f: int = 3,
    min_t_b: int = 1, max_t_b: int = 6,
) -> PipelineParams:
    """A :class:`PipelineParams` respecting its schedule's constraints.

    - ``schedules``: subset of ("gpipe", "1f1b", "interleaved"); default all three.
    - gpipe/1f1b: v = 1, any p, m. interleaved: v in [min_v, max_v] (>= 2) and
      m a multiple of p (Narayanan et al. 2021 §2.2.2); an interleaved draw whose
      ranges admit no such (p, m) falls back to another schedule.
    - ``t_f``, ``t_b``: integer ticks per forward / backward (defaults 1..3, 1..6).
    """
    feasible = _interleaved_stages(min_stages, max_stages, min_microbatches, max_microbatches)
    options = tuple(s for s in schedules if s != Schedule.INTERLEAVED or feasible)
    schedule = draw(st.sampled_from(options))
    t_f = draw(st.integers(min_t_f, max_t_f))
    t_b = draw(st.integers(min_t_b, max_t_b))
    if schedule == Schedule.INTERLEAVED:
        p = draw(st.sampled_from(feasible))
        k = draw(st.integers(-(-min_microbatches // p), max_microbatches // p))
        return PipelineParams(schedule, p, k * p, draw(st.integers(min_v, max_v)), t_f, t_b)
    p = draw(st.integers(min_stages, max_stages))
    m = draw(st.integers(min_microbatches, max_microbatches))
    return PipelineParams(schedule, p, m, 1, t_f, t_b)


# ----------------------------------------------------------------------------------------------
# transformer configs


def _v_transformer_configs(*, min_layers, max_layers, max_kv_heads, max_group, max_head_dim, min_ffn, max_ffn,
                           min_vocab, max_vocab, gqa, swiglu, tied):
    check_interval("min_layers", min_layers, "max_layers", max_layers)
    check_at_least("max_kv_heads", max_kv_heads, 1)
    check_at_least("max_group", max_group, 1)
    check_at_least("max_head_dim", max_head_dim, 1)
    check_interval("min_ffn", min_ffn, "max_ffn", max_ffn)
    check_interval("min_vocab", min_vocab, "max_vocab", max_vocab)
    for name, value in (("gqa", gqa), ("swiglu", swiglu), ("tied", tied)):
        check_optional_bool(name, value)
    if gqa and max_group < 2:
        raise InvalidArgument(f"gqa=True needs max_group >= 2 (num_heads = group * num_kv_heads), got max_group={max_group}")


@_defines(_v_transformer_configs)
def transformer_configs(
    draw,
    *,
    min_layers: int = 1, max_layers: int = 4,
    max_kv_heads: int = 4, max_group: int = 4, max_head_dim: int = 16,
    min_ffn: int = 1, max_ffn: int = 256,
    min_vocab: int = 1, max_vocab: int = 512,
    gqa: bool | None = None,
    swiglu: bool | None = None,
    tied: bool | None = None,
):
    """A valid :class:`distcheck.params.TransformerConfig`.

    num_heads = num_kv_heads * group, with num_kv_heads in 1..max_kv_heads and group
    in 1..max_group; head_dim in 1..max_head_dim; hidden_size = num_heads * head_dim
    or (half the time) an explicit head_dim with any hidden size.

    - ``gqa``: True: num_kv_heads < num_heads; False: equal (MHA); None: either.
    - ``swiglu``, ``tied``: force the option on/off, or None (default) to draw it.
    Norm kind and biases are drawn.
    """
    from distcheck.params import NORMS, TransformerConfig

    kv = draw(st.integers(1, max_kv_heads))
    if gqa is None:
        group = draw(st.integers(1, max_group))
    elif gqa:
        group = draw(st.integers(2, max_group))
    else:
        group = 1
    heads = kv * group
    head_dim = draw(st.integers(1, max_head_dim))
    explicit = draw(st.booleans())
    hidden = draw(st.integers(1, heads * max_head_dim)) if explicit else heads * head_dim
    return TransformerConfig(
        hidden_size=hidden,
        num_layers=draw(st.integers(min_layers, max_layers)),
        ffn_hidden_size=draw(st.integers(min_ffn, max_ffn)),
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim if explicit else None,
        vocab_size=draw(st.integers(min_vocab, max_vocab)),
        swiglu=draw(st.booleans()) if swiglu is None else swiglu,
        tied_embeddings=draw(st.booleans()) if tied is None else tied,
        norm=draw(st.sampled_from(NORMS)),
        final_norm=draw(st.booleans()),
        qkv_bias=draw(st.booleans()),
        mlp_bias=draw(st.booleans()),
        out_bias=draw(st.booleans()),
    )


# ----------------------------------------------------------------------------------------------
# ZeRO and collectives


@dataclass(frozen=True)
class ZeroCase:
    """ZeRO inputs: ``params`` (Ψ), ``dp`` (N_d ranks) and ``k`` (optimizer bytes per param)."""

    params: int
    dp: int
    k: int = 12


def _v_zero_cases(*, min_params, max_params, min_dp, max_dp, ks):
    check_interval("min_params", min_params, "max_params", max_params)
    check_interval("min_dp", min_dp, "max_dp", max_dp)
    try:
        items = tuple(ks)
    except TypeError:
        raise ConfigError("ks", ks, "must be a sequence of ints") from None
    if not items:
        raise ConfigError("ks", ks, "must not be empty")
    for k in items:
        check_at_least("ks[]", k, 0)


@_defines(_v_zero_cases)
def zero_cases(
    draw,
    *,
    min_params: int = 1, max_params: int = 10**12,
    min_dp: int = 1, max_dp: int = 1024,
    ks: tuple[int, ...] = (12,),
) -> ZeroCase:
    """A :class:`ZeroCase`; ``ks``: optimizer bytes per parameter to draw from (default (12,), ZeRO's K)."""
    return ZeroCase(draw(st.integers(min_params, max_params)), draw(st.integers(min_dp, max_dp)),
                    draw(st.sampled_from(tuple(ks))))


@dataclass(frozen=True)
class CollectiveCase:
    """A collective over ``n`` ranks of a FULL tensor of ``size_bytes`` (nccl-tests convention)."""

    collective: str
    size_bytes: int
    n: int
    dtype: str = "int64"


def _v_collective_cases(*, collectives, min_ranks, max_ranks, min_elements, max_elements):
    check_subset("collectives", collectives, COLLECTIVES)
    check_interval("min_ranks", min_ranks, "max_ranks", max_ranks)
    check_interval("min_elements", min_elements, "max_elements", max_elements, at_least=0)


@_defines(_v_collective_cases)
def collective_cases(
    draw,
    *,
    collectives: tuple[str, ...] = COLLECTIVES,
    min_ranks: int = 1, max_ranks: int = 8,
    min_elements: int = 0, max_elements: int = 64,
) -> CollectiveCase:
    """A :class:`CollectiveCase` (int64 elements, so sizes are multiples of 8 bytes;
    element counts need not divide by n)."""
    dtype = draw(st.sampled_from(("int64", "int32")))
    count = draw(st.integers(min_elements, max_elements))
    return CollectiveCase(draw(st.sampled_from(tuple(collectives))), count * np.dtype(dtype).itemsize,
                          draw(st.integers(min_ranks, max_ranks)), dtype)


def _check_all() -> None:
    public = {n for n, v in globals().items() if not n.startswith("_") and getattr(v, "__module__", None) == __name__}
    missing = public - set(__all__)
    if missing:  # pragma: no cover - caught by the tests at import
        raise RuntimeError(f"public names missing from __all__: {sorted(missing)}")


_check_all()
