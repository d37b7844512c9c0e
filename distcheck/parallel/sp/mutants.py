"""Mutants of sequence parallelism: the mistakes sequence-parallel blocks make.

===================================  ==========================================  ==========================
mutant                               mistake                                     killed by
===================================  ==========================================  ==========================
sp.layer_norm.shard_statistics       the layer norm's mean and variance taken    sp.mlp.exact
                                     over the rank's whole sequence shard, not
                                     per token
sp.layer_norm.grads_shard_only       the layer norm's weight and bias gradients  sp.layer_norm.param_grads
                                     summed over the rank's own tokens, never
                                     all-reduced
sp.dropout.same_mask_every_rank      every rank draws the same dropout mask      sp.mlp.exact
                                     (the random state not forked per rank)
sp.mlp.all_reduce_kept               the right numbers, but the partial outputs  sp.mlp.exact (tp >= 2)
                                     are all-reduced and sliced: an all-reduce
                                     where a reduce-scatter belongs
sp.attention.residual_dropped        the block returns its reduce-scattered      sp.attention.bounded
                                     attention output without the residual x
sp.comm.gather_full_inputs           the all-gather fed every rank's whole       sp.comm.bytes
                                     input instead of its reduce-scattered
                                     shard
sp.activations.dropout_masks_whole   the dropout masks (1 byte per element)      sp.activations.saved
                                     still stored whole, only the activations
                                     sharded over the sequence
===================================  ==========================================  ==========================
"""

from __future__ import annotations

from collections.abc import Sequence, Sized
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from distcheck.core.vocab import Collective
from distcheck.engine.mutants import mutant
from distcheck.parallel.sp import reference as ref
from distcheck.parallel.tp.reference import column_parallel_parts, row_parallel_parts

if TYPE_CHECKING:
    from distcheck.parallel.comm.reference import CommResult

__all__ = ["sp_layer_norm_shard_statistics", "sp_layer_norm_grads_shard_only", "sp_dropout_same_mask_every_rank",
           "sp_mlp_all_reduce_kept", "sp_attention_residual_dropped", "sp_collectives_gather_full_inputs",
           "sp_bytes_dropout_masks_whole"]


def _bounds(shards: Sequence[Sized]) -> list[tuple[int, int]]:
    out, start = [], 0
    for a in shards:
        out.append((start, start + len(a)))
        start += len(a)
    return out


def _mlp_tail(shards: Sequence[np.ndarray], normed: Sequence[np.ndarray], W_up: ArrayLike, W_down: ArrayLike,
              b_down: ArrayLike | None, keep: np.ndarray | None, p: float, log: list | None, *, same_mask: bool = False,
              all_reduce: bool = False) -> list[np.ndarray]:
    bounds = _bounds(shards)
    tp = len(shards)
    full = ref.all_gather_sequence(normed, log=log)
    act = [np.maximum(part, 0) for part in column_parallel_parts(full, W_up, tp)]
    partials = row_parallel_parts(np.concatenate(act, axis=-1), W_down, tp)
    if all_reduce:
        total = partials[0]
        for q in partials[1:]:
            total = total + q
        if log is not None:
            log.append((Collective.ALL_REDUCE, total.shape))
        outs = [total[lo:hi] for lo, hi in bounds]
    else:
        outs = ref.reduce_scatter_sequence(partials, bounds, log=log)
    if b_down is not None:
        outs = [o + b_down for o in outs]
    result = []
    for a, o, (lo, hi) in zip(shards, outs, bounds, strict=True):
        k = None if keep is None else (keep[:hi - lo] if same_mask else keep[lo:hi])
        result.append(a + ref.dropout(o, k, p))
    return result


@mutant("sp.layer_norm.shard_statistics", "sp.mlp.exact")
def sp_layer_norm_shard_statistics(x_shards: Sequence[ArrayLike], ln_weight: ArrayLike, ln_bias: ArrayLike,
                                   W_up: ArrayLike, W_down: ArrayLike, b_down: ArrayLike | None = None, *,
                                   keep: np.ndarray | None = None, p: float = 0.5,
                                   eps: float = 0.0, log: list | None = None) -> list[np.ndarray]:
    """Layer norm with one mean and one variance over the rank's whole sequence shard (tokens and hidden)."""
    shards = [np.asarray(a, dtype=float) for a in x_shards]
    normed = []
    for a in shards:
        mu, var = a.mean(), a.var()
        normed.append((a - mu) / np.sqrt(var + eps) * ln_weight + ln_bias)
    return _mlp_tail(shards, normed, W_up, W_down, b_down, keep, p, log)


