"""Orders of the zero-bubble schedules: the backward split into I (input gradient) and W (weight gradient).

Written from the definitions, each rank as a few phases (counts per rank ``r`` of ``p``):

``zb_h1`` (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", §2.1, ZB-H1)
    1F1B with the backward split: ``min(p-1-r, m)`` warm-up forwards, then (F, I) steps,
    rank ``r`` running the weight pass of micro-batch ``j`` right after the input pass of
    micro-batch ``j + r``: it holds back ``r`` weight passes, which fill the tail of the
    step. Every rank keeps at most ``p`` micro-batches in flight, like 1F1B.
``zb_h2`` (§2.2, ZB-H2)
    More warm-up forwards, ``min(2(p-1-r) + 1, m)`` (a rank holds up to ``2p-1``
    micro-batches), then (I, W, F) steps where rank ``r`` runs the weight pass of
    micro-batch ``j`` after the input pass of ``j + 2r``; its last ``2r`` weight passes
    form the tail: the trapezoid of 1F1B becomes a parallelogram, with no idle tick inside
    any rank's own window when ``t_f = t_i = t_w``. Reconstructed from the section's text
    and its Figure 3: the lag ``2r`` is the one of 0, r, p-1-r, 2r, 2(p-1-r) that leaves no
    such tick (docs/PIPELINES.md).
``interleaved_zb`` (torch's ``ScheduleInterleavedZeroBubble``: ZB-H1 over ``v`` chunks)
    Megatron-style rounds of ``m // max(1, m // p)`` micro-batches, chunk by chunk;
    ``min((v-1) * round + p-1-r, v m)`` warm-up forwards, then (F, I) steps with the weight
    passes held back by ``r`` as in ZB-H1. ``v = 1`` is ``zb_h1``.
``zb_v`` (§6, ZB-V; the order torch's ``ScheduleZBVZeroBubble`` builds)
    V placement (rank ``r`` holds stages ``r`` and ``2p-1-r``); with ``n = max(m, 2p-1)``:
    ``2(p-r)-1`` forwards of chunk 0; ``r`` (F1, F0); ``p-r`` (F1, I1, W1); then
    (F0, I0, W0, F1, I1, W1) while forwards remain, then (I0, W0, F1, I1, W1); ``r`` (I0, I1);
    ``p-r`` (I0, W0); the held-back W1, then W0. Micro-batches ``>= m`` are dropped.
"""

from __future__ import annotations

import numpy as np

from distcheck.parallel.pp.build import RankBuilder, interleave, rank_arrays
from distcheck.parallel.pp.order import F, I, Order, W, from_arrays

__all__ = ["zb_h1", "zb_h2", "interleaved_zb", "zb_v"]


def _zb1p_rank(r: int, p: int, m: int, v: int, per_round: int) -> list[np.ndarray]:
    total = m * v
    warmup = min((v - 1) * per_round + (p - 1 - r), total)
    k = np.arange(total)
    chunk = (k // per_round) % v
    mb = (k // (per_round * v)) * per_round + k % per_round  # the k-th pass of a chunk, counted per chunk
    fs, bs = chunk * p + r, (v - 1 - chunk) * p + r
    steady = total - warmup
    lag = min(r, total)
    s1 = min(lag, steady)  # steady steps before the first held-back weight pass runs
    i2 = np.arange(s1, steady)  # steady steps with a weight pass
    c1 = np.arange(steady, max(steady, lag))  # cool-down steps without one
    c2 = np.arange(max(steady, lag), total)  # cool-down steps with one
    tail = np.arange(max(0, total - lag), total)
    nF, nI, nW = (lambda n: np.full(n, F)), (lambda n: np.full(n, I)), (lambda n: np.full(n, W))
    parts = (
        (nF(warmup), fs[:warmup], mb[:warmup]),
        (interleave(nF(s1), nI(s1)), interleave(fs[warmup:warmup + s1], bs[:s1]),
         interleave(mb[warmup:warmup + s1], mb[:s1])),
        (interleave(nF(i2.size), nI(i2.size), nW(i2.size)), interleave(fs[warmup + i2], bs[i2], bs[i2 - lag]),
         interleave(mb[warmup + i2], mb[i2], mb[i2 - lag])),
        (nI(c1.size), bs[c1], mb[c1]),
        (interleave(nI(c2.size), nW(c2.size)), interleave(bs[c2], bs[c2 - lag]), interleave(mb[c2], mb[c2 - lag])),
        (nW(tail.size), bs[tail], mb[tail]),
    )
    return rank_arrays(*(np.concatenate([x[i] for x in parts]) for i in range(3)))


def interleaved_zb(p: int, m: int, v: int) -> Order:
    """torch's ScheduleInterleavedZeroBubble order (module docstring); needs ``m % max(1, m // p) == 0``."""
    per_round = m // max(1, m // p)
    return from_arrays(v * p, m, [_zb1p_rank(r, p, m, v, per_round) for r in range(p)])


def zb_h1(p: int, m: int, v: int = 1) -> Order:
    """ZB-H1 (module docstring)."""
    return from_arrays(p, m, [_zb1p_rank(r, p, m, 1, 1) for r in range(p)])


def zb_h2(p: int, m: int, v: int = 1) -> Order:
    """ZB-H2 (module docstring)."""
    ranks = []
    k = np.arange(m)
    for r in range(p):
        warm, lag = min(2 * (p - 1 - r) + 1, m), min(2 * r, m)
        with_f = m - warm  # steps k < with_f also run a forward
        kind = np.full((m, 3), -1, np.int64)
        mb = np.zeros((m, 3), np.int64)
        kind[:, 0], mb[:, 0] = I, k
        kind[lag:, 1], mb[lag:, 1] = W, k[: m - lag]
        kind[:with_f, 2], mb[:with_f, 2] = F, warm + k[:with_f]
        keep = kind.ravel() >= 0
        kinds = np.concatenate([np.full(warm, F), kind.ravel()[keep], np.full(lag, W)])
        mbs = np.concatenate([np.arange(warm), mb.ravel()[keep], np.arange(m - lag, m)])
        ranks.append(rank_arrays(kinds, np.full(kinds.size, r), mbs))
    return from_arrays(p, m, ranks)


def zb_v(p: int, m: int, v: int = 2) -> Order:
    """ZB-V (module docstring): stages ``r`` and ``2p-1-r`` on rank ``r``."""
    n = max(m, 2 * p - 1)
    ranks = []
    for r in range(p):
        s0, s1 = r, 2 * p - 1 - r
        b = RankBuilder()
        b.repeat(2 * (p - r) - 1, [(F, s0)])
        b.repeat(r, [(F, s1), (F, s0)])
        b.repeat(p - r, [(F, s1), (I, s1), (W, s1)])
        b.repeat(n - 2 * p + r + 1, [(F, s0), (I, s0), (W, s0), (F, s1), (I, s1), (W, s1)])
        b.repeat(p - r - 1, [(I, s0), (W, s0), (F, s1), (I, s1), (W, s1)])
        b.repeat(r, [(I, s0), (I, s1)])
        b.repeat(p - r, [(I, s0), (W, s0)])
        b.repeat(r, [(W, s1)])
        b.repeat(r, [(W, s0)])
        ranks.append(b.arrays(keep_below=m))
    return from_arrays(2 * p, m, ranks)
