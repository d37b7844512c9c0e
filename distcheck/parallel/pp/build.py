"""Helpers that build one rank's order as arrays: interleaving, 1F1B-shaped ranks, repeated patterns.

Used by :mod:`~distcheck.parallel.pp.schedules`, :mod:`~distcheck.parallel.pp.zero_bubble` and
:mod:`~distcheck.parallel.pp.dualpipe`. A rank is four arrays ``[kind, stage, microbatch,
overlap]`` (kind codes of :mod:`distcheck.parallel.pp.order`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import ArrayLike

from distcheck.parallel.pp.order import B, F, I, W

__all__ = ["RankBuilder", "interleave", "one_f_one_b_rank", "rank_arrays"]


def interleave(*arrays: np.ndarray) -> np.ndarray:
    """Equal-length arrays interleaved: ``a0[0], a1[0], ..., a0[1], a1[1], ...``."""
    if not arrays or not len(arrays[0]):
        return np.zeros(0, np.int64)
    return np.stack(arrays, axis=1).ravel()


def rank_arrays(kind: ArrayLike, stage: ArrayLike, microbatch: ArrayLike,
                overlap: ArrayLike | None = None) -> list[np.ndarray]:
    """``[kind, stage, microbatch, overlap]`` with the engine's dtypes."""
    kind = np.asarray(kind, np.int8)
    return [kind, np.asarray(stage, np.int64), np.asarray(microbatch, np.int64),
            np.zeros(kind.size, bool) if overlap is None else np.asarray(overlap, bool)]


def one_f_one_b_rank(total: int, warmup: int, fwd: Callable[..., tuple[np.ndarray, np.ndarray]],
                     bwd: Callable[..., tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
    """One rank of a 1F1B-shaped order: ``warmup`` forwards, then (forward, backward) steps,
    then the remaining backwards. ``fwd(k)``/``bwd(k)`` map the rank's k-th forward/backward
    (an array of k) to ``(stage, microbatch)`` arrays."""
    k = np.arange(total)
    fs, fm = fwd(k)
    bs, bm = bwd(k)
    steady = total - warmup
    kind = np.concatenate([np.full(warmup, F), interleave(np.full(steady, F), np.full(steady, B)), np.full(warmup, B)])
    stage = np.concatenate([fs[:warmup], interleave(fs[warmup:], bs[:steady]), bs[steady:]])
    mb = np.concatenate([fm[:warmup], interleave(fm[warmup:], bm[:steady]), bm[steady:]])
    return rank_arrays(kind, stage, mb)


class RankBuilder:
    """Builds one rank's order from single actions and vectorised repeats of a pattern.

    Micro-batch numbers come from counters per (counter, stage): forwards, backwards (``B``
    and ``I`` share one) and weight passes. ``first_mb`` gives a stage's first micro-batch
    (DualPipe's second direction starts at m/2). :meth:`pop_w` runs the weight pass of the
    oldest input pass not yet followed by one, of any stage (DualPipe's FIFO of weight passes).
    """

    def __init__(self, first_mb: dict[int, int] | None = None):
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.singles: tuple[list, list, list, list] = ([], [], [], [])  # actions not yet in parts
        self.count: dict[tuple[str, int], int] = {}
        self.first_mb = first_mb or {}
        self.pending_w: deque[tuple[int, int]] = deque()

    def _single(self, kind: int, stage: int, mb: int, overlap: bool) -> None:
        for column, value in zip(self.singles, (kind, stage, mb, overlap), strict=True):
            column.append(value)

    def _flush(self) -> None:
        if self.singles[0]:
            k, s, j, o = self.singles
            self.parts.append((np.array(k, np.int8), np.array(s, np.int64), np.array(j, np.int64), np.array(o, bool)))
            self.singles = ([], [], [], [])

    @staticmethod
    def _counter(kind: int, stage: int) -> tuple[str, int]:
        return ("W" if kind == W else "F" if kind == F else "BK", stage)

    def one(self, kind: int, stage: int, *, overlap: bool = False) -> None:
        """One action of ``kind`` on ``stage`` (the first member of a pair when ``overlap``)."""
        key = self._counter(kind, stage)
        c = self.count.get(key, 0)
        self.count[key] = c + 1
        mb = self.first_mb.get(stage, 0) + c
        if kind == I:
            self.pending_w.append((stage, mb))
        self._single(kind, stage, mb, overlap)

    def pair(self, f_stage: int, b_stage: int) -> None:
        """An overlapped pair: a forward of ``f_stage`` and a full backward of ``b_stage``."""
        self.one(F, f_stage, overlap=True)
        self.one(B, b_stage)

    def pop_w(self) -> None:
        """The weight pass of the oldest pending input pass (nothing when none is pending)."""
        if self.pending_w:
            stage, mb = self.pending_w.popleft()
            self._single(W, stage, mb, False)

    def repeat(self, n: int, pattern: Sequence[tuple[int, int] | tuple[int, int, bool]]) -> None:
        """``n`` times the ``pattern`` of ``(kind, stage)`` or ``(kind, stage, True)`` (the first
        member of an overlapped pair); each element takes the next micro-batch of its counter.
        Input passes made here never enter the weight-pass queue."""
        if n <= 0:
            return
        self._flush()
        kinds = np.array([e[0] for e in pattern], np.int8)
        stages = np.array([e[1] for e in pattern], np.int64)
        flags = np.array([len(e) > 2 and bool(e[2]) for e in pattern], bool)
        keys = [self._counter(e[0], e[1]) for e in pattern]
        per = {key: keys.count(key) for key in keys}
        mbs = np.empty((n, len(pattern)), np.int64)
        seen: dict[tuple, int] = {}
        for col, key in enumerate(keys):
            c = seen.get(key, 0)
            seen[key] = c + 1
            base = self.first_mb.get(key[1], 0) + self.count.get(key, 0)
            mbs[:, col] = base + np.arange(n) * per[key] + c
        for key, k in per.items():
            self.count[key] = self.count.get(key, 0) + n * k
        self.parts.append((np.tile(kinds, n), np.tile(stages, n), mbs.ravel(), np.tile(flags, n)))

    def arrays(self, keep_below: int | None = None) -> list[np.ndarray]:
        """The rank's ``[kind, stage, microbatch, overlap]``; ``keep_below`` drops the actions of
        micro-batches ``>= keep_below`` (padding of orders defined for larger m)."""
        self._flush()
        if not self.parts:
            return rank_arrays([], [], [])
        cols = [np.concatenate([part[i] for part in self.parts]) for i in range(4)]
        if keep_below is not None:
            keep = cols[2] < keep_below
            cols = [c[keep] for c in cols]
        return cols
