"""Reference simulations of collective algorithms, counting the bytes each rank sends.

Each simulation moves real numpy arrays between ``n`` simulated ranks one step
at a time (every message of a step is read before any is applied, as if the
sends were simultaneous), counts ``nbytes`` of every array a rank sends, and
checks its own result (sum, gather, scatter, block transpose or copy). It
raises :class:`~distcheck.core.errors.PropertyFailure` if the result is wrong.

Size convention ("full", nccl-tests doc/PERFORMANCE.md): ``S`` = ``size_bytes``
is the size of the FULL tensor: the array every rank holds for all-reduce,
reduce-scatter (input), all-to-all (each rank's buffer) and broadcast (the
root's buffer), and the concatenated OUTPUT of all-gather. Per-rank bytes sent
by the ring algorithms, with ``n`` ranks:

=============== =============== =============================================
collective      bytes per rank  algorithm simulated
=============== =============== =============================================
all_reduce      2(n-1)/n * S    ring: reduce-scatter then all-gather, n-1 steps each
all_gather      (n-1)/n * S     ring, n-1 steps
reduce_scatter  (n-1)/n * S     ring, n-1 steps
all_to_all      (n-1)/n * S     direct: each rank sends its n-1 foreign blocks
broadcast       S               pipelined chain root -> root+1 -> ...: every rank
                                but the last forwards all S bytes
=============== =============== =============================================

These factors are nccl-tests' bus-bandwidth factors (busbw = algbw * factor).
For broadcast "per rank" means the most any rank sends: each of the first
n-1 ranks of the chain sends S, the last sends 0, so the total is (n-1)*S;
nccl-tests gives broadcast busbw = algbw (factor 1).

The "shard" convention: sources often quote the per-rank shard ``s = S/n``
instead (the chapter's communication table writes ``model_size/world_size``
for all-gather and reduce-scatter). That is the size of the piece each rank
contributes or keeps, not the bytes it moves: a ring rank sends ``(n-1)*s``.
:func:`volume` takes ``convention="shard"`` to evaluate from ``s``.

Uneven chunking: when the element count ``S/itemsize`` is not divisible by
``n``, chunks follow ``numpy.array_split`` (the first ``count % n`` chunks get
one extra element). Ranks then send different amounts; for all-reduce,
all-gather, reduce-scatter and all-to-all the total over ranks is still exactly
``n * ideal`` (so the mean is the ideal) and the maximum exceeds the ideal by
less than one element per ring phase (all-reduce: < 2 elements, the others:
< 1 element). Broadcast volume does not depend on the chunking.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Generic, TypeVar

import numpy as np
from numpy.typing import DTypeLike

from distcheck.core.errors import ConfigError, PropertyFailure
from distcheck.core.validate import (
    as_array,
    as_arrays,
    check_at_most,
    check_choice,
    check_int,
    check_nonnegative_int,
    check_positive_int,
)
from distcheck.core.vocab import Collective, names
from distcheck.parallel.comm.ideal import CONVENTIONS, bus_bandwidth_factor, volume

__all__ = [
    "COLLECTIVES",
    "CONVENTIONS",
    "CommResult",
    "ring_all_reduce",
    "ring_all_gather",
    "ring_reduce_scatter",
    "all_to_all",
    "chain_broadcast",
    "simulate",
    "volume",
    "bus_bandwidth_factor",
    "sum_error_bound",
    "MAX_SIM_RANKS",
    "MAX_SIM_ELEMENTS",
]

#: the most ranks one simulated collective runs (a ring moves O(n**2) messages, one Python call each)
MAX_SIM_RANKS = 1024
#: the most elements one simulation holds over all ranks (n * elements per rank)
MAX_SIM_ELEMENTS = 2**24

#: the collectives simulated, by name (:class:`distcheck.core.vocab.Collective`)
COLLECTIVES = names(Collective)

@dataclass(frozen=True)
class CommResult:
    """What one simulated collective did.

    Attributes:
        collective: one of :data:`COLLECTIVES`.
        n: number of ranks.
        size_bytes: S, the full tensor in bytes (module convention).
        itemsize: bytes per element.
        sent_bytes: bytes each rank sent, indexed by rank.
        received_bytes: bytes each rank received, indexed by rank.
        steps: communication steps (rounds of simultaneous messages).
        ideal_bytes_per_rank: the closed-form per-rank volume for (S, n), exact.
        outputs: each rank's result array, indexed by rank.
    """

    collective: str
    n: int
    size_bytes: int
    itemsize: int
    sent_bytes: tuple[int, ...]
    received_bytes: tuple[int, ...]
    steps: int
    ideal_bytes_per_rank: Fraction
    outputs: tuple[np.ndarray, ...]

    @property
    def max_sent_bytes(self) -> int:
        return max(self.sent_bytes)

    @property
    def total_sent_bytes(self) -> int:
        return sum(self.sent_bytes)

    @property
    def even(self) -> bool:
        """True when the element count divides evenly into n chunks."""
        return (self.size_bytes // self.itemsize) % self.n == 0


_Tag = TypeVar("_Tag")


class _Net(Generic[_Tag]):
    """Counts bytes on every send; messages of a step are delivered together. A message is
    ``(src, dst, tag, data)``; the tag says which chunk it carries."""

    def __init__(self, n: int):
        self.n = n
        self.sent = [0] * n
        self.received = [0] * n
        self.steps = 0
        self._pending: list[tuple[int, int, _Tag, np.ndarray]] = []

    def send(self, src: int, dst: int, tag: _Tag, array: np.ndarray) -> None:
        if src == dst:
            raise RuntimeError("a rank does not send to itself")
        data = np.array(array, copy=True)
        self.sent[src] += data.nbytes
        self.received[dst] += data.nbytes
        self._pending.append((src, dst, tag, data))

    def deliver(self) -> list[tuple[int, int, _Tag, np.ndarray]]:
        msgs, self._pending = self._pending, []
        if msgs:
            self.steps += 1
        return msgs


def _check_inputs(arrays: Sequence[np.ndarray], name: str, same_shape: bool = True) -> list[np.ndarray]:
    """n in 1..MAX_SIM_RANKS finite integer/float 1-D arrays of one dtype (and shape), at
    most MAX_SIM_ELEMENTS elements in all."""
    arrays = as_arrays(name, arrays, min_len=0, allow_empty=True, allow_object=False, allow_bool=False)
    check_positive_int("n", len(arrays))
    check_at_most("n", len(arrays), MAX_SIM_RANKS, "comm.MAX_SIM_RANKS: ranks one simulated collective runs")
    total = len(arrays) * max(a.size for a in arrays)
    check_at_most(f"len({name}) * elements", total, MAX_SIM_ELEMENTS,
                  "comm.MAX_SIM_ELEMENTS: the simulation copies every buffer")
    for r, a in enumerate(arrays):
        if a.ndim != 1:
            raise ConfigError(f"{name}[{r}]", a.shape, "must be a 1-D array")
        if a.dtype != arrays[0].dtype:
            raise ConfigError(f"{name}[{r}]", a.dtype, f"must have the dtype of {name}[0] ({arrays[0].dtype})")
        if same_shape and a.shape != arrays[0].shape:
            raise ConfigError(f"{name}[{r}]", a.shape, f"must have the shape of {name}[0] {arrays[0].shape}")
    return arrays


def _bounds(count: int, n: int) -> list[tuple[int, int]]:
    """Chunk [start, stop) of each of n chunks, as numpy.array_split cuts them."""
    q, r = divmod(count, n)
    edges = [0]
    for i in range(n):
        edges.append(edges[-1] + q + (1 if i < r else 0))
    return [(edges[i], edges[i + 1]) for i in range(n)]


def sum_error_bound(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Elementwise bound on |a - b| for two sums of the same n terms in different orders.

    Zero for integer dtypes (exact, barring overflow). For floats, each
    recursive or pairwise sum of n terms is within ``gamma(n-1) * sum|x_i|`` of
    the exact sum, ``gamma(k) = k*u/(1 - k*u)`` with ``u`` the unit roundoff
    (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., §4.2), so
    two orders differ by at most ``2 * gamma(n-1) * sum|x_i|``.

    Raises ConfigError unless ``arrays`` is a non-empty list of finite numeric arrays of one shape.
    """
    arrays = as_arrays("arrays", arrays, allow_empty=True, allow_object=False)
    for r, a in enumerate(arrays):
        if a.shape != arrays[0].shape:
            raise ConfigError(f"arrays[{r}].shape", a.shape, f"must equal arrays[0].shape {arrays[0].shape}")
    stack = np.stack(arrays)
    if not np.issubdtype(stack.dtype, np.floating):
        return np.zeros(stack.shape[1:])
    k = stack.shape[0] - 1
    u = float(np.finfo(stack.dtype).eps) / 2
    gamma = k * u / (1 - k * u)
    return 2 * gamma * np.abs(stack.astype(np.float64)).sum(axis=0)