@mutant("sp.layer_norm.grads_shard_only", "sp.layer_norm.param_grads")
def sp_layer_norm_grads_shard_only(x_shards: Sequence[ArrayLike], dy_shards: Sequence[ArrayLike], eps: float = 0.0, *,
                                   log: list | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The layer norm's weight and bias gradients over the rank's own tokens (rank 0's), not all-reduced."""
    dw, db = ref.layer_norm_param_grads(x_shards[0], dy_shards[0], eps)
    if log is not None:  # it claims the all-reduces it skipped: only the values can kill it
        log.extend([(Collective.ALL_REDUCE, dw.shape), (Collective.ALL_REDUCE, db.shape)])
    return dw, db


@mutant("sp.dropout.same_mask_every_rank", "sp.mlp.exact")
def sp_dropout_same_mask_every_rank(x_shards: Sequence[ArrayLike], ln_weight: ArrayLike, ln_bias: ArrayLike,
                                    W_up: ArrayLike, W_down: ArrayLike, b_down: ArrayLike | None = None, *,
                                    keep: np.ndarray | None = None, p: float = 0.5,
                                    eps: float = 0.0, log: list | None = None) -> list[np.ndarray]:
    """Every rank applies the mask of the first tokens (one random state on every rank) to its own shard."""
    shards = [np.asarray(a, dtype=float) for a in x_shards]
    normed = [ref.layer_norm(a, ln_weight, ln_bias, eps) for a in shards]
    return _mlp_tail(shards, normed, W_up, W_down, b_down, keep, p, log, same_mask=True)


@mutant("sp.mlp.all_reduce_kept", "sp.mlp.exact")
def sp_mlp_all_reduce_kept(x_shards: Sequence[ArrayLike], ln_weight: ArrayLike, ln_bias: ArrayLike, W_up: ArrayLike,
                           W_down: ArrayLike, b_down: ArrayLike | None = None, *, keep: np.ndarray | None = None,
                           p: float = 0.5,
                           eps: float = 0.0, log: list | None = None) -> list[np.ndarray]:
    """The partial outputs all-reduced and each rank keeping its rows: right values, twice the bytes."""
    shards = [np.asarray(a, dtype=float) for a in x_shards]
    normed = [ref.layer_norm(a, ln_weight, ln_bias, eps) for a in shards]
    return _mlp_tail(shards, normed, W_up, W_down, b_down, keep, p, log, all_reduce=True)


@mutant("sp.attention.residual_dropped", "sp.attention.bounded")
def sp_attention_residual_dropped(x_shards: Sequence[ArrayLike], ln_weight: ArrayLike, ln_bias: ArrayLike,
                                  Wq: ArrayLike, Wk: ArrayLike, Wv: ArrayLike, Wo: ArrayLike, num_heads: int,
                                  num_kv_heads: int, *,
                                  causal: bool = True, eps: float = 0.0, log: list | None = None) -> list[np.ndarray]:
    """The block returns each rank's reduce-scattered attention output without adding back its
    tokens' residual x."""
    out = ref.sp_attention_block(x_shards, ln_weight, ln_bias, Wq, Wk, Wv, Wo, num_heads, num_kv_heads,
                                 causal=causal, eps=eps, log=log)
    return [o - np.asarray(x) for o, x in zip(out, x_shards, strict=True)]


@mutant("sp.comm.gather_full_inputs", "sp.comm.bytes")
def sp_collectives_gather_full_inputs(inputs: Sequence[np.ndarray]) -> tuple[CommResult, CommResult]:
    """The block's all-gather fed every rank's whole S-byte input instead of the shard the
    reduce-scatter left it: n S gathered."""
    from distcheck.parallel.comm.reference import ring_all_gather, ring_reduce_scatter

    return ring_reduce_scatter(inputs), ring_all_gather(list(inputs))


@mutant("sp.activations.dropout_masks_whole", "sp.activations.saved")
def sp_bytes_dropout_masks_whole(s: int, b: int, h: int, a: int, t: int = 1, *,
                                 sequence_parallel: bool = False) -> int | Fraction:
    """Sequence parallelism that shards the stored activations over the sequence but keeps the two
    dropout masks of the replicated regions whole (s b h bytes each on every rank)."""
    from distcheck.parallel.activations.reference import bytes_per_layer

    got = bytes_per_layer(s, b, h, a, t, sequence_parallel=sequence_parallel)
    return got + 2 * (Fraction(s * b * h) - Fraction(s * b * h, t)) if sequence_parallel else got
