"""Known-wrong implementations (mutants) and the properties that must kill them.

Each mutant is a small function with the same signature as the implementation slot
of one property (see :mod:`distcheck.props`), carrying one mistake that real code
makes. :func:`kill_mutants` runs each mutant's property with the mutant as ``impl``
and expects it to FAIL on the property's own claim (a wrong value, bound or count),
with a shrunk counterexample. A mutant that survives means the property is too weak;
a mutant that raises is *broken* (a crash proves nothing about the property). Either
way ``distcheck check`` FAILs the "mutants killed k/n" row (n = 16) and names it.

The mistakes (sources: "the lesson" is "Scaling and distributed training", "the chapter" is
"Chapter 26: Distributed Training" of *Language Modelling: The Complete Guide*):

=================================  ====================================  ===================================
mutant                             mistake                               killed by
=================================  ====================================  ===================================
dp.plain_mean_unequal              plain mean of shard means, unequal    dp.unequal_shards.weighted
                                   shards (lesson: error 0.067, 60 on 8)
accumulation.mean_of_means         per-micro-batch mean, then mean       accumulation.tokens.split_invariant
tp.mlp.row_then_column             row-split W_up, column-split W_down,  tp.mlp.exact
                                   no extra all-reduce (lesson, Predict)
tp.layer_norm.per_shard            layer norm over each shard's slice    tp.layer_norm.sharded_hidden
                                   of the hidden dim (lesson, Predict)
tp.row.bias_every_rank             bias added on every rank before the   tp.row.exact
                                   all-reduce (added tp times)
tp.row.unlogged_allreduce          takes the collective log but records  tp.row.exact (tp >= 2)
                                   no all-reduce (right numbers)
tp.swiglu.fused_naive_split        fused [gate|up] split as one matrix   tp.swiglu.fused
params.attention_ignores_kv        k/v sized with num_heads (no GQA)     params.total.closed_form
params.tied_counted_twice          tied head counted again               params.total.closed_form
params.tied_subtracted_twice       tied head subtracted twice            params.total.closed_form
layout.tp_outermost                mesh order puts TP groups across      layout.tp.node_local
                                   nodes (strided by dp*pp*cp)
pipeline.ratio_as_fraction         (p-1)/m reported as idle / TOTAL      pipeline.bubble_fraction.formula
zero.stage2_unsharded_grads        ZeRO-2 keeps full gradients           zero.bytes.figure1
=================================  ====================================  ===================================

Edge cases of the strategies (shapes and counts that do not divide), each a mistake
that only shows there:

=================================  ====================================  ===================================
tp.row.even_split_only             k // tp rows per rank: drops the      tp.row.exact (tp not dividing k)
                                   remainder rows
pipeline.stash_ignores_m           1F1B stash = p, without min(p, m)     pipeline.stash.formula (m < p)
zero.floor_partition               floor(params / dp) per rank           zero.bytes.padded (dp not dividing)
=================================  ====================================  ===================================
"""

from __future__ import annotations

import numpy as np

from distcheck.engine.mutants import Mutant, kill_mutant, kill_mutants, mutants
from distcheck.engine.mutants import mutant as _mutant
from distcheck.engine.mutants import registry as _registry

__all__ = ["Mutant", "MUTANTS", "mutants", "kill_mutant", "kill_mutants"]


# ----------------------------------------------------------------------------------------------
# data parallelism and accumulation


# ----------------------------------------------------------------------------------------------
# tensor parallelism


def _bounds(n: int, tp: int) -> list[tuple[int, int]]:
    edges = np.cumsum([0] + [len(c) for c in np.array_split(np.arange(n), tp)])
    return list(zip(edges[:-1].tolist(), edges[1:].tolist()))