def _check_sum(got: np.ndarray, arrays: Sequence[np.ndarray], what: str) -> None:
    expected = np.stack(arrays).sum(axis=0, dtype=arrays[0].dtype)
    bound = sum_error_bound(arrays)
    err = np.abs(got.astype(np.float64) - expected.astype(np.float64)) if got.size else np.zeros(0)
    if got.shape != expected.shape or np.any(err > bound):
        worst = float(err.max()) if err.size else None
        raise PropertyFailure(f"{what}: reduced values wrong", max_error=worst,
                              bound=float(bound.max()) if bound.size else None)


def _check_equal(got: np.ndarray, expected: np.ndarray, what: str) -> None:
    if got.shape != expected.shape or not np.array_equal(got, expected):
        raise PropertyFailure(f"{what}: data differs from the expected copy", expected=expected.tolist()[:8],
                              got=got.tolist()[:8])


def _result(collective: str, n: int, size_bytes: int, itemsize: int, net: _Net[Any],
            outputs: Sequence[np.ndarray]) -> CommResult:
    return CommResult(
        collective=collective, n=n, size_bytes=size_bytes, itemsize=itemsize,
        sent_bytes=tuple(net.sent), received_bytes=tuple(net.received), steps=net.steps,
        ideal_bytes_per_rank=volume(collective, size_bytes, n), outputs=tuple(outputs),
    )


