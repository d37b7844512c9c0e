"""Hypothesis strategies of sequence-parallel blocks: the MLP and attention blocks, the layer norm's
gradients, and collective sizes.

Exact layer norm. Every token is drawn as ``x_t = m_t + c_t z_t`` with ``z_t`` a balanced vector of
+1 and -1 (h even), ``m_t`` an integer and ``c_t >= 1`` an integer: its mean is ``m_t`` and its
variance ``c_t**2``, both exact in any summation order, so with ``eps = 0`` the normalised token is
exactly ``z_t`` in float64 and the layer norm's output ``weight * z_t + bias`` is an integer vector.
What follows (the linears, ReLU, dropout at p = 1/2, the residual) then stays in small integers,
exact in every order: the sequence-parallel MLP block equals the single-device block bit for bit.
Tokens differ in ``m_t`` and ``c_t``, so statistics taken over a shard instead of per token change
the result.

Public path: :mod:`distcheck.strategies` (Hypothesis' conventions are listed there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st
from numpy.typing import ArrayLike

from distcheck.core.validate import check_at_least, check_interval
from distcheck.engine.strategies import defines, draw_ints

__all__ = ["SPBlockCase", "SPAttentionCase", "SPNormGradCase", "sp_mlp_block_cases", "sp_attention_block_cases",
           "sp_norm_grad_cases", "exact_norm_rows"]


def _show(a: ArrayLike | None) -> str:
    return "None" if a is None else repr(np.asarray(a).tolist())


@dataclass(frozen=True)
class SPBlockCase:
    """A pre-norm MLP block over ``tp`` sequence shards.

    ``x`` (s, h) with exact layer norm rows (module doc); ``ln_weight``, ``ln_bias`` (h,); ``W_up``
    (h, ffn); ``W_down`` (ffn, h); ``b_down`` (h,) or None; ``keep`` (s, h) dropout flags or None, at
    ``p = 0.5``. tp <= s and tp <= ffn (every rank holds a token and a hidden unit); shards may be uneven.
    """

    x: np.ndarray
    tp: int
    ln_weight: np.ndarray
    ln_bias: np.ndarray
    W_up: np.ndarray
    W_down: np.ndarray
    b_down: np.ndarray | None = None
    keep: np.ndarray | None = None
    p: float = 0.5

    def __repr__(self) -> str:
        return (f"SPBlockCase(tp={self.tp}, x={_show(self.x)}, ln_weight={_show(self.ln_weight)}, "
                f"ln_bias={_show(self.ln_bias)}, W_up={_show(self.W_up)}, W_down={_show(self.W_down)}, "
                f"b_down={_show(self.b_down)}, keep={_show(None if self.keep is None else self.keep.astype(int))})")


@dataclass(frozen=True)
class SPAttentionCase:
    """A pre-norm attention block over ``tp`` sequence shards: ``x`` (s, h) with exact layer norm rows;
    ``ln_weight``, ``ln_bias`` (h,); ``Wq`` (h, heads * head_dim), ``Wk``, ``Wv`` (h, kv_heads * head_dim),
    ``Wo`` (heads * head_dim, h); tp divides num_kv_heads (which divides num_heads) and tp <= s."""

    x: np.ndarray
    tp: int
    ln_weight: np.ndarray
    ln_bias: np.ndarray
    Wq: np.ndarray
    Wk: np.ndarray
    Wv: np.ndarray
    Wo: np.ndarray
    num_heads: int
    num_kv_heads: int

    def __repr__(self) -> str:
        return (f"SPAttentionCase(tp={self.tp}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"x={_show(self.x)}, ln_weight={_show(self.ln_weight)}, ln_bias={_show(self.ln_bias)}, "
                f"Wq={_show(self.Wq)}, Wk={_show(self.Wk)}, Wv={_show(self.Wv)}, Wo={_show(self.Wo)})")


@dataclass(frozen=True)
class SPNormGradCase:
    """The layer norm's input ``x`` (s, h) (exact rows) and the gradient ``dy`` (s, h) of its output,
    over ``tp`` sequence shards (tp <= s)."""

    x: np.ndarray
    dy: np.ndarray
    tp: int

    def __repr__(self) -> str:
        return f"SPNormGradCase(tp={self.tp}, x={_show(self.x)}, dy={_show(self.dy)})"


def _v_rows(*, min_tokens: int, max_tokens: int, max_hidden: int) -> None:
    check_interval("min_tokens", min_tokens, "max_tokens", max_tokens)
    check_at_least("min_tokens", min_tokens, 1)
    check_at_least("max_hidden", max_hidden, 2)


@defines(_v_rows)
def exact_norm_rows(draw: st.DrawFn, *, min_tokens: int = 1, max_tokens: int = 6, max_hidden: int = 8) -> np.ndarray:
    """An (s, h) float64 array, h even, whose every row ``m + c z`` (z a balanced +-1 vector, m in
    [-3, 3], c in [1, 3]) has an exact layer norm: ``z`` (module doc)."""
    s = draw(st.integers(min_tokens, max_tokens))
    h = 2 * draw(st.integers(1, max_hidden // 2))
    base = [1.0] * (h // 2) + [-1.0] * (h // 2)
    rows = []
    for _ in range(s):
        z = np.array(draw(st.permutations(base)))
        rows.append(draw(st.integers(-3, 3)) + draw(st.integers(1, 3)) * z)
    return np.array(rows, dtype=np.float64)


def _v_mlp(*, min_tp: int, max_tp: int, max_tokens: int, max_hidden: int, max_ffn: int, dropout: bool | None,
           bias: bool | None) -> None:
    check_interval("min_tp", min_tp, "max_tp", max_tp)
    check_at_least("min_tp", min_tp, 1)
    check_at_least("max_tokens", max_tokens, max_tp)
    check_at_least("max_hidden", max_hidden, 2)
    check_at_least("max_ffn", max_ffn, max_tp)


@defines(_v_mlp)
def sp_mlp_block_cases(draw: st.DrawFn, *, min_tp: int = 1, max_tp: int = 4, max_tokens: int = 6, max_hidden: int = 6,
                       max_ffn: int = 6, dropout: bool | None = None, bias: bool | None = None) -> SPBlockCase:
    """An :class:`SPBlockCase`; ``dropout`` / ``bias``: always (True), never (False) or either (None)."""
    tp = draw(st.integers(min_tp, max_tp))
    x = draw(exact_norm_rows(min_tokens=tp, max_tokens=max_tokens, max_hidden=max_hidden))
    s, h = x.shape
    f = draw(st.integers(tp, max_ffn))
    use_keep = draw(st.booleans()) if dropout is None else dropout
    use_bias = draw(st.booleans()) if bias is None else bias
    keep = draw_ints(draw, (s, h), 1, max_shape=(max_tokens, max_hidden)) >= 0 if use_keep else None
    return SPBlockCase(
        x=x, tp=tp,
        ln_weight=draw_ints(draw, (h,), 3, max_shape=(max_hidden,)),
        ln_bias=draw_ints(draw, (h,), 3, max_shape=(max_hidden,)),
        W_up=draw_ints(draw, (h, f), 3, max_shape=(max_hidden, max_ffn)),
        W_down=draw_ints(draw, (f, h), 3, max_shape=(max_ffn, max_hidden)),
        b_down=draw_ints(draw, (h,), 3, max_shape=(max_hidden,)) if use_bias else None,
        keep=keep,
    )


def _v_attention(*, min_tp: int, max_tp: int, max_tokens: int, max_kv_heads: int, max_group: int, max_head_dim: int,
                 max_hidden: int) -> None:
    check_interval("min_tp", min_tp, "max_tp", max_tp)
    check_at_least("min_tp", min_tp, 1)
    check_at_least("max_tokens", max_tokens, max_tp)
    check_at_least("max_kv_heads", max_kv_heads, max_tp)
    check_at_least("max_group", max_group, 1)
    check_at_least("max_head_dim", max_head_dim, 1)
    check_at_least("max_hidden", max_hidden, 2)


@defines(_v_attention)
def sp_attention_block_cases(draw: st.DrawFn, *, min_tp: int = 1, max_tp: int = 4, max_tokens: int = 5,
                             max_kv_heads: int = 4,
                             max_group: int = 2, max_head_dim: int = 2, max_hidden: int = 6) -> SPAttentionCase:
    """An :class:`SPAttentionCase` (grouped-query when num_heads > num_kv_heads)."""
    pairs = [(t, kv) for t in range(min_tp, max_tp + 1) for kv in range(t, max_kv_heads + 1) if kv % t == 0]
    tp, kv = draw(st.sampled_from(pairs))
    H = kv * draw(st.integers(1, max_group))
    e = draw(st.integers(1, max_head_dim))
    x = draw(exact_norm_rows(min_tokens=tp, max_tokens=max_tokens, max_hidden=max_hidden))
    h = x.shape[1]
    return SPAttentionCase(
        x=x, tp=tp,
        ln_weight=draw_ints(draw, (h,), 2, max_shape=(max_hidden,)),
        ln_bias=draw_ints(draw, (h,), 2, max_shape=(max_hidden,)),
        Wq=draw_ints(draw, (h, H * e), 1), Wk=draw_ints(draw, (h, kv * e), 1),
        Wv=draw_ints(draw, (h, kv * e), 2), Wo=draw_ints(draw, (H * e, h), 2),
        num_heads=H, num_kv_heads=kv,
    )


def _v_grad(*, min_tp: int, max_tp: int, max_tokens: int, max_hidden: int) -> None:
    check_interval("min_tp", min_tp, "max_tp", max_tp)
    check_at_least("min_tp", min_tp, 1)
    check_at_least("max_tokens", max_tokens, max_tp)
    check_at_least("max_hidden", max_hidden, 2)


@defines(_v_grad)
def sp_norm_grad_cases(draw: st.DrawFn, *, min_tp: int = 1, max_tp: int = 4, max_tokens: int = 6,
                       max_hidden: int = 6) -> SPNormGradCase:
    """An :class:`SPNormGradCase`: exact layer-norm rows and an integer output gradient."""
    tp = draw(st.integers(min_tp, max_tp))
    x = draw(exact_norm_rows(min_tokens=tp, max_tokens=max_tokens, max_hidden=max_hidden))
    dy = draw_ints(draw, x.shape, 4, max_shape=(max_tokens, max_hidden))
    return SPNormGradCase(x=x, dy=dy, tp=tp)
