"""Sequence parallelism, reference implementation (numpy, pure functions).

A transformer block under tensor parallelism (Shoeybi et al. 2019, §3) runs its layer norm and its
dropout on the whole sequence on every rank. Sequence parallelism (Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", §4.2.2, Figure 5) splits those
along the sequence instead, so each rank stores 1/tp of their activations:

    x_r (rank r's tokens) -> layer norm -> all-gather (g) -> column-parallel linear -> activation
      -> row-parallel linear -> reduce-scatter (g-bar) -> + bias -> dropout -> + x_r

The all-reduce of the tensor-parallel block becomes a reduce-scatter to the sequence shards, and the
column-parallel block's input is all-gathered from them; a ring reduce-scatter plus a ring
all-gather send what the ring all-reduce sends (:mod:`distcheck.parallel.sp.forms`).

Conventions
-----------
* ``x``: (s, h), tokens first (a micro-batch of b sequences is s = b x sequence tokens, as Megatron's
  (s, b, h) flattened); the sequence shards follow ``numpy.array_split`` (the first ``s % tp`` ranks get
  one more token; Megatron requires tp to divide s).
* Weights as in :mod:`distcheck.parallel.tp`: ``W_up`` (h, ffn), ``W_down`` (ffn, h); attention's ``Wq`` (h, heads *
  head_dim) ... as :mod:`distcheck.parallel.tp`. Layer norm: ``(x - mean) / sqrt(var + eps) * weight + bias``
  per token over the hidden dim (Ba et al. 2016), ``weight`` and ``bias`` (h,).
* Dropout: ``keep`` (s, h) booleans indexed by GLOBAL token position, kept entries scaled by
  ``1 / (1 - p)``: rank r applies ``keep[rows_r]`` (Megatron forks the random state per rank in the
  sequence-parallel region so that the shards' masks differ). ``keep=None``: no dropout.
* Collective log: functions taking ``log`` append ``(collective, full shape)`` per collective they model.

Exactness: the layer norm of a token depends on that token only, so sharding the sequence changes no
layer-norm value, and the reduce-scatter sums the same partial products in the same rank order as the
all-reduce: every sequence-parallel block here gives the tensor-parallel block's bits. Against the
single-device block the row-parallel sum is reordered; with exact inputs
(:func:`distcheck.strategies.sp_mlp_block_cases`) it is exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from distcheck.core.errors import ConfigError
from distcheck.core.validate import as_array, as_arrays, check_float, check_positive_int, check_type
from distcheck.core.vocab import Collective
from distcheck.parallel.tp.heads import attention, tp_attention_parts
from distcheck.parallel.tp.reference import column_parallel_parts, mlp, row_parallel_parts, split_bounds, split_sizes
from distcheck.parallel.tp.reference import layer_norm as plain_layer_norm

__all__ = [
    "sequence_bounds",
    "sequence_shards",
    "layer_norm",
    "dropout",
    "mlp_block",
    "sp_mlp_block",
    "attention_block",
    "sp_attention_block",
    "layer_norm_param_grads",
    "sp_layer_norm_param_grads",
    "all_gather_sequence",
    "reduce_scatter_sequence",
]


def _check_log(log: object) -> None:
    if log is not None:
        check_type("log", log, list, "must be a list (collectives are appended to it) or None")


def sequence_bounds(s: int, tp: int) -> list[tuple[int, int]]:
    """Rank-ordered ``(start, stop)`` token ranges of a sequence of ``s`` tokens over ``tp`` ranks
    (``numpy.array_split``). Raises ConfigError unless ``1 <= tp <= s``."""
    s = check_positive_int("s", s)
    tp = check_positive_int("tp", tp)
    if tp > s:
        raise ConfigError("tp", tp, f"must be at most s={s} (every rank holds at least one token)")
    return split_bounds(split_sizes(s, tp))


def sequence_shards(x: ArrayLike, tp: int) -> list[np.ndarray]:
    """Rank r's tokens ``x[rows_r]`` of ``x`` (s, h), for r = 0 .. tp-1. Raises ConfigError as
    :func:`sequence_bounds` or for an ``x`` that is not a 2-D finite array."""
    x = as_array("x", x, min_ndim=2)
    if x.ndim != 2:
        raise ConfigError("x.shape", x.shape, "must be (s, h): tokens first")
    return [x[lo:hi] for lo, hi in sequence_bounds(x.shape[0], tp)]


def all_gather_sequence(shards: Sequence[np.ndarray], *, log: list | None = None) -> np.ndarray:
    """Megatron's g (Korthikanti et al. 2022, Fig. 5): the sequence shards concatenated on every
    rank, (s, h). Appends ``("all_gather", (s, h))`` to ``log``."""
    _check_log(log)
    full = np.concatenate(list(shards), axis=0)
    if log is not None:
        log.append((Collective.ALL_GATHER, full.shape))
    return full


def reduce_scatter_sequence(partials: Sequence[np.ndarray], bounds: Sequence[tuple[int, int]], *,
                            log: list | None = None) -> list[np.ndarray]:
    """Megatron's g-bar: the partial outputs (each (s, h), one per rank) summed in rank order, rank r
    keeping rows ``bounds[r]``. Appends ``("reduce_scatter", (s, h))`` to ``log``."""
    _check_log(log)
    out = []
    for lo, hi in bounds:
        acc = partials[0][lo:hi]
        for p in partials[1:]:
            acc = acc + p[lo:hi]
        out.append(acc)
    if log is not None:
        log.append((Collective.REDUCE_SCATTER, partials[0].shape))
    return out


def _check_norm(h: int, weight: ArrayLike, bias: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    weight, bias = as_array("ln_weight", weight), as_array("ln_bias", bias)
    for name, a in (("ln_weight", weight), ("ln_bias", bias)):
        if a.shape != (h,):
            raise ConfigError(f"{name}.shape", a.shape, f"must be ({h},) (the hidden size)")
    return weight, bias


def layer_norm(x: ArrayLike, weight: ArrayLike, bias: ArrayLike, eps: float = 0.0) -> np.ndarray:
    """Layer norm of each token over the hidden dim, with weight and bias: (s, h) -> (s, h).

    Raises ConfigError on shapes, a negative or non-finite ``eps``, or ``eps == 0`` with a constant
    token (0/0)."""
    x = as_array("x", x, min_ndim=1)
    weight, bias = _check_norm(x.shape[-1], weight, bias)
    return plain_layer_norm(x, eps) * weight + bias


def dropout(y: np.ndarray, keep: ArrayLike | None, p: float) -> np.ndarray:
    """Inverted dropout: ``y / (1 - p)`` where ``keep``, else 0. ``keep`` None: ``y`` unchanged.
    Raises ConfigError unless ``0 <= p < 1`` and ``keep`` has ``y``'s shape."""
    if keep is None:
        return y
    p = check_float("p", p)
    if not 0 <= p < 1:
        raise ConfigError("p", p, "must be in [0, 1) (the probability of dropping an entry)")
    keep = np.asarray(keep, dtype=bool)
    if keep.shape != np.shape(y):
        raise ConfigError("keep.shape", keep.shape, f"must be {np.shape(y)} (the block's output)")
    return np.where(keep, y / (1 - p), 0.0)