def _ring_start(inputs: Sequence[np.ndarray]) -> tuple[list[np.ndarray], int, list[np.ndarray],
                                                     list[tuple[int, int]], _Net[int]]:
    """Validated inputs, n, per-rank working copies, the array_split chunk bounds and a fresh network."""
    arrays = _check_inputs(inputs, "inputs")
    n = len(arrays)
    net: _Net[int] = _Net(n)  # tags: chunk indices
    return arrays, n, [a.copy() for a in arrays], _bounds(arrays[0].size, n), net


def _ring_phase(net: _Net[int], bufs: list[np.ndarray], bounds: Sequence[tuple[int, int]],
                shift: int, *, reduce: bool) -> None:
    """n-1 ring steps: at step k rank r sends chunk (r - k + shift) mod n to r+1, which adds
    it to its own chunk (``reduce=True``: the reduce-scatter phase) or stores it (the all-gather phase)."""
    n = len(bufs)
    for k in range(n - 1):
        for r in range(n):
            c = (r - k + shift) % n
            a, b = bounds[c]
            net.send(r, (r + 1) % n, c, bufs[r][a:b])
        for _src, dst, c, data in net.deliver():
            a, b = bounds[c]
            if reduce:
                bufs[dst][a:b] += data
            else:
                bufs[dst][a:b] = data


def _ring_reduce_scatter_phase(net: _Net[int], bufs: list[np.ndarray], bounds: Sequence[tuple[int, int]],
                               shift: int) -> None:
    _ring_phase(net, bufs, bounds, shift, reduce=True)


