"""Mutants of tensor parallelism: the mistakes sharded layers make.

===========================  ============================================  =============================
mutant                       mistake                                       killed by
===========================  ============================================  =============================
tp.mlp.row_then_column       row-split W_up and column-split W_down with   tp.mlp.exact
                             no extra all-reduce (the lesson, Predict)
tp.layer_norm.per_shard      layer norm over each shard's slice of the     tp.layer_norm.sharded_hidden
                             hidden dim (the lesson, Predict)
tp.row.bias_every_rank       the bias added on every rank before the       tp.row.exact
                             all-reduce (added tp times)
tp.row.unlogged_allreduce    the right numbers, but takes the collective   tp.row.exact (tp >= 2)
                             log and records no all-reduce
tp.swiglu.fused_naive_split  a fused [gate|up] weight split as one matrix  tp.swiglu.fused
tp.row.even_split_only       k // tp rows per rank: the remainder rows     tp.row.exact (tp not
                             are dropped                                   dividing k)
tp.column.bias_unsharded     every rank adds the first columns of the      tp.column.exact (a bias,
                             bias, not its own block                       tp >= 2)
tp.swiglu.silu_on_up         SwiGLU with gate and up swapped: silu(up)     tp.swiglu.bounded
                             * gate
tp.attention.first_kv_heads  every rank attends with the first ranks' KV   tp.attention.bounded (GQA,
                             heads instead of its own group's              tp >= 2)
===========================  ============================================  =============================
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from distcheck.core.vocab import Collective
from distcheck.engine.mutants import mutant
from distcheck.parallel.tp.reference import row_parallel

__all__ = ["row_then_column_mlp", "layer_norm_per_shard", "row_parallel_bias_every_rank",
           "row_parallel_even_split_only", "row_parallel_unlogged_allreduce", "swiglu_fused_naive_split",
           "column_parallel_bias_unsharded", "swiglu_silu_on_up", "attention_first_kv_heads"]


def _all_reduced(parts: list[np.ndarray], log: list | None) -> np.ndarray:
    """The ranks' partials summed in rank order (an all-reduce), logged as one all-reduce when ``log`` is given."""
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    if log is not None:
        log.append((Collective.ALL_REDUCE, total.shape))
    return total


def _bounds(n: int, tp: int) -> list[tuple[int, int]]:
    edges = np.cumsum([0] + [len(c) for c in np.array_split(np.arange(n), tp)])
    return list(zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True))


@mutant("tp.mlp.row_then_column", "tp.mlp.exact")
def row_then_column_mlp(x: ArrayLike, W_up: ArrayLike, W_down: ArrayLike, tp: int, act: str = "relu",
                        b_up: ArrayLike | None = None, b_down: ArrayLike | None = None, *,
                        log: list | None = None) -> np.ndarray:
    """Row-split W_up and column-split W_down with no extra all-reduce: each rank applies the
    activation to its PARTIAL sum x_r W_up[r] and multiplies by its columns of W_down."""
    x, W_up, W_down = np.asarray(x), np.asarray(W_up), np.asarray(W_down)
    outs = []
    for (lo, hi), (clo, chi) in zip(_bounds(W_up.shape[0], tp), _bounds(W_down.shape[1], tp), strict=True):
        h = np.maximum(x[..., lo:hi] @ W_up[lo:hi, :], 0)
        outs.append(h @ W_down[:, clo:chi])
    y = np.concatenate(outs, axis=-1)
    return y if b_down is None else y + b_down


@mutant("tp.layer_norm.per_shard", "tp.layer_norm.sharded_hidden")
def layer_norm_per_shard(x_shards: Sequence[np.ndarray], eps: float = 1.0) -> list[np.ndarray]:
    """Layer norm applied to each rank's slice of the hidden dim with LOCAL mean and variance."""
    out = []
    for s in x_shards:
        mu = s.mean(axis=-1, keepdims=True)
        var = ((s - mu) ** 2).mean(axis=-1, keepdims=True)
        out.append((s - mu) / np.sqrt(var + eps))
    return out


@mutant("tp.row.bias_every_rank", "tp.row.exact")
def row_parallel_bias_every_rank(x: ArrayLike, W: ArrayLike, tp: int, b: ArrayLike | None = None, *,
                                 log: list | None = None) -> np.ndarray:
    """Row-parallel linear where every rank adds the bias to its partial before the all-reduce."""
    x, W = np.asarray(x), np.asarray(W)
    parts = []
    for lo, hi in _bounds(W.shape[0], tp):
        part = x[..., lo:hi] @ W[lo:hi, :]
        parts.append(part if b is None else part + b)
    return _all_reduced(parts, log)