def _keep_rows(keep: ArrayLike | None, s: int, h: int) -> np.ndarray | None:
    if keep is None:
        return None
    keep = np.asarray(keep, dtype=bool)
    if keep.shape != (s, h):
        raise ConfigError("keep.shape", keep.shape, f"must be ({s}, {h}): one flag per token and hidden unit")
    return keep


def mlp_block(x: ArrayLike, ln_weight: ArrayLike, ln_bias: ArrayLike, W_up: ArrayLike, W_down: ArrayLike,
              b_down: ArrayLike | None = None, *, keep: ArrayLike | None = None, p: float = 0.5,
              eps: float = 0.0) -> np.ndarray:
    """Single-device pre-norm MLP block ``x + dropout(relu(LN(x) W_up) W_down + b_down)``, (s, h).

    Raises ConfigError on mismatched shapes (see the module's conventions)."""
    x = as_array("x", x, min_ndim=2)
    y = mlp(layer_norm(x, ln_weight, ln_bias, eps), W_up, W_down, "relu", None, b_down)
    return x + dropout(y, _keep_rows(keep, *x.shape), p)


def _sp_input(x_shards: Sequence[ArrayLike]) -> tuple[list[np.ndarray], int, list[tuple[int, int]]]:
    shards = as_arrays("x_shards", x_shards, min_ndim=2)
    h = shards[0].shape[-1]
    for i, a in enumerate(shards):
        if a.ndim != 2 or a.shape[1] != h:
            raise ConfigError(f"x_shards[{i}].shape", a.shape, f"must be (tokens, {h}) like x_shards[0]")
    bounds, start = [], 0
    for a in shards:
        bounds.append((start, start + a.shape[0]))
        start += a.shape[0]
    return shards, start, bounds


def sp_mlp_block(x_shards: Sequence[ArrayLike], ln_weight: ArrayLike, ln_bias: ArrayLike, W_up: ArrayLike,
                 W_down: ArrayLike, b_down: ArrayLike | None = None, *, keep: ArrayLike | None = None, p: float = 0.5,
                 eps: float = 0.0, log: list | None = None) -> list[np.ndarray]:
    """The sequence-parallel MLP block over ``tp = len(x_shards)`` ranks; one output shard per rank.

    Rank r normalises its tokens, the normalised shards are all-gathered, the MLP runs tensor
    parallel (``W_up`` column-split, ReLU on each shard, ``W_down`` row-split), the partial outputs
    are reduce-scattered back to the sequence shards, ``b_down`` is added once, dropout uses
    ``keep[rows_r]`` and the residual is rank r's input. Logs one all-gather and one
    reduce-scatter. Concatenated, the shards are :func:`mlp_block` (exactly for the exact inputs of
    :func:`distcheck.strategies.sp_mlp_block_cases`).

    Args: ``x_shards``, tp arrays (s_r, h) (rank r's tokens, in order); the rest as :func:`mlp_block`.
    Raises ConfigError on mismatched shapes or ``tp > ffn``.
    """
    _check_log(log)
    shards, s, bounds = _sp_input(x_shards)
    tp = len(shards)
    keep = _keep_rows(keep, s, shards[0].shape[1])
    normed = [layer_norm(a, ln_weight, ln_bias, eps) for a in shards]       # on the sequence shards
    full = all_gather_sequence(normed, log=log)                              # g
    act = [np.maximum(part, 0) for part in column_parallel_parts(full, W_up, tp)]
    partials = row_parallel_parts(np.concatenate(act, axis=-1), W_down, tp)
    outs = reduce_scatter_sequence(partials, bounds, log=log)                # g-bar
    if b_down is not None:
        b_down = as_array("b_down", b_down)
        outs = [o + b_down for o in outs]
    return [a + dropout(o, None if keep is None else keep[lo:hi], p)
            for a, o, (lo, hi) in zip(shards, outs, bounds, strict=True)]