def _ring_all_gather_phase(net: _Net[int], bufs: list[np.ndarray], bounds: Sequence[tuple[int, int]],
                           shift: int) -> None:
    _ring_phase(net, bufs, bounds, shift, reduce=False)


def ring_all_reduce(inputs: Sequence[np.ndarray]) -> CommResult:
    """Ring all-reduce (sum) of ``n = len(inputs)`` equal-shape 1-D arrays.

    Phase 1 (reduce-scatter, n-1 steps): rank r sends chunk (r-k) mod n to
    rank r+1, which adds it to its own; afterwards rank r holds the full sum of
    chunk (r+1) mod n. Phase 2 (all-gather, n-1 steps): rank r forwards chunk
    (r+1-k) mod n. Rank r sends every chunk but (r+1) mod n in phase 1 and
    every chunk but (r+2) mod n in phase 2: ``2S - |chunk r+1| - |chunk r+2|``
    bytes, which is ``2(n-1)/n * S`` when n divides the element count.

    S = ``inputs[0].nbytes``. Every output is checked against the sum of the
    inputs: bitwise for integer dtypes, within :func:`sum_error_bound` for floats.
    Source: nccl-tests doc/PERFORMANCE.md (factor 2(n-1)/n).

    Raises ConfigError unless the inputs are n >= 1 equal-shape 1-D arrays.
    """
    arrays, n, bufs, bounds, net = _ring_start(inputs)
    _ring_reduce_scatter_phase(net, bufs, bounds, shift=0)
    _ring_all_gather_phase(net, bufs, bounds, shift=1)
    for r in range(n):
        _check_sum(bufs[r], arrays, f"all_reduce rank {r}")
    return _result(Collective.ALL_REDUCE, n, arrays[0].nbytes, arrays[0].itemsize, net, bufs)


def ring_reduce_scatter(inputs: Sequence[np.ndarray]) -> CommResult:
    """Ring reduce-scatter (sum): rank r ends with the sum of chunk r of all inputs.

    ``inputs``: n equal-shape 1-D arrays of S bytes each; chunk r is the r-th
    ``numpy.array_split`` piece. At step k rank r sends chunk (r-1-k) mod n to
    r+1, which adds it; rank r sends every chunk but its own:
    ``S - |chunk r|`` bytes = ``(n-1)/n * S`` when even.
    Outputs are checked as in :func:`ring_all_reduce`.

    Raises ConfigError unless the inputs are n >= 1 equal-shape 1-D arrays.
    """
    arrays, n, bufs, bounds, net = _ring_start(inputs)
    _ring_reduce_scatter_phase(net, bufs, bounds, shift=-1)
    outputs = []
    for r in range(n):
        a, b = bounds[r]
        outputs.append(bufs[r][a:b].copy())
        _check_sum(outputs[r], [x[a:b] for x in arrays], f"reduce_scatter rank {r}")
    return _result(Collective.REDUCE_SCATTER, n, arrays[0].nbytes, arrays[0].itemsize, net, outputs)


def ring_all_gather(shards: Sequence[np.ndarray]) -> CommResult:
    """Ring all-gather: every rank ends with ``concatenate(shards)``.

    ``shards``: n 1-D arrays of one dtype (rank r's shard); their sizes may
    differ. S = the concatenated output in bytes. At step k rank r sends
    block (r-k) mod n to r+1; rank r sends every block but (r+1) mod n:
    ``S - |shard r+1|`` bytes = ``(n-1)/n * S`` for equal shards.
    Outputs are checked bitwise (pure copies).

    Raises ConfigError unless the shards are n >= 1 1-D arrays of one dtype.
    Source: nccl-tests doc/PERFORMANCE.md (factor (n-1)/n).
    """
    arrays = _check_inputs(shards, "shards", same_shape=False)
    n = len(arrays)
    full = np.concatenate(arrays)
    edges = np.cumsum([0] + [a.size for a in arrays])
    bounds = [(int(edges[i]), int(edges[i + 1])) for i in range(n)]
    bufs = []
    for r in range(n):
        buf = np.zeros_like(full)
        a, b = bounds[r]
        buf[a:b] = arrays[r]
        bufs.append(buf)
    net: _Net[int] = _Net(n)  # tags: chunk indices
    _ring_all_gather_phase(net, bufs, bounds, shift=0)
    for r in range(n):
        _check_equal(bufs[r], full, f"all_gather rank {r}")
    return _result(Collective.ALL_GATHER, n, full.nbytes, full.itemsize, net, bufs)


