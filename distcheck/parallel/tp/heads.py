"""Multi-head attention with grouped-query attention (GQA), single-device and
tensor-parallel by heads (numpy reference).

Conventions
-----------
* ``x``: (seq, d) or (batch, seq, d).
* ``Wq``: (d, num_heads * head_dim); ``Wk``, ``Wv``: (d, num_kv_heads * head_dim);
  ``Wo``: (num_heads * head_dim, d_out). Head ``h`` owns columns
  ``[h * head_dim, (h + 1) * head_dim)`` of its projection.
* GQA (Ainslie et al. 2023): query heads are grouped in consecutive blocks of
  ``group = num_heads / num_kv_heads``; query head ``h`` reads KV head
  ``h // group`` (the Llama / Hugging Face ``repeat_kv`` order).
* Scores are scaled by ``1 / sqrt(head_dim)`` (Vaswani et al. 2017, eq. 1);
  ``causal=True`` masks keys after the query position.

Tensor parallelism (Shoeybi et al. 2019, section 3, Fig. 3b; lesson): rank ``r``
holds query heads ``[r * num_heads/tp, (r + 1) * num_heads/tp)`` and KV heads
``[r * num_kv_heads/tp, (r + 1) * num_kv_heads/tp)`` (column-parallel slices of
Wq, Wk, Wv; because groups are consecutive, these KV heads are exactly the ones
the rank's query heads read) and the matching rows of Wo (row-parallel). The
partial outputs are summed by ONE all-reduce. ``tp`` must divide both
``num_heads`` and ``num_kv_heads``.

Exactness: every head is computed by the same function on the same operands in
the single-device and tensor-parallel paths, so per-head outputs are bitwise
equal; only the final sum over heads is reordered, and the difference is
within ``distcheck.parallel.tp.row_parallel_error_bound(heads, Wo, tp)``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from distcheck.core.errors import ConfigError
from distcheck.core.validate import (
    MAX_RANKS,
    as_array,
    check_at_most,
    check_bool,
    check_divides,
    check_positive_int,
    check_type,
)
from distcheck.core.vocab import Collective

__all__ = [
    "validate_heads",
    "validate_tp_heads",
    "head_dim_of",
    "attention_heads",
    "attention",
    "tp_head_ranges",
    "tp_attention_parts",
    "tp_attention",
]


def validate_heads(num_heads: int, num_kv_heads: int) -> None:
    """Raise ConfigError unless ``num_heads, num_kv_heads >= 1`` and
    ``num_kv_heads`` divides ``num_heads`` (e.g. "num_kv_heads=3 must divide num_heads=8")."""
    num_heads = check_positive_int("num_heads", num_heads)
    num_kv_heads = check_positive_int("num_kv_heads", num_kv_heads)
    check_divides("num_kv_heads", num_kv_heads, "num_heads", num_heads)


def validate_tp_heads(tp: int, num_heads: int, num_kv_heads: int) -> None:
    """Raise ConfigError unless heads split evenly over ``tp`` ranks.

    Rules, checked in this order: all three are integers >= 1;
    ``num_kv_heads | num_heads``; ``tp | num_heads``; ``tp | num_kv_heads``
    (message e.g. "tp=3 must divide num_kv_heads=8"); ``tp <= MAX_RANKS`` (2**24). With ``tp > num_kv_heads``
    KV heads would have to be replicated, which this reference does not model.
    """
    validate_heads(num_heads, num_kv_heads)
    tp = check_positive_int("tp", tp)
    check_at_most("tp", tp, MAX_RANKS, "one head range is listed per rank")
    check_divides("tp", tp, "num_heads", num_heads)
    check_divides("tp", tp, "num_kv_heads", num_kv_heads)


def head_dim_of(Wq: ArrayLike, Wk: ArrayLike, Wv: ArrayLike, Wo: ArrayLike, num_heads: int, num_kv_heads: int) -> int:
    """Check the projection shapes against the head counts and return ``head_dim``.

    Raises ConfigError naming the first weight whose shape is wrong.
    """
    validate_heads(num_heads, num_kv_heads)
    Wq, Wk, Wv, Wo = (as_array(name, a) for name, a in (("Wq", Wq), ("Wk", Wk), ("Wv", Wv), ("Wo", Wo)))
    if Wq.ndim != 2 or Wq.shape[1] % num_heads or Wq.shape[1] == 0:
        raise ConfigError("Wq.shape", Wq.shape, f"must be (d, num_heads * head_dim) with num_heads={num_heads}")
    d, hd = Wq.shape[0], Wq.shape[1] // num_heads
    for name, W in (("Wk", Wk), ("Wv", Wv)):
        if W.shape != (d, num_kv_heads * hd):
            raise ConfigError(f"{name}.shape", W.shape,
                              f"must be (d, num_kv_heads * head_dim) = {(d, num_kv_heads * hd)}")
    if Wo.ndim != 2 or Wo.shape[0] != num_heads * hd:
        raise ConfigError("Wo.shape", Wo.shape, f"must start with num_heads * head_dim = {num_heads * hd}")
    return hd


def _check_x(x: ArrayLike, d: int) -> np.ndarray:
    x = as_array("x", x)
    if x.ndim not in (2, 3) or x.shape[-1] != d:
        raise ConfigError("x.shape", x.shape, f"must be (seq, {d}) or (batch, seq, {d})")
    return x


def _one_head(x: np.ndarray, Wq_h: np.ndarray, Wk_h: np.ndarray, Wv_h: np.ndarray, causal: bool) -> np.ndarray:
    q, k, v = x @ Wq_h, x @ Wk_h, x @ Wv_h
    scores = (q @ np.swapaxes(k, -1, -2)) / np.sqrt(Wq_h.shape[1])
    if causal:
        s = scores.shape[-1]
        scores = np.where(np.triu(np.ones((s, s), dtype=bool), k=1), -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p = p / p.sum(axis=-1, keepdims=True)
    return p @ v


def attention_heads(x: ArrayLike, Wq: ArrayLike, Wk: ArrayLike, Wv: ArrayLike, num_heads: int, num_kv_heads: int,
                    causal: bool = True) -> np.ndarray:
    """Concatenated per-head outputs before the output projection.

    Returns (..., seq, num_heads * head_dim), head ``h`` in columns
    ``[h * head_dim, (h + 1) * head_dim)``. Shapes as the module docstring
    (``Wo`` is not needed). Raises ConfigError on inconsistent shapes/heads.
    """
    validate_heads(num_heads, num_kv_heads)
    check_bool("causal", causal)
    Wq = as_array("Wq", Wq)
    if Wq.ndim != 2:
        raise ConfigError("Wq.shape", Wq.shape, f"must be (d, num_heads * head_dim) with num_heads={num_heads}")
    hd = head_dim_of(Wq, Wk, Wv, np.zeros((Wq.shape[1], 1)), num_heads, num_kv_heads)
    Wk, Wv = np.asarray(Wk), np.asarray(Wv)
    x = _check_x(x, Wq.shape[0])
    group = num_heads // num_kv_heads
    outs = []
    for h in range(num_heads):
        g = h // group
        q_cols, kv_cols = slice(h * hd, (h + 1) * hd), slice(g * hd, (g + 1) * hd)
        outs.append(_one_head(x, Wq[:, q_cols], Wk[:, kv_cols], Wv[:, kv_cols], causal))
    return np.concatenate(outs, axis=-1)


def attention(x: ArrayLike, Wq: ArrayLike, Wk: ArrayLike, Wv: ArrayLike, Wo: ArrayLike, num_heads: int,
              num_kv_heads: int, causal: bool = True) -> np.ndarray:
    """Single-device multi-head attention with GQA: ``attention_heads(...) @ Wo``.

    Returns (seq, d_out) or (batch, seq, d_out). Raises ConfigError on bad
    shapes or head counts (``num_kv_heads`` must divide ``num_heads``).
    """
    head_dim_of(Wq, Wk, Wv, Wo, num_heads, num_kv_heads)
    return attention_heads(x, Wq, Wk, Wv, num_heads, num_kv_heads, causal) @ np.asarray(Wo)


def tp_head_ranges(tp: int, num_heads: int, num_kv_heads: int) -> list[tuple[range, range]]:
    """Per rank: (query heads, KV heads) it holds. ``tp_head_ranges(2, 8, 4)`` ->
    ``[(range(0, 4), range(0, 2)), (range(4, 8), range(2, 4))]``. Raises as :func:`validate_tp_heads`."""
    validate_tp_heads(tp, num_heads, num_kv_heads)
    hq, hkv = num_heads // tp, num_kv_heads // tp
    return [(range(r * hq, (r + 1) * hq), range(r * hkv, (r + 1) * hkv)) for r in range(tp)]


def tp_attention_parts(x: ArrayLike, Wq: ArrayLike, Wk: ArrayLike, Wv: ArrayLike, Wo: ArrayLike, num_heads: int,
                       num_kv_heads: int, tp: int, causal: bool = True) -> list[np.ndarray]:
    """Per-rank partial outputs ``local_heads_r @ Wo[rows_r]`` (before the all-reduce).

    Rank ``r`` runs :func:`attention_heads` on its column slices of Wq/Wk/Wv
    with ``num_heads/tp`` query and ``num_kv_heads/tp`` KV heads.
    Raises ConfigError (via :func:`validate_tp_heads`) unless tp divides both head counts.
    """
    validate_tp_heads(tp, num_heads, num_kv_heads)
    hd = head_dim_of(Wq, Wk, Wv, Wo, num_heads, num_kv_heads)
    Wq, Wk, Wv, Wo = (np.asarray(a) for a in (Wq, Wk, Wv, Wo))
    parts = []
    for q_heads, kv_heads in tp_head_ranges(tp, num_heads, num_kv_heads):
        qc = slice(q_heads.start * hd, q_heads.stop * hd)
        kc = slice(kv_heads.start * hd, kv_heads.stop * hd)
        local = attention_heads(x, Wq[:, qc], Wk[:, kc], Wv[:, kc], len(q_heads), len(kv_heads), causal)
        parts.append(local @ Wo[qc, :])
    return parts


def tp_attention(
    x: ArrayLike, Wq: ArrayLike, Wk: ArrayLike, Wv: ArrayLike, Wo: ArrayLike, num_heads: int, num_kv_heads: int,
    tp: int, causal: bool = True, *, log: list | None = None
) -> np.ndarray:
    """Tensor-parallel attention: sum (one all-reduce, rank order) of :func:`tp_attention_parts`.

    Appends one ``("all_reduce", shape)`` to ``log`` when given. Within
    ``row_parallel_error_bound(attention_heads(...), Wo, tp)`` of :func:`attention`.
    Raises ConfigError as :func:`tp_attention_parts`, or for a ``log`` that is not a list.
    """
    if log is not None:
        check_type("log", log, list, "must be a list (collectives are appended to it) or None")
    parts = tp_attention_parts(x, Wq, Wk, Wv, Wo, num_heads, num_kv_heads, tp, causal)
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    if log is not None:
        log.append((Collective.ALL_REDUCE, out.shape))
    return out
