"""Hypothesis strategies of context-parallel attention, of online-softmax partials and of load balancing.

Values are multiples of 1/4 in [-2, 2] (exact in every format), so scores and their errors stay small and
a wrong mask, a missed block or a missing sum changes the output by far more than the derived bound.
``exact=True`` merge cases draw each block's scores from {M, -inf} (M the same for every block), so
``exp(s - m)`` is 1 or 0 and the merge is exact in any order; large offsets (750) make ``exp`` overflow
wherever the max is not subtracted.

Public path: :mod:`distcheck.strategies` (Hypothesis' conventions are listed there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st
from numpy.typing import ArrayLike

from distcheck.core.validate import check_at_least, check_interval
from distcheck.engine.strategies import defines, draw_ints

__all__ = ["CPAttentionCase", "CPMergeCase", "cp_attention_cases", "cp_merge_cases", "cp_balance_cases"]


def _show(a: ArrayLike) -> str:
    return repr(np.asarray(a).tolist())


@dataclass(frozen=True)
class CPAttentionCase:
    """Attention over ``cp`` sequence shards: ``q`` and ``dout`` (s, H, e), ``k`` and ``v`` (s, Hkv, e) of the
    whole sequence, ``causal``; ``balanced``: the head-tail split into 2 cp chunks (s divisible by 2 cp), else
    contiguous shards (cp | s)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    dout: np.ndarray
    cp: int
    causal: bool = True
    balanced: bool = True

    def __repr__(self) -> str:
        return (f"CPAttentionCase(cp={self.cp}, causal={self.causal}, balanced={self.balanced}, q={_show(self.q)}, "
                f"k={_show(self.k)}, v={_show(self.v)}, dout={_show(self.dout)})")


@dataclass(frozen=True)
class CPMergeCase:
    """Scores (s_q, H, n_k) of one row block against n_k keys, values (n_k, H, e), the key blocks' ``bounds``
    (increasing cut points from 0 to n_k), a merge ``order`` (a permutation of the blocks) and ``exact``
    (the scores are M or -inf: the merge is exact)."""

    scores: np.ndarray
    v: np.ndarray
    bounds: tuple[int, ...]
    order: tuple[int, ...]
    exact: bool = False

    def __repr__(self) -> str:
        return (f"CPMergeCase(exact={self.exact}, bounds={self.bounds}, order={self.order}, "
                f"scores={_show(self.scores)}, v={_show(self.v)})")


def _quarters(draw: st.DrawFn, shape: tuple[int, ...], max_shape: tuple[int, ...] | None) -> np.ndarray:
    return draw_ints(draw, shape, 8, max_shape=max_shape) / 4


def _v_attention(*, min_cp: int, max_cp: int, max_chunk: int, max_kv_heads: int, max_group: int, max_head_dim: int,
                 divisible_heads: bool | None) -> None:
    check_interval("min_cp", min_cp, "max_cp", max_cp)
    check_at_least("min_cp", min_cp, 1)
    check_at_least("max_chunk", max_chunk, 1)
    check_at_least("max_kv_heads", max_kv_heads, 1)
    check_at_least("max_group", max_group, 1)
    check_at_least("max_head_dim", max_head_dim, 1)


@defines(_v_attention)
def cp_attention_cases(draw: st.DrawFn, *, min_cp: int = 1, max_cp: int = 4, max_chunk: int = 2, max_kv_heads: int = 4,
                       max_group: int = 2, max_head_dim: int = 2,
                       divisible_heads: bool | None = None) -> CPAttentionCase:
    """A :class:`CPAttentionCase`; ``divisible_heads``: cp divides both head counts always (True), or either
    (None: Ulysses' refusals are drawn too)."""
    cp = draw(st.integers(min_cp, max_cp))
    if divisible_heads:
        Hkv = cp * draw(st.integers(1, max(1, max_kv_heads // cp)))
    else:
        Hkv = draw(st.integers(1, max_kv_heads))
    H = Hkv * draw(st.integers(1, max_group))
    e = draw(st.integers(1, max_head_dim))
    s = 2 * cp * draw(st.integers(1, max_chunk))
    max_s = 2 * max_cp * max_chunk
    mq, mkv = (max_s, max_kv_heads * max_group, max_head_dim), (max_s, max_kv_heads, max_head_dim)
    return CPAttentionCase(q=_quarters(draw, (s, H, e), mq), k=_quarters(draw, (s, Hkv, e), mkv),
                           v=_quarters(draw, (s, Hkv, e), mkv), dout=_quarters(draw, (s, H, e), mq), cp=cp,
                           causal=draw(st.booleans()), balanced=draw(st.booleans()))


def _v_merge(*, max_blocks: int, max_block_keys: int, max_rows: int, max_head_dim: int, exact: bool | None) -> None:
    check_at_least("max_blocks", max_blocks, 1)
    check_at_least("max_block_keys", max_block_keys, 1)
    check_at_least("max_rows", max_rows, 1)
    check_at_least("max_head_dim", max_head_dim, 1)


@defines(_v_merge)
def cp_merge_cases(draw: st.DrawFn, *, max_blocks: int = 4, max_block_keys: int = 3, max_rows: int = 2,
                   max_head_dim: int = 2, exact: bool | None = None) -> CPMergeCase:
    """A :class:`CPMergeCase`: 1 to ``max_blocks`` key blocks, a random merge order, an offset of the scores
    drawn from {0, 3/4, 750} (750: ``exp`` overflows without the max subtracted); ``exact`` always, never or
    either (None)."""
    nb = draw(st.integers(1, max_blocks))
    sizes = [draw(st.integers(1, max_block_keys)) for _ in range(nb)]
    bounds = tuple(int(x) for x in np.cumsum([0] + sizes))
    n, rows, e = bounds[-1], draw(st.integers(1, max_rows)), draw(st.integers(1, max_head_dim))
    is_exact = draw(st.booleans()) if exact is None else exact
    offset = draw(st.sampled_from([0.0, 0.75, 750.0]))
    if is_exact:  # every block holds the row max M in its first key; the rest are M or masked
        keep = draw_ints(draw, (rows, 1, n), 1) >= 0
        keep[..., list(bounds[:-1])] = True
        scores = np.where(keep, offset, -np.inf)
    else:
        scores = _quarters(draw, (rows, 1, n), None) + offset
    order = tuple(draw(st.permutations(range(nb))))
    return CPMergeCase(scores=scores, v=_quarters(draw, (n, 1, e), None), bounds=bounds, order=order,
                       exact=is_exact)


def _v_balance(*, max_cp: int, max_chunk: int) -> None:
    check_at_least("max_cp", max_cp, 1)
    check_at_least("max_chunk", max_chunk, 1)


@defines(_v_balance)
def cp_balance_cases(draw: st.DrawFn, *, max_cp: int = 8, max_chunk: int = 8) -> tuple[int, int]:
    """``(s, cp)`` with 2 cp dividing s: the sequence lengths load balancing splits into 2 cp chunks."""
    cp = draw(st.integers(1, max_cp))
    return 2 * cp * draw(st.integers(1, max_chunk)), cp