def attention_block(x: ArrayLike, ln_weight: ArrayLike, ln_bias: ArrayLike, Wq: ArrayLike, Wk: ArrayLike, Wv: ArrayLike,
                    Wo: ArrayLike, num_heads: int, num_kv_heads: int, *,
                    causal: bool = True, eps: float = 0.0) -> np.ndarray:
    """Single-device pre-norm attention block ``x + attention(LN(x))``, (s, h); attention as
    :func:`distcheck.parallel.tp.attention` (GQA, scaled, causal). Raises ConfigError on shapes or heads."""
    x = as_array("x", x, min_ndim=2)
    normed = layer_norm(x, ln_weight, ln_bias, eps)
    return x + attention(normed, Wq, Wk, Wv, Wo, num_heads, num_kv_heads, causal)


def sp_attention_block(x_shards: Sequence[ArrayLike], ln_weight: ArrayLike, ln_bias: ArrayLike, Wq: ArrayLike,
                       Wk: ArrayLike, Wv: ArrayLike, Wo: ArrayLike, num_heads: int, num_kv_heads: int, *,
                       causal: bool = True, eps: float = 0.0, log: list | None = None) -> list[np.ndarray]:
    """The sequence-parallel attention block over ``tp = len(x_shards)`` ranks (heads split as
    :func:`distcheck.parallel.tp.tp_attention_parts`): layer norm on the shards, one all-gather, the
    heads' partial outputs reduce-scattered back to the sequence shards, the residual added.
    Raises ConfigError unless tp divides both head counts, or on shapes."""
    _check_log(log)
    shards, _, bounds = _sp_input(x_shards)
    normed = [layer_norm(a, ln_weight, ln_bias, eps) for a in shards]
    full = all_gather_sequence(normed, log=log)
    partials = tp_attention_parts(full, Wq, Wk, Wv, Wo, num_heads, num_kv_heads, len(shards), causal)
    outs = reduce_scatter_sequence(partials, bounds, log=log)
    return [a + o for a, o in zip(shards, outs, strict=True)]


def _xhat(x: ArrayLike, eps: float) -> np.ndarray:
    return plain_layer_norm(as_array("x", x, min_ndim=2), eps)


def layer_norm_param_grads(x: ArrayLike, dy: ArrayLike, eps: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of the layer norm's ``weight`` and ``bias`` on the whole sequence:
    ``(sum_t dy_t * xhat_t, sum_t dy_t)``, each (h,); ``x`` and ``dy`` (s, h)."""
    x, dy = as_array("x", x, min_ndim=2), as_array("dy", dy, min_ndim=2)
    if dy.shape != x.shape:
        raise ConfigError("dy.shape", dy.shape, f"must be x's shape {x.shape}")
    return (dy * _xhat(x, eps)).sum(axis=0), dy.sum(axis=0)


def sp_layer_norm_param_grads(x_shards: Sequence[ArrayLike], dy_shards: Sequence[ArrayLike], eps: float = 0.0, *,
                              log: list | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The same gradients under sequence parallelism: each rank's sums over its own tokens, then one
    all-reduce per parameter (Megatron all-reduces the gradients of parameters marked
    ``sequence_parallel`` across the tensor-parallel group; a shard's sum alone misses the other
    ranks' tokens). Logs ``("all_reduce", (h,))`` twice. Raises ConfigError on shapes."""
    _check_log(log)
    shards, _, _ = _sp_input(x_shards)
    dys = as_arrays("dy_shards", dy_shards, min_ndim=2)
    if len(dys) != len(shards) or any(d.shape != a.shape for d, a in zip(dys, shards, strict=False)):
        raise ConfigError("dy_shards", [d.shape for d in dys],
                          f"must match x_shards' shapes {[a.shape for a in shards]}")
    parts = [layer_norm_param_grads(a, d, eps) for a, d in zip(shards, dys, strict=True)]
    dw, db = parts[0]
    for w, b in parts[1:]:
        dw, db = dw + w, db + b
    if log is not None:
        log.extend([(Collective.ALL_REDUCE, dw.shape), (Collective.ALL_REDUCE, db.shape)])
    return dw, db