@mutant("tp.row.even_split_only", "tp.row.exact")
def row_parallel_even_split_only(x: ArrayLike, W: ArrayLike, tp: int, b: ArrayLike | None = None, *,
                                 log: list | None = None) -> np.ndarray:
    """Row-parallel linear that assumes tp divides in_features: every rank takes k // tp rows,
    so the last k % tp rows of W (and columns of x) are silently dropped."""
    x, W = np.asarray(x), np.asarray(W)
    chunk = W.shape[0] // tp
    out = sum(x[..., r * chunk:(r + 1) * chunk] @ W[r * chunk:(r + 1) * chunk, :] for r in range(tp))
    if log is not None:
        log.append((Collective.ALL_REDUCE, np.shape(out)))
    return out if b is None else out + b


@mutant("tp.row.unlogged_allreduce", "tp.row.exact")
def row_parallel_unlogged_allreduce(x: ArrayLike, W: ArrayLike, tp: int, b: ArrayLike | None = None, *,
                                    log: list | None = None) -> np.ndarray:
    """Row-parallel linear with the right numbers that takes the collective log but records no
    all-reduce: "one all-reduce per forward" is then unconfirmed, and the property must fail."""
    return row_parallel(x, W, tp, b)


@mutant("tp.swiglu.fused_naive_split", "tp.swiglu.fused")
def swiglu_fused_naive_split(x: ArrayLike, W_fused: ArrayLike, W_down: ArrayLike, tp: int, *,
                             log: list | None = None) -> np.ndarray:
    """Fused [gate | up] weight column-split as one matrix: rank r takes a contiguous block of
    the fused columns and splits it in half, pairing gate and up of different units."""
    x, W_fused, W_down = np.asarray(x), np.asarray(W_fused), np.asarray(W_down)
    parts = []
    for (lo, hi), (dlo, _dhi) in zip(_bounds(W_fused.shape[1], tp), _bounds(W_down.shape[0], tp), strict=True):
        gu = x @ W_fused[:, lo:hi]
        half = gu.shape[-1] // 2
        h = gu[..., :half] / (1 + np.exp(-gu[..., :half])) * gu[..., half:2 * half]
        parts.append(h @ W_down[dlo:dlo + h.shape[-1], :])
    return _all_reduced(parts, log)


@mutant("tp.column.bias_unsharded", "tp.column.exact")
def column_parallel_bias_unsharded(x: ArrayLike, W: ArrayLike, tp: int, b: ArrayLike | None = None) -> np.ndarray:
    """Column-parallel linear whose ranks each add the FIRST columns of the bias (the bias left
    unsharded and sliced from 0) instead of the block matching their output columns."""
    x, W = np.asarray(x), np.asarray(W)
    outs = []
    for lo, hi in _bounds(W.shape[1], tp):
        y = x @ W[:, lo:hi]
        outs.append(y if b is None else y + np.asarray(b)[:hi - lo])
    return np.concatenate(outs, axis=-1)


@mutant("tp.swiglu.silu_on_up", "tp.swiglu.bounded")
def swiglu_silu_on_up(x: ArrayLike, W_gate: ArrayLike, W_up: ArrayLike, W_down: ArrayLike, tp: int, *,
                      log: list | None = None) -> np.ndarray:
    """TP SwiGLU with the gate and up projections swapped: silu(x W_up) * (x W_gate)."""
    x, W_gate, W_up, W_down = (np.asarray(a) for a in (x, W_gate, W_up, W_down))
    parts = []
    for lo, hi in _bounds(W_gate.shape[1], tp):
        u, g = x @ W_up[:, lo:hi], x @ W_gate[:, lo:hi]
        parts.append((u / (1 + np.exp(-u)) * g) @ W_down[lo:hi, :])
    return _all_reduced(parts, log)


@mutant("tp.attention.first_kv_heads", "tp.attention.bounded")
def attention_first_kv_heads(x: ArrayLike, Wq: ArrayLike, Wk: ArrayLike, Wv: ArrayLike, Wo: ArrayLike, num_heads: int,
                             num_kv_heads: int, tp: int, causal: bool = True, *, log: list | None = None) -> np.ndarray:
    """Attention split by heads where every rank slices the K and V projections from column 0 (rank 0's
    KV heads) instead of its own group's: with GQA over tp >= 2, rank r's queries meet the wrong keys."""
    from distcheck.parallel.tp.heads import attention_heads, tp_head_ranges

    x, Wq, Wk, Wv, Wo = (np.asarray(a) for a in (x, Wq, Wk, Wv, Wo))
    hd = Wq.shape[1] // num_heads
    parts = []
    for q_heads, kv_heads in tp_head_ranges(tp, num_heads, num_kv_heads):
        qc = slice(q_heads.start * hd, q_heads.stop * hd)
        kc = slice(0, len(kv_heads) * hd)
        local = attention_heads(x, Wq[:, qc], Wk[:, kc], Wv[:, kc], len(q_heads), len(kv_heads), causal)
        parts.append(local @ Wo[qc, :])
    return _all_reduced(parts, log)
