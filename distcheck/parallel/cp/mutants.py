"""Mutants of context parallelism: the mistakes context-parallel attention makes.

==================================  ============================================  ==========================
mutant                              mistake                                       killed by
==================================  ============================================  ==========================
cp.merge.no_max_subtraction         partials rescaled to 0 instead of their       cp.merge.online_softmax
                                    common max: ``exp(m)`` overflows for logits
                                    above 709
cp.all_gather.local_causal_mask     the causal mask on local positions (the       cp.all_gather.attention
                                    query's index in its shard, the key's in
                                    the gathered K) instead of global ones
cp.balance.contiguous_chunks        "load balancing" that hands rank r the        cp.balance.equal_work
                                    contiguous positions [r s/cp, (r+1) s/cp)
cp.ulysses.heads_not_divisible      Ulysses that splits the heads unevenly        cp.ulysses.attention
                                    (``array_split``) instead of refusing cp
                                    not dividing them
cp.ring.skip_last_rotation          a ring of cp - 1 steps: every rank misses     cp.ring.attention
                                    the last K/V block (and one pass is saved)
==================================  ============================================  ==========================
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from distcheck.core.vocab import Collective
from distcheck.engine.mutants import mutant
from distcheck.parallel.cp import reference as ref
from distcheck.parallel.cp import variants as var

_Shards = Sequence[np.ndarray]

__all__ = ["cp_merge_no_max_subtraction", "cp_all_gather_local_causal_mask", "cp_balance_contiguous_chunks",
           "cp_ulysses_heads_not_divisible", "cp_ring_skip_last_rotation"]


@mutant("cp.merge.no_max_subtraction", "cp.merge.online_softmax")
def cp_merge_no_max_subtraction(a: ref.Partial, b: ref.Partial) -> ref.Partial:
    """The merge without the max: both partials rescaled by ``exp(m)`` to a common max of 0."""
    with np.errstate(over="ignore", invalid="ignore"):  # the overflow is the mistake shown
        wa = np.where(np.isfinite(a.m), np.exp(np.where(np.isfinite(a.m), a.m, 0.0)), 0.0)
        wb = np.where(np.isfinite(b.m), np.exp(np.where(np.isfinite(b.m), b.m, 0.0)), 0.0)
        return ref.Partial(np.zeros_like(a.m), a.l * wa + b.l * wb, a.acc * wa[..., None] + b.acc * wb[..., None])


@mutant("cp.all_gather.local_causal_mask", "cp.all_gather.attention")
def cp_all_gather_local_causal_mask(q_shards: _Shards, k_shards: _Shards, v_shards: _Shards,
                                    dout_shards: _Shards, positions: _Shards, *,
                                    causal: bool = True, log: var.Log | None = None,
                                    grad_log: var.Log | None = None) -> var.Step:
    """The all-gather variant masking by local indices: query i of a shard reads gathered keys 0 .. i."""
    k_all, v_all = np.concatenate(k_shards), np.concatenate(v_shards)
    if log is not None:
        log.extend([(Collective.ALL_GATHER, k_all.shape), (Collective.ALL_GATHER, v_all.shape)])
    local_k = np.arange(len(k_all))
    outs = [ref.finalize(ref.block_partial(q, k_all, v_all, np.arange(len(q)), local_k, causal))[0] for q in q_shards]
    grads = var.all_gather_attention_backward(q_shards, k_shards, v_shards, dout_shards, positions, causal=causal,
                                              log=grad_log)
    return outs, grads


@mutant("cp.balance.contiguous_chunks", "cp.balance.equal_work")
def cp_balance_contiguous_chunks(s: int, cp: int) -> list[np.ndarray]:
    """Rank r holds its two chunks side by side, chunks 2r and 2r + 1: the contiguous split."""
    return ref.contiguous_positions(s, cp)


@mutant("cp.ulysses.heads_not_divisible", "cp.ulysses.attention")
def cp_ulysses_heads_not_divisible(q_shards: _Shards, k_shards: _Shards, v_shards: _Shards,
                                   dout_shards: _Shards, positions: _Shards, *,
                                   causal: bool = True, log: var.Log | None = None,
                                   grad_log: var.Log | None = None) -> var.Step:
    """Ulysses splitting the heads with ``array_split`` when cp does not divide them, never refusing (the
    numbers come out right on one host; the all-to-all's equal buffers cannot exist)."""
    cp, H, Hkv = len(q_shards), q_shards[0].shape[1], k_shards[0].shape[1]
    if H % cp == 0 and Hkv % cp == 0:
        return var.ulysses_step(q_shards, k_shards, v_shards, dout_shards, positions, causal=causal, log=log,
                                grad_log=grad_log)
    order = np.concatenate(positions)
    q, k, v, do = (np.concatenate(x) for x in (q_shards, k_shards, v_shards, dout_shards))
    for lg, names in ((log, (q, k, v, q)), (grad_log, (q, q, k, v))):
        if lg is not None:
            lg.extend((Collective.ALL_TO_ALL, x[:len(q_shards[0])].shape) for x in names)
    g = H // Hkv
    out = np.zeros_like(q)
    for heads in np.array_split(np.arange(H), cp):
        for h in heads:
            part = ref.block_partial(q[:, [h]], k[:, [h // g]], v[:, [h // g]], order, order, causal)
            out[:, [h]] = ref.finalize(part)[0]
    dq, dk, dv = ref.full_attention_backward(q, k, v, do, causal, q_pos=order, k_pos=order)
    bounds = np.cumsum([0] + [len(x) for x in q_shards])

    def split(a: np.ndarray) -> list[np.ndarray]:
        return [a[bounds[r]:bounds[r + 1]] for r in range(cp)]

    return split(out), (split(dq), split(dk), split(dv))


@mutant("cp.ring.skip_last_rotation", "cp.ring.attention")
def cp_ring_skip_last_rotation(q_shards: _Shards, k_shards: _Shards, v_shards: _Shards,
                               dout_shards: _Shards, positions: _Shards, *,
                               causal: bool = True, log: var.Log | None = None,
                               grad_log: var.Log | None = None) -> var.Step:
    """A ring of cp - 1 steps in the forward: the last block is never attended (nor its pass sent)."""
    cp = len(q_shards)
    fwd = var._ring_forward(q_shards, k_shards, v_shards, positions, causal, None, steps=max(1, cp - 1))
    if log is not None:
        log.extend((var.RING_PASS, x[0].shape) for _ in range(max(0, cp - 2)) for x in (k_shards, v_shards))
    grads = var.ring_attention_backward(q_shards, k_shards, v_shards, dout_shards, positions, causal=causal,
                                        log=grad_log)
    return [o for o, _ in fwd], grads