@_mutant("tp.mlp.row_then_column", "tp.mlp.exact")
def row_then_column_mlp(x, W_up, W_down, tp, act="relu", b_up=None, b_down=None, *, log=None):
    """Row-split W_up and column-split W_down with no extra all-reduce: each rank applies the
    activation to its PARTIAL sum x_r W_up[r] and multiplies by its columns of W_down."""
    x, W_up, W_down = np.asarray(x), np.asarray(W_up), np.asarray(W_down)
    outs = []
    for (lo, hi), (clo, chi) in zip(_bounds(W_up.shape[0], tp), _bounds(W_down.shape[1], tp)):
        h = np.maximum(x[..., lo:hi] @ W_up[lo:hi, :], 0)
        outs.append(h @ W_down[:, clo:chi])
    y = np.concatenate(outs, axis=-1)
    return y if b_down is None else y + b_down


@_mutant("tp.layer_norm.per_shard", "tp.layer_norm.sharded_hidden")
def layer_norm_per_shard(x_shards, eps=1.0):
    """Layer norm applied to each rank's slice of the hidden dim with LOCAL mean and variance."""
    out = []
    for s in x_shards:
        mu = s.mean(axis=-1, keepdims=True)
        var = ((s - mu) ** 2).mean(axis=-1, keepdims=True)
        out.append((s - mu) / np.sqrt(var + eps))
    return out


@_mutant("tp.row.bias_every_rank", "tp.row.exact")
def row_parallel_bias_every_rank(x, W, tp, b=None, *, log=None):
    """Row-parallel linear where every rank adds the bias to its partial before the all-reduce."""
    x, W = np.asarray(x), np.asarray(W)
    out = None
    for lo, hi in _bounds(W.shape[0], tp):
        part = x[..., lo:hi] @ W[lo:hi, :]
        if b is not None:
            part = part + b
        out = part if out is None else out + part
    if log is not None:
        log.append(("all_reduce", out.shape))
    return out


@_mutant("tp.row.even_split_only", "tp.row.exact")
def row_parallel_even_split_only(x, W, tp, b=None, *, log=None):
    """Row-parallel linear that assumes tp divides in_features: every rank takes k // tp rows,
    so the last k % tp rows of W (and columns of x) are silently dropped."""
    x, W = np.asarray(x), np.asarray(W)
    chunk = W.shape[0] // tp
    out = sum(x[..., r * chunk:(r + 1) * chunk] @ W[r * chunk:(r + 1) * chunk, :] for r in range(tp))
    if log is not None:
        log.append(("all_reduce", np.shape(out)))
    return out if b is None else out + b


@_mutant("tp.row.unlogged_allreduce", "tp.row.exact")
def row_parallel_unlogged_allreduce(x, W, tp, b=None, *, log=None):
    """Row-parallel linear with the right numbers that takes the collective log but records no
    all-reduce: "one all-reduce per forward" is then unconfirmed, and the property must fail."""
    from distcheck.tp import row_parallel

    return row_parallel(x, W, tp, b)


@_mutant("tp.swiglu.fused_naive_split", "tp.swiglu.fused")
def swiglu_fused_naive_split(x, W_fused, W_down, tp, *, log=None):
    """Fused [gate | up] weight column-split as one matrix: rank r takes a contiguous block of
    the fused columns and splits it in half, pairing gate and up of different units."""
    x, W_fused, W_down = np.asarray(x), np.asarray(W_fused), np.asarray(W_down)
    total = None
    for (lo, hi), (dlo, dhi) in zip(_bounds(W_fused.shape[1], tp), _bounds(W_down.shape[0], tp)):
        gu = x @ W_fused[:, lo:hi]
        half = gu.shape[-1] // 2
        h = gu[..., :half] / (1 + np.exp(-gu[..., :half])) * gu[..., half:2 * half]
        part = h @ W_down[dlo:dlo + h.shape[-1], :]
        total = part if total is None else total + part
    if log is not None:
        log.append(("all_reduce", total.shape))
    return total


# ----------------------------------------------------------------------------------------------
# parameter counts


# ----------------------------------------------------------------------------------------------
# layout, pipeline, ZeRO


#: name -> Mutant, every registered mutant (the engine's registry itself)
MUTANTS = _registry()


def __getattr__(name: str) -> object:
    """Every registered mutant's function by its function name, wherever its package defines it:
    ``from distcheck.mutants import row_parallel_bias_every_rank``."""
    for m in MUTANTS.values():
        if m.function.__name__ == name:
            return m.function
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