def all_to_all(inputs: Sequence[np.ndarray]) -> CommResult:
    """All-to-all: rank r's block j (of n ``array_split`` blocks) goes to rank j.

    ``inputs``: n equal-shape 1-D arrays of S bytes each. Output of rank j is
    ``concatenate([block j of rank 0, ..., block j of rank n-1])`` (the block
    transpose), checked bitwise. One step; each rank sends its n-1 foreign
    blocks: ``S - |block r|`` bytes = ``(n-1)/n * S`` when even.

    Raises ConfigError unless the inputs are n >= 1 equal-shape 1-D arrays.
    Source: nccl-tests doc/PERFORMANCE.md (factor (n-1)/n).
    """
    arrays = _check_inputs(inputs, "inputs")
    n = len(arrays)
    bounds = _bounds(arrays[0].size, n)
    net: _Net[int] = _Net(n)  # tags: the sending rank
    received: list[dict[int, np.ndarray]] = [{} for _ in range(n)]
    for r in range(n):
        a, b = bounds[r]
        received[r][r] = arrays[r][a:b].copy()
        for j in range(n):
            if j != r:
                a, b = bounds[j]
                net.send(r, j, r, arrays[r][a:b])
    for src, dst, _tag, data in net.deliver():
        received[dst][src] = data
    outputs = [np.concatenate([received[j][r] for r in range(n)]) for j in range(n)]
    for j in range(n):
        a, b = bounds[j]
        _check_equal(outputs[j], np.concatenate([x[a:b] for x in arrays]), f"all_to_all rank {j}")
    return _result(Collective.ALL_TO_ALL, n, arrays[0].nbytes, arrays[0].itemsize, net, outputs)


def chain_broadcast(data: np.ndarray, n: int, *, root: int = 0, num_chunks: int | None = None) -> CommResult:
    """Pipelined chain broadcast of ``data`` (1-D, S bytes) from ``root`` to n ranks.

    The chain is root, root+1, ..., root+n-1 (mod n); ``data`` is cut into
    ``num_chunks`` pieces (default n; ``array_split``) and each rank forwards
    every piece it receives to the next rank, so a piece moves one hop per step
    and the broadcast takes ``num_chunks + n - 2`` steps. Per rank: each of the
    first n-1 ranks of the chain sends S bytes, the last sends 0 (max = S,
    total = (n-1)*S), whatever the chunking. Every rank's copy is checked bitwise.
    Raises ConfigError for n outside 1..MAX_SIM_RANKS, root outside range(n),
    num_chunks outside 1..MAX_SIM_RANKS, ``data`` not a finite 1-D integer/float
    array, or ``n * data.size > MAX_SIM_ELEMENTS``.
    """
    n = check_positive_int("n", n)
    check_at_most("n", n, MAX_SIM_RANKS, "comm.MAX_SIM_RANKS: ranks one simulated collective runs")
    root = check_nonnegative_int("root", root)
    if root >= n:
        raise ConfigError("root", root, f"must be in range(0, {n})")
    data = as_array("data", data, allow_empty=True, allow_object=False, allow_bool=False)
    if data.ndim != 1:
        raise ConfigError("data", data.shape, "must be a 1-D array")
    check_at_most("n * data.size", n * data.size, MAX_SIM_ELEMENTS, "comm.MAX_SIM_ELEMENTS: every rank holds a copy")
    num_chunks = n if num_chunks is None else check_positive_int("num_chunks", num_chunks)
    check_at_most("num_chunks", num_chunks, MAX_SIM_RANKS, "one message per chunk and hop")
    bounds = _bounds(data.size, num_chunks)
    chain = [(root + i) % n for i in range(n)]
    bufs = [np.zeros_like(data) for _ in range(n)]
    bufs[root][:] = data
    have: list[set[int]] = [set() for _ in range(n)]  # chunks a chain position holds but has not forwarded
    have[0] = set(range(num_chunks))
    net: _Net[tuple[int, int]] = _Net(n)  # tags: (receiving chain position, chunk)
    next_to_send = [0] * n
    while any(next_to_send[i] < num_chunks for i in range(n - 1)):
        for i in range(n - 1):  # every position but the last forwards, in chunk order
            c = next_to_send[i]
            if c < num_chunks and c in have[i]:
                a, b = bounds[c]
                net.send(chain[i], chain[i + 1], (i + 1, c), bufs[chain[i]][a:b])
                next_to_send[i] += 1
        msgs = net.deliver()
        if not msgs:
            raise RuntimeError("broadcast chain stalled")
        for _src, dst, (pos, c), piece in msgs:
            a, b = bounds[c]
            bufs[dst][a:b] = piece
            have[pos].add(c)
    for r in range(n):
        _check_equal(bufs[r], data, f"broadcast rank {r}")
    return _result(Collective.BROADCAST, n, data.nbytes, data.itemsize, net, bufs)


