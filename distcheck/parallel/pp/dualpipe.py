"""Orders of DualPipe and DualPipeV: two directions through the ranks, forward and backward overlapped.

Sources: DeepSeek-AI 2024, "DeepSeek-V3 Technical Report" (arXiv:2412.19437), §3.2.1 and
Figure 5; the DualPipe repository (``DualPipe.step`` and ``DualPipeV.step``, "cut-in-half").

Each rank holds two stages (rank ``r``: ``r`` and ``2p-1-r``) and runs eight steps, written
here for one (half-)pipeline of ``n`` ranks in which the rank sits at place ``r``, with
``c`` micro-batches per direction and its two stages ``s0`` (the down direction) and ``s1``:

1. ``2(n-r-1)`` forwards of ``s0``;
2. ``r+1`` (F ``s0``, F ``s1``);
3. ``n-r-1`` (I ``s1``, the oldest pending W, F ``s1``);
4. the main step, ``c - 2n + r + 1`` times two overlapped pairs: (F ``s0`` & B ``s1``),
   (F ``s1`` & B ``s0``); on the ranks next to the turn the first one is not overlapped
   (F, then B): overlapping it would only lengthen the bubble;
5. ``n-r-1`` (B ``s1``, then the pair F ``s1`` & B ``s0``);
6. ``r+1`` (backward ``s1``, backward ``s0``), full backwards switching to input passes
   from the middle on;
7. ``n-r-1`` (the oldest pending W, I ``s0``);
8. ``r+1`` pending W.

``dualpipev`` runs it on one pipeline of ``p`` ranks and ``2p`` stages (stage ``2p-1-r``
on rank ``r``: a V). ``dualpipe`` runs two half-pipelines of ``p/2`` ranks, mirrored, over
two copies of a ``p``-stage model: micro-batches ``0 .. m/2-1`` go down through stages
``0 .. p-1`` (stage ``k`` on rank ``k``), the others up through ``p .. 2p-1`` (stage
``p + k`` on rank ``p-1-k``).
"""

from __future__ import annotations

import numpy as np

from distcheck.parallel.pp.build import RankBuilder
from distcheck.parallel.pp.order import B, F, I, Order, from_arrays

__all__ = ["dualpipe", "dualpipev"]


def _eight_steps(b: RankBuilder, s0: int, s1: int, n: int, r: int, c: int, plain_first: bool) -> None:
    """The eight steps of the module docstring on one rank."""
    b.repeat(2 * (n - r - 1), [(F, s0)])
    b.repeat(r + 1, [(F, s0), (F, s1)])
    for _ in range(n - r - 1):
        b.one(I, s1)
        b.pop_w()
        b.one(F, s1)
    main = c - 2 * n + r + 1
    if main > 0 and plain_first:
        b.one(F, s0)
        b.one(B, s1)
        b.pair(s1, s0)
        main -= 1
    b.repeat(main, [(F, s0, True), (B, s1), (F, s1, True), (B, s0)])
    b.repeat(n - r - 1, [(B, s1), (F, s1, True), (B, s0)])
    split = False
    for i in range(r + 1):
        if i == (r + 1) // 2 and r % 2 == 1:
            split = True
        b.one(I if split else B, s1)
        if i == (r + 1) // 2 and r % 2 == 0:
            split = True
        b.one(I if split else B, s0)
    for _ in range(n - r - 1):
        b.pop_w()
        b.one(I, s0)
    for _ in range(r + 1):
        b.pop_w()


def dualpipev(p: int, m: int, v: int = 2) -> Order:
    """DualPipeV on ``p`` ranks, ``2p`` stages (module docstring); needs ``m >= 2p``."""
    ranks = []
    for r in range(p):
        b = RankBuilder()
        _eight_steps(b, r, 2 * p - 1 - r, p, r, m, plain_first=r == p - 1)
        ranks.append(b.arrays())
    return from_arrays(2 * p, m, ranks)


def dualpipe(p: int, m: int, v: int = 2) -> Order:
    """DualPipe on ``p`` ranks, two copies of a ``p``-stage model (module docstring); needs p
    and m even, ``m >= 2p``."""
    half, mh = p // 2, m // 2
    ranks = []
    for r in range(p):
        down, up = r, 2 * p - 1 - r
        b = RankBuilder(first_mb={up: mh})
        second = r >= half
        _eight_steps(b, up if second else down, down if second else up, half, min(r, p - 1 - r), mh,
                     plain_first=r in (half - 1, half))
        ranks.append(b.arrays())
    j = np.arange(m)
    return from_arrays(2 * p, m, ranks, routes=(np.where(j < mh, 0, p), np.where(j < mh, p - 1, 2 * p - 1)))
