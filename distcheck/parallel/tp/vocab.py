"""Vocab-parallel embedding and cross-entropy, reference implementation (numpy, pure functions).

The vocabulary is split over ``tp`` ranks (Shoeybi et al. 2019, "Megatron-LM", §3, "the input
embedding weight matrix ... is parallelized along the vocabulary dimension"; the output layer
shares it and its loss is fused with the cross-entropy). Rank ``r`` holds the contiguous block
``[lo_r, hi_r)`` of the ``vocab_size`` rows (:func:`vocab_range`, ``numpy.array_split``: the first
``vocab_size % tp`` ranks get one more; Megatron and fairscale require tp to divide vocab_size,
where every split is the same).

* **Embedding** (``W``: (vocab_size, d), ids: integers of any shape): rank r looks up the ids in its
  block, writes zeros for the ids outside it (the *mask*), and the partial lookups are summed by one
  all-reduce. Every id lies in exactly one block, so the sum has one nonzero term: the result is
  ``W[ids]`` bit for bit (:func:`vocab_parallel_embedding`). The weight gradient is local: row v of
  rank r's block receives the output gradients of the tokens whose id is v.
* **Cross-entropy** of logits ``z`` (..., vocab_size) split by vocab columns, with integer targets:
  ``loss = log(sum_j exp(z_j - m)) - (z_t - m)`` with ``m`` the row max. Each rank computes its
  local max, all-reduced with MAX; the shifted target logit (0 on the ranks that do not hold the
  target), all-reduced with SUM; and its local sum of exponentials, all-reduced with SUM: three
  all-reduces of one value per token (Megatron-LM's and fairscale's ``vocab_parallel_cross_entropy``;
  the paper's "fuse the output of the parallel GEMM with the cross entropy loss which reduces the
  dimension to b x s"). Any common shift gives the same loss; a shift that differs between ranks
  (a local max only) does not. The gradient with respect to rank r's logits is
  ``(softmax - onehot(t)) * grad`` on its own columns: no collective in the backward.
* ``ignore_index`` (torch's ``F.cross_entropy`` convention): tokens whose target equals it have loss
  0 and gradient 0, and ``reduction="mean"`` divides by the number of the other tokens.

Collective log: functions taking ``log`` append one ``("all_reduce", shape)`` per all-reduce they
model, as the other tensor-parallel references do (:mod:`distcheck.parallel.tp.reference`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from distcheck.core.errors import ConfigError
from distcheck.core.validate import (
    as_array,
    check_choice,
    check_int,
    check_positive_int,
)
from distcheck.core.vocab import Collective

__all__ = [
    "REDUCTIONS",
    "vocab_range",
    "vocab_parallel_embedding_parts",
    "vocab_parallel_embedding",
    "embedding_weight_grad",
    "cross_entropy",
    "cross_entropy_grad",
    "vocab_parallel_cross_entropy",
]

#: how per-token losses are reduced (torch's ``F.cross_entropy`` names)
REDUCTIONS = ("none", "mean", "sum")


def vocab_range(vocab_size: int, tp: int, rank: int) -> tuple[int, int]:
    """Rank ``rank``'s block ``(lo, hi)`` of a vocabulary of ``vocab_size`` rows split over ``tp`` ranks
    (``numpy.array_split``: the first ``vocab_size % tp`` ranks get one more row).

    Raises ConfigError unless ``1 <= tp <= vocab_size`` and ``0 <= rank < tp``.
    """
    vocab_size = check_positive_int("vocab_size", vocab_size)
    tp = check_int("tp", tp, min_value=1, max_value=vocab_size)
    rank = check_int("rank", rank, min_value=0, max_value=tp - 1)
    q, r = divmod(vocab_size, tp)
    lo = rank * q + min(rank, r)
    return lo, lo + q + (1 if rank < r else 0)


def _ids(ids: ArrayLike, vocab_size: int, *, ignore_index: int | None = None) -> np.ndarray:
    vocab_size = check_positive_int("vocab_size", vocab_size)
    a = as_array("ids", ids, allow_empty=True, allow_object=False, allow_bool=False)  # a ragged list: ConfigError
    if a.dtype.kind not in "iu":
        raise ConfigError("ids", a.dtype, "must be an integer array")
    ok = (a >= 0) & (a < vocab_size)
    if ignore_index is not None:
        ok |= a == ignore_index
    if not ok.all():
        bad = a[~ok].flat[0]
        rule = f"must lie in [0, {vocab_size})" + (
            "" if ignore_index is None else f" or equal ignore_index={ignore_index}")
        raise ConfigError("ids", int(bad), rule)
    return a


def _table(W: ArrayLike) -> np.ndarray:
    W = as_array("W", W)
    if W.ndim != 2:
        raise ConfigError("W", W.shape, "must be 2-D (vocab_size, embedding_dim)")
    return W


def vocab_parallel_embedding_parts(ids: ArrayLike, W: ArrayLike, tp: int) -> list[np.ndarray]:
    """Rank r's masked lookup: ``W[ids]`` where ids fall in rank r's block, zeros elsewhere.

    Shapes: ``ids`` integers (...), ``W`` (vocab_size, d); each part (..., d).
    Raises ConfigError for ids outside ``[0, vocab_size)`` or ``tp > vocab_size``.
    """
    W = _table(W)
    ids = _ids(ids, W.shape[0])
    check_positive_int("tp", tp)
    parts = []
    for r in range(tp):
        lo, hi = vocab_range(W.shape[0], tp, r)
        inside = (ids >= lo) & (ids < hi)
        local = np.where(inside, ids - lo, 0)  # the mask: out-of-block ids read row 0 of the block ...
        block = W[lo:hi]
        part = block[local] if hi > lo else np.zeros(ids.shape + (W.shape[1],), dtype=W.dtype)
        parts.append(np.where(inside[..., None], part, 0))  # ... and are zeroed
    return parts


def vocab_parallel_embedding(ids: ArrayLike, W: ArrayLike, tp: int, *, log: list | None = None) -> np.ndarray:
    """The all-reduce (sum, in rank order) of :func:`vocab_parallel_embedding_parts`: ``W[ids]``,
    bit for bit (one nonzero term per entry). Appends one ``("all_reduce", shape)`` to ``log``.
    Raises ConfigError as :func:`vocab_parallel_embedding_parts`."""
    parts = vocab_parallel_embedding_parts(ids, W, tp)
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    if log is not None:
        log.append((Collective.ALL_REDUCE, out.shape))
    return out


def embedding_weight_grad(ids: ArrayLike, grad_output: ArrayLike, vocab_size: int) -> np.ndarray:
    """Gradient of the embedding table: row v is the sum of ``grad_output`` over the tokens with id v.

    Shapes: ``ids`` (...), ``grad_output`` (..., d); result (vocab_size, d). Raises ConfigError on
    ids outside the vocabulary or mismatched shapes."""
    ids = _ids(ids, vocab_size)
    g = as_array("grad_output", grad_output, min_ndim=1)
    if g.shape[:-1] != ids.shape:
        raise ConfigError("grad_output", g.shape, f"must be ids.shape + (d,) = {ids.shape} + (d,)")
    out = np.zeros((vocab_size, g.shape[-1]), dtype=np.result_type(g.dtype, np.float64))
    np.add.at(out, ids.reshape(-1), g.reshape(-1, g.shape[-1]))
    return out


def _check_ce(logits: ArrayLike, target: ArrayLike, ignore_index: int | None,
              reduction: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    z = as_array("logits", logits)
    if z.ndim < 1 or z.shape[-1] < 1:
        raise ConfigError("logits", z.shape, "must have a vocabulary dim (last) of at least 1")
    if ignore_index is not None:
        check_int("ignore_index", ignore_index)
    check_choice("reduction", reduction, REDUCTIONS)
    t = _ids(target, z.shape[-1], ignore_index=ignore_index)
    if t.shape != z.shape[:-1]:
        raise ConfigError("target", t.shape, f"must be logits.shape[:-1] = {z.shape[:-1]}")
    valid = np.ones(t.shape, dtype=bool) if ignore_index is None else t != ignore_index
    if reduction == "mean" and not valid.any():
        raise ConfigError("target", t.tolist(), "must have a token not equal to ignore_index for reduction='mean'")
    return z, np.where(valid, t, 0), valid


def _reduce(per_token: np.ndarray, valid: np.ndarray, reduction: str) -> np.ndarray | np.float64:
    if reduction == "none":
        return per_token
    total = per_token.sum()
    return total / valid.sum() if reduction == "mean" else total


def cross_entropy(logits: ArrayLike, target: ArrayLike, *, ignore_index: int | None = None,
                  reduction: str = "none") -> np.ndarray | np.float64:
    """Single-device cross-entropy ``log sum_j exp(z_j - m) - (z_t - m)`` per token, reduced.

    Shapes: ``logits`` (..., vocab_size), ``target`` integers (...) in ``[0, vocab_size)`` or equal to
    ``ignore_index``. ``reduction``: ``"none"`` (per token), ``"mean"`` (over tokens not ignored),
    ``"sum"``. Raises ConfigError on bad shapes, targets or names.
    """
    z, t, valid = _check_ce(logits, target, ignore_index, reduction)
    m = z.max(axis=-1, keepdims=True)
    shifted = z - m
    lse = np.log(np.exp(shifted).sum(axis=-1))
    picked = np.take_along_axis(shifted, t[..., None], axis=-1)[..., 0]
    return _reduce(np.where(valid, lse - picked, 0.0), valid, reduction)


def cross_entropy_grad(logits: ArrayLike, target: ArrayLike, grad_output: ArrayLike, *,
                       ignore_index: int | None = None, reduction: str = "none") -> np.ndarray:
    """Gradient of :func:`cross_entropy` with respect to the logits: ``(softmax(z) - onehot(t)) * g``,
    with ``g`` the output gradient (per token for ``"none"``, else a scalar; divided by the number of
    tokens not ignored for ``"mean"``) and 0 on ignored tokens. Shape of ``logits``.
    Raises ConfigError as :func:`cross_entropy` and on a ``grad_output`` of the wrong shape.
    """
    z, t, valid = _check_ce(logits, target, ignore_index, reduction)
    g = as_array("grad_output", grad_output, allow_empty=True).astype(np.float64)
    want = t.shape if reduction == "none" else ()
    if g.shape != want:
        raise ConfigError("grad_output", g.shape, f"must have shape {want} for reduction={reduction!r}")
    if reduction == "mean":
        g = g / valid.sum()
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    onehot = np.zeros_like(p)
    np.put_along_axis(onehot, t[..., None], 1.0, axis=-1)
    return np.where(valid[..., None], (p - onehot) * np.broadcast_to(g, t.shape)[..., None], 0.0)


def vocab_parallel_cross_entropy(logits: ArrayLike, target: ArrayLike, tp: int, *, ignore_index: int | None = None,
                                 reduction: str = "none", log: list | None = None) -> np.ndarray | np.float64:
    """:func:`cross_entropy` computed as ``tp`` ranks do, each holding its block of the vocab columns:
    local max -> all-reduce MAX; shifted target logit (0 off its block) -> all-reduce SUM; local sum of
    exponentials -> all-reduce SUM; then ``log(sum) - target logit`` on every rank. Appends the three
    ``("all_reduce", shape)`` to ``log`` (token shape). Equal to :func:`cross_entropy` up to rounding
    (the sum of exponentials is added in another order).

    Raises ConfigError as :func:`cross_entropy` and for ``tp > vocab_size``.
    """
    z, t, valid = _check_ce(logits, target, ignore_index, reduction)
    tp = check_positive_int("tp", tp)
    blocks = [vocab_range(z.shape[-1], tp, r) for r in range(tp)]
    m = np.max([z[..., lo:hi].max(axis=-1) for lo, hi in blocks], axis=0)  # all-reduce MAX
    picked = np.zeros(t.shape)
    sums = np.zeros(t.shape)
    for lo, hi in blocks:
        inside = (t >= lo) & (t < hi)
        local = np.take_along_axis(z[..., lo:hi], np.where(inside, t - lo, 0)[..., None], axis=-1)[..., 0]
        picked = picked + np.where(inside, local - m, 0.0)  # all-reduce SUM
        sums = sums + np.exp(z[..., lo:hi] - m[..., None]).sum(axis=-1)  # all-reduce SUM
    if log is not None:
        log += [(Collective.ALL_REDUCE, t.shape)] * 3
    return _reduce(np.where(valid, np.log(sums) - picked, 0.0), valid, reduction)