def simulate(collective: str, size_bytes: int, n: int, *, dtype: DTypeLike = np.int64, seed: int = 0) -> CommResult:
    """Run the simulation of ``collective`` on random integer-valued data.

    - ``size_bytes``: S, the full tensor (module convention); must be a
      multiple of the dtype's itemsize.
    - ``n``: ranks (>= 1). ``dtype``: element type (default int64, so sums are
      exact). ``seed``: for numpy's default_rng.

    Raises ConfigError for an unknown collective, a size that is not whole elements,
    a dtype that is not an integer or float type, a seed that is not an int >= 0,
    ``n > MAX_SIM_RANKS`` (1024) or ``n * size_bytes / itemsize > MAX_SIM_ELEMENTS``
    (2**24): for larger sizes use :func:`volume` or the closed forms ``comm.bytes_per_rank.*``.
    """
    check_choice("collective", collective, COLLECTIVES)
    size_bytes = check_nonnegative_int("size_bytes", size_bytes)
    n = check_positive_int("n", n)
    check_at_most("n", n, MAX_SIM_RANKS,
                  "comm.MAX_SIM_RANKS; use comm.volume or the closed forms comm.bytes_per_rank.* for more")
    try:
        np_dtype = np.dtype(dtype)
    except (TypeError, ValueError):
        raise ConfigError("dtype", dtype, "must be a numpy integer or float dtype") from None
    if np_dtype.kind not in "iuf":
        raise ConfigError("dtype", dtype, "must be a numpy integer or float dtype")
    check_int("seed", seed, min_value=0)
    itemsize = np_dtype.itemsize
    if size_bytes % itemsize:
        raise ConfigError("size_bytes", size_bytes, f"must be a multiple of itemsize={itemsize} ({np_dtype.name})")
    count = size_bytes // itemsize
    check_at_most("n * size_bytes / itemsize", n * count, MAX_SIM_ELEMENTS,
                  "comm.MAX_SIM_ELEMENTS; use comm.volume or the closed forms comm.bytes_per_rank.* for more")
    rng = np.random.default_rng(seed)

    def draw(k: int) -> np.ndarray:
        return rng.integers(-1000, 1000, size=k).astype(dtype)

    if collective == Collective.ALL_REDUCE:
        return ring_all_reduce([draw(count) for _ in range(n)])
    if collective == Collective.REDUCE_SCATTER:
        return ring_reduce_scatter([draw(count) for _ in range(n)])
    if collective == Collective.ALL_TO_ALL:
        return all_to_all([draw(count) for _ in range(n)])
    if collective == Collective.ALL_GATHER:
        full = draw(count)
        return ring_all_gather(np.array_split(full, n))
    return chain_broadcast(draw(count), n)
