"""Hypothesis strategies of tensor parallelism: linear layers, MLPs (ReLU and SwiGLU), layer norm
over a sharded hidden dim, and GQA attention, over any tp (uneven shards by default).

Public path: :mod:`distcheck.strategies` (Hypothesis' conventions are listed there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from distcheck.core.validate import check_at_least, check_interval, check_optional_bool
from distcheck.engine.strategies import defines, draw_ints, exact_bound
from distcheck.engine.strategies import powers_of_two as _powers_of_two

__all__ = ["LinearCase", "linear_cases", "MLPCase", "mlp_cases", "NormCase", "norm_cases", "AttentionCase",
           "attention_cases"]


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


def _v_tp(min_tp: int, max_tp: int, min_batch: int, max_batch: int) -> None:
    check_interval("min_tp", min_tp, "max_tp", max_tp)
    check_interval("min_batch", min_batch, "max_batch", max_batch)


def _check_magnitude(max_magnitude: int | None) -> None:
    if max_magnitude is not None:
        check_at_least("max_magnitude", max_magnitude, 0)


def _v_linear_cases(*, min_tp: int, max_tp: int, min_batch: int, max_batch: int, min_features: int, max_features: int,
                    divisible: bool | None, bias: bool | None,
                    max_magnitude: int | None) -> None:
    _v_tp(min_tp, max_tp, min_batch, max_batch)
    check_interval("min_features", min_features, "max_features", max_features)
    check_optional_bool("divisible", divisible)
    check_optional_bool("bias", bias)
    _check_magnitude(max_magnitude)


def _width(draw: st.DrawFn, tp: int, low: int, high: int, divisible: bool | None) -> int:
    if divisible:
        k_low, k_high = max(1, -(-low // tp)), max(1, high // tp)
        return tp * draw(st.integers(k_low, max(k_low, k_high)))
    return draw(st.integers(low, high))


@defines(_v_linear_cases)
def linear_cases(
    draw: st.DrawFn,
    *,
    min_tp: int = 1,
    max_tp: int = 8,
    min_batch: int = 1,
    max_batch: int = 4,
    min_features: int = 1,
    max_features: int = 8,
    divisible: bool | None = None,
    bias: bool | None = None,
    max_magnitude: int | None = None,
) -> LinearCase:
    """A :class:`LinearCase` with both widths >= tp (every shard non-empty; a width is
    raised to tp when ``max_features < tp``). ``divisible=True`` makes tp divide both
    widths; None/False (default None): any widths, so shards may be uneven.
    ``bias``: include a bias ``b`` (out_features,) (True), never (False), either (None).
    ``max_magnitude``: a further cap on the entries (e.g. from
    ``exactness.max_exact_int(..., dtype="bfloat16")`` for a narrower format); default None:
    the float64 exactness bound, capped at 64."""
    tp = draw(st.integers(min_tp, max_tp))
    low, high = max(min_features, tp), max(max_features, tp)  # every shard gets >= 1 row/column
    k = _width(draw, tp, low, high, divisible)
    n = _width(draw, tp, low, high, divisible)
    wide = max(max_features, max_tp)  # the largest width any draw can have
    bound = exact_bound(wide + 1, factors=2)
    bound = bound if max_magnitude is None else min(bound, max_magnitude)
    use_bias = draw(st.booleans()) if bias is None else bias
    batch = draw(st.integers(min_batch, max_batch))
    return LinearCase(x=draw_ints(draw, (batch, k), bound, max_shape=(max_batch, wide)),
                      W=draw_ints(draw, (k, n), bound, max_shape=(wide, wide)),
                      tp=tp, b=draw_ints(draw, (n,), bound, max_shape=(wide,)) if use_bias else None)


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
        parts = [f"tp={self.tp}", f"x={self.x.tolist()}", f"W_up={self.W_up.tolist()}",
                 f"W_down={self.W_down.tolist()}"]
        if self.W_gate is not None:
            parts.append(f"W_gate={self.W_gate.tolist()}")
        if self.b_down is not None:
            parts.append(f"b_down={self.b_down.tolist()}")
        return f"MLPCase({', '.join(parts)})"


def _v_mlp_cases(*, min_tp: int, max_tp: int, min_batch: int, max_batch: int, min_hidden: int, max_hidden: int,
                 min_ffn: int, max_ffn: int, swiglu: bool | None, bias: bool | None,
                 divisible: bool | None, max_magnitude: int | None) -> None:
    _v_tp(min_tp, max_tp, min_batch, max_batch)
    check_interval("min_hidden", min_hidden, "max_hidden", max_hidden)
    check_interval("min_ffn", min_ffn, "max_ffn", max_ffn)
    check_optional_bool("swiglu", swiglu)
    check_optional_bool("bias", bias)
    check_optional_bool("divisible", divisible)
    _check_magnitude(max_magnitude)


@defines(_v_mlp_cases)
def mlp_cases(
    draw: st.DrawFn,
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
    divisible: bool | None = None,
    max_magnitude: int | None = None,
) -> MLPCase:
    """An :class:`MLPCase`. ``tp`` need not divide ``ffn`` (uneven shards); ffn >= tp.

    - ``swiglu``: True: a gate matrix is included; False (default): plain MLP; None: either.
    - ``bias``: include a down-projection bias (True), never (False), either (None, default).
    - ``divisible``: True makes tp divide ``ffn`` (the sharded width); None/False: any ffn >= tp.
    - ``max_magnitude``: a further cap on the entries (default None: the float64 exactness bound).
    """
    tp = draw(st.integers(min_tp, max_tp))
    h = draw(st.integers(min_hidden, max_hidden))
    f = _width(draw, tp, max(min_ffn, tp), max(max_ffn, tp), divisible)  # ffn >= tp: every shard non-empty
    use_gate = draw(st.booleans()) if swiglu is None else swiglu
    use_bias = draw(st.booleans()) if bias is None else bias
    # relu(x W_up) * (x W_gate) @ W_down: products of up to 5 entries along h*h*f terms
    # (bound taken at the largest sizes, so it does not move while shrinking)
    H, F = max_hidden, max(max_ffn, max_tp)
    bound = exact_bound(H * H * F + 1, factors=5) if use_gate else exact_bound(H * F + 1, factors=3)
    bound = bound if max_magnitude is None else min(bound, max_magnitude)
    batch = draw(st.integers(min_batch, max_batch))
    return MLPCase(
        x=draw_ints(draw, (batch, h), bound, max_shape=(max_batch, H)),
        W_up=draw_ints(draw, (h, f), bound, max_shape=(H, F)),
        W_down=draw_ints(draw, (f, h), bound, max_shape=(F, H)),
        tp=tp,
        W_gate=draw_ints(draw, (h, f), bound, max_shape=(H, F)) if use_gate else None,
        b_down=draw_ints(draw, (h,), bound, max_shape=(H,)) if use_bias else None,
    )


@dataclass(frozen=True)
class NormCase:
    """Layer norm of ``x`` (batch, hidden) whose hidden dim is sharded over ``tp`` ranks."""

    x: np.ndarray
    tp: int

    def __repr__(self) -> str:
        return f"NormCase(tp={self.tp}, x={self.x.tolist()})"


def _v_norm_cases(*, min_tp: int, max_tp: int, min_batch: int, max_batch: int, min_hidden: int,
                  max_hidden: int) -> None:
    _v_tp(min_tp, max_tp, min_batch, max_batch)
    check_interval("min_hidden", min_hidden, "max_hidden", max_hidden)


@defines(_v_norm_cases)
def norm_cases(draw: st.DrawFn, *, min_tp: int = 1, max_tp: int = 4, min_batch: int = 1, max_batch: int = 3,
               min_hidden: int = 1, max_hidden: int = 8) -> NormCase:
    """A :class:`NormCase`: ``hidden`` is a power of two >= tp (so the mean and the
    variance of a row of small integers are exact dyadic numbers and layer norm is
    deterministic to the bit), entries integers in [-16, 16]."""
    tp = draw(st.integers(min_tp, max_tp))
    h = draw(st.sampled_from(_powers_of_two(max(min_hidden, tp), max(max_hidden, 2 * tp))))
    batch = draw(st.integers(min_batch, max_batch))
    return NormCase(x=draw_ints(draw, (batch, h), 16, max_shape=(max_batch, max(max_hidden, 2 * max_tp))), tp=tp)


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


def _v_attention_cases(*, min_tp: int, max_tp: int, max_kv_heads: int, max_group: int, min_seq: int, max_seq: int,
                       max_head_dim: int, max_hidden: int) -> None:
    check_interval("min_tp", min_tp, "max_tp", max_tp)
    check_at_least("max_kv_heads", max_kv_heads, 1)
    check_at_least("max_group", max_group, 1)
    check_interval("min_seq", min_seq, "max_seq", max_seq)
    check_at_least("max_head_dim", max_head_dim, 1)
    check_at_least("max_hidden", max_hidden, 1)
    if not any(kv % t == 0 for t in range(min_tp, max_tp + 1) for kv in range(1, max_kv_heads + 1)):
        raise InvalidArgument(f"no tp in [min_tp={min_tp}, max_tp={max_tp}] divides a kv head count "
                              f"<= max_kv_heads={max_kv_heads}")


@defines(_v_attention_cases)
def attention_cases(
    draw: st.DrawFn,
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
    return AttentionCase(x=draw_ints(draw, (s, h), 3, max_shape=(max_seq, max_hidden)),
                         Wq=draw_ints(draw, (h, H * e), 2, max_shape=(max_hidden, q_max)),
                         Wk=draw_ints(draw, (h, kv * e), 2, max_shape=(max_hidden, kv_max)),
                         Wv=draw_ints(draw, (h, kv * e), 2, max_shape=(max_hidden, kv_max)),
                         Wo=draw_ints(draw, (H * e, h), 2, max_shape=(q_max, max_hidden)),
                         num_heads=H, num_kv_heads=kv, head_dim=e, tp=tp)
