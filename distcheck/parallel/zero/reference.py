"""ZeRO model-state memory per data-parallel rank, by partitioning explicitly.

This is the reference: it splits real parameter lists across ``dp`` ranks the
way three implementations do, counts what each rank stores, and derives bytes
from those counts. The ZeRO paper's closed forms (``zero.bytes_per_gpu.*`` in
:mod:`distcheck.parallel.zero.forms`) are checked against it; they agree exactly when
the partition is even and differ by the padding or the imbalance otherwise.

Partition schemes (``scheme=``):

``"flat"`` (DeepSpeed ZeRO-style)
    All parameters are concatenated into one flat buffer, padded with zeros to
    a multiple of ``alignment * dp`` elements, and cut into ``dp`` equal
    contiguous chunks; rank r owns chunk r. Every rank allocates the same
    padded chunk. ``alignment=1`` is the ZeRO paper's idealization; DeepSpeed
    pads further for NCCL alignment (version-dependent), pass it explicitly.

``"fsdp2"`` (PyTorch FSDP2, ``torch.distributed.fsdp.fully_shard``)
    Each parameter is sharded on dim 0 separately, with ``torch.chunk``
    semantics: chunks of ``ceil(dim0 / dp)`` rows, the last ones shorter or
    empty. FSDP2 allocates every rank's shard at the size of chunk 0 (the
    padded size, ``_fsdp_param.py``: ``padded_sharded_param_size =
    chunks[0].size()``), i.e. dim 0 padded to a multiple of ``dp``. Per-rank
    allocation is ``sum(ceil(dim0 / dp) * prod(shape[1:]))``.

``"zero_redundancy"`` (``torch.distributed.optim.ZeroRedundancyOptimizer``)
    Whole parameters are assigned to ranks, never split: sort by ``numel``
    largest first (Python's stable sort, so equal sizes keep their order),
    then give each to the rank whose running total is smallest, the lowest
    rank on ties (``_partition_parameters`` with ``_get_min_index``). No
    padding; ranks can be unbalanced.

Stages (ZeRO paper, Rajbhandari et al. 2020, section 5 and Figure 1): stage 0
replicates everything (DDP); stage 1 shards the optimizer state (P_os); stage 2
also the gradients (P_os+g); stage 3 also the parameters (P_os+g+p). Bytes per
element: ``weight_bytes`` (2, bf16), ``grad_bytes`` (2), ``k`` (12: fp32
master + Adam m + v).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from math import prod

from distcheck.core.errors import ConfigError
from distcheck.core.validate import (
    MAX_RANKS,
    as_int_list,
    check_at_most,
    check_bool,
    check_choice,
    check_nonnegative_int,
    check_positive_int,
)
from distcheck.core.vocab import Collective

__all__ = [
    "SCHEMES",
    "RankBytes",
    "ZeroPartition",
    "normalize_shapes",
    "flat_shard_elements",
    "fsdp2_shard_rows",
    "fsdp2_shard_elements",
    "zero_redundancy_assignment",
    "zero_redundancy_shard_elements",
    "shard_elements",
    "partition",
    "model_state_bytes_per_gpu",
    "comm_elements_per_rank",
]

#: the partitioning schemes of :func:`partition`: flat shards, FSDP2 (dim-0 rows, padded), ZeRO-Redundancy
SCHEMES = ("flat", "fsdp2", "zero_redundancy")

Shape = tuple[int, ...]
ShapeLike = int | Sequence[int]


def _exact(q: Fraction) -> int | Fraction:
    return int(q) if q.denominator == 1 else q


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_dp(dp: object) -> int:
    """dp: an int in 1..MAX_RANKS (the functions below list one entry per rank)."""
    dp = check_positive_int("dp", dp)
    return check_at_most("dp", dp, MAX_RANKS, "one entry is listed per rank "
                                              "(distcheck.core.validate.MAX_RANKS = 2**24); "
                                              "model_state_bytes_per_gpu and comm_elements_per_rank take any dp")


def normalize_shapes(params: Sequence[ShapeLike]) -> list[Shape]:
    """Turn a list of shapes or numels into a list of shape tuples (an int ``n`` is ``(n,)``).

    Raises:
        ConfigError: an empty list, a 0-d shape or a dimension that is not an int >= 1.
    """
    if isinstance(params, (int, str)) or not isinstance(params, Sequence) or len(params) == 0:
        raise ConfigError("params", params, "must be a non-empty list of shapes or numels")
    out: list[Shape] = []
    for i, p in enumerate(params):
        shape = ((p,) if isinstance(p, int) and not isinstance(p, bool)
                 else tuple(p) if isinstance(p, Sequence) else None)
        if not shape:
            raise ConfigError(f"params[{i}]", p, "must be a numel >= 1 or a non-empty shape")
        for dim in shape:
            check_positive_int(f"params[{i}] dimension", dim)
        out.append(shape)
    return out


def flat_shard_elements(numels: Sequence[int], dp: int, alignment: int = 1) -> list[int]:
    """Elements each rank allocates under the flat (DeepSpeed-style) partition.

    The buffer of ``sum(numels)`` elements is padded to a multiple of
    ``alignment * dp`` and cut into ``dp`` equal chunks.
    Returns ``dp`` equal integers.

    Raises ConfigError unless ``numels`` are integers >= 1, ``dp`` is an integer in
    ``1..MAX_RANKS`` and ``alignment`` an integer >= 1.
    """
    numels = as_int_list("numels", numels, min_value=1)
    _check_dp(dp)
    alignment = check_positive_int("alignment", alignment)
    total = sum(numels)
    padded = _ceil_div(total, alignment * dp) * alignment * dp
    return [padded // dp] * dp


def fsdp2_shard_rows(dim0: int, dp: int) -> list[int]:
    """Rows of dim 0 each rank holds (unpadded) under ``torch.chunk(t, dp, dim=0)``.

    ``torch.chunk`` makes chunks of ``ceil(dim0 / dp)`` rows; it may return
    fewer than ``dp`` chunks, and FSDP2 fills the missing ones with empty
    tensors (``_chunk_with_empty``). Example: dim0 = 5, dp = 4 -> [2, 2, 1, 0].

    Raises ConfigError unless ``dim0`` and ``dp`` are integers >= 1 (``dp <= MAX_RANKS``).
    """
    dim0 = check_positive_int("dim0", dim0)
    _check_dp(dp)
    c = _ceil_div(dim0, dp)
    return [max(0, min(c, dim0 - r * c)) for r in range(dp)]


def fsdp2_shard_elements(shapes: Sequence[ShapeLike], dp: int, padded: bool = True) -> list[int]:
    """Elements per rank under FSDP2 per-parameter dim-0 sharding.

    ``padded=True`` (what FSDP2 allocates): every rank holds
    ``ceil(dim0 / dp) * prod(shape[1:])`` per parameter. ``padded=False``: the
    real rows of :func:`fsdp2_shard_rows`, which sum to the parameter count.

    Work: O(len(shapes) + dp) (rank r's rows are ``c = ceil(dim0/dp)`` for the first
    ``dim0 // c`` ranks, the remainder on the next, 0 after).

    Raises ConfigError for ``dp`` outside ``1..MAX_RANKS``, a non-bool ``padded``
    or a bad shape (see :func:`normalize_shapes`).
    """
    _check_dp(dp)
    check_bool("padded", padded)
    shapes = normalize_shapes(shapes)
    if padded:
        return [sum(_ceil_div(shape[0], dp) * prod(shape[1:]) for shape in shapes)] * dp
    diff = [0] * (dp + 1)  # diff[r] - diff[r-1]: change of rank r's total over rank r-1
    for shape in shapes:
        inner, c = prod(shape[1:]), _ceil_div(shape[0], dp)
        full = shape[0] // c  # ranks with c rows
        diff[0] += c * inner
        diff[full] -= c * inner
        rest = shape[0] - full * c
        if rest:
            diff[full] += rest * inner
            diff[full + 1] -= rest * inner
    out, running = [], 0
    for r in range(dp):
        running += diff[r]
        out.append(running)
    return out


def zero_redundancy_assignment(numels: Sequence[int], dp: int) -> list[list[int]]:
    """Indices of the parameters each rank owns under ZeroRedundancyOptimizer's greedy rule.

    Sort parameters by numel, largest first (stable: ties keep input order);
    assign each to the rank with the smallest total so far, the lowest rank on
    a tie. Within a rank, indices appear in assignment order.

    Example: numels [1, 3, 3, 2], dp = 2 -> [[1, 3], [2, 0]] (totals 5 and 4).

    Work: O(n log dp) with a heap of (total, rank).

    Raises ConfigError unless ``numels`` are integers >= 1 and ``dp`` an integer in ``1..MAX_RANKS``.
    """
    numels = as_int_list("numels", numels, min_value=1)
    _check_dp(dp)
    order = sorted(range(len(numels)), key=lambda i: numels[i], reverse=True)
    heap = [(0, r) for r in range(dp)]  # (total so far, rank): the smallest total, then the lowest rank
    ranks: list[list[int]] = [[] for _ in range(dp)]
    for i in order:
        size, r = heapq.heappop(heap)
        ranks[r].append(i)
        heapq.heappush(heap, (size + numels[i], r))
    return ranks


def zero_redundancy_shard_elements(numels: Sequence[int], dp: int) -> list[int]:
    """Elements each rank owns under :func:`zero_redundancy_assignment` (same errors)."""
    assignment = zero_redundancy_assignment(numels, dp)
    return [sum(int(numels[i]) for i in idx) for idx in assignment]


def shard_elements(params: Sequence[ShapeLike], dp: int, scheme: str = "flat", alignment: int = 1) -> list[int]:
    """Elements of sharded state each of ``dp`` ranks allocates under ``scheme`` (see module doc).

    Raises ConfigError for an unknown ``scheme``, bad shapes or ``dp``, or an
    ``alignment`` other than 1 with a scheme other than ``"flat"``.
    """
    check_choice("scheme", scheme, SCHEMES)
    shapes = normalize_shapes(params)
    numels = [prod(s) for s in shapes]
    if scheme == "flat":
        return flat_shard_elements(numels, dp, alignment)
    if alignment != 1:
        raise ConfigError("alignment", alignment, f"is only used by scheme='flat' (got scheme={scheme!r})")
    if scheme == "fsdp2":
        return fsdp2_shard_elements(shapes, dp)
    return zero_redundancy_shard_elements(numels, dp)


@dataclass(frozen=True)
class RankBytes:
    """Model-state bytes one rank stores (exact integers)."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


@dataclass(frozen=True)
class ZeroPartition:
    """Result of :func:`partition`.

    Attributes:
        scheme, stage, dp: as given.
        params: total parameter count Psi (unpadded).
        shard_elements: elements of sharded state each rank allocates.
        per_rank: :class:`RankBytes` of each rank.
        ideal_bytes: per-rank bytes if Psi split exactly into dp parts (may be a Fraction).
    """

    scheme: str
    stage: int
    dp: int
    params: int
    shard_elements: tuple[int, ...]
    per_rank: tuple[RankBytes, ...]
    ideal_bytes: int | Fraction

    @property
    def max_bytes(self) -> int:
        """The largest per-rank total: what the busiest GPU needs."""
        return max(r.total_bytes for r in self.per_rank)

    @property
    def excess_bytes(self) -> int | Fraction:
        """``max_bytes - ideal_bytes`` (>= 0): the cost of padding or imbalance."""
        return _exact(Fraction(self.max_bytes) - Fraction(self.ideal_bytes))

    @property
    def imbalance(self) -> int | Fraction:
        """``max_bytes / ideal_bytes`` (>= 1; exactly 1 for an even split)."""
        return _exact(Fraction(self.max_bytes) / Fraction(self.ideal_bytes))


def _check_stage(stage: object) -> int:
    stage = check_nonnegative_int("stage", stage)
    if stage > 3:
        raise ConfigError("stage", stage, "must be 0, 1, 2 or 3")
    return stage


def partition(
    params: Sequence[ShapeLike],
    dp: int,
    stage: int,
    scheme: str = "flat",
    *,
    weight_bytes: int = 2,
    grad_bytes: int = 2,
    k: int = 12,
    alignment: int = 1,
) -> ZeroPartition:
    """Per-rank model-state bytes under ZeRO ``stage`` with partition ``scheme``.

    Args:
        params: parameter shapes (tuples) or numels (ints); FSDP2 shards dim 0.
        dp: data-parallel ranks N (>= 1).
        stage: 0 (DDP), 1 (optimizer state sharded), 2 (+ gradients), 3 (+ parameters).
        scheme: "flat", "fsdp2" or "zero_redundancy" (module doc).
        weight_bytes, grad_bytes, k: bytes per element of weights, gradients and
            optimizer state (defaults 2, 2, 12: mixed-precision Adam, ZeRO paper).
        alignment: flat scheme only: pad the buffer to a multiple of alignment * dp.

    Returns:
        :class:`ZeroPartition` with each rank's bytes, the max, and the ideal
        (the ZeRO paper's Figure 1 value with Psi / N).

    Raises:
        ConfigError: bad params, dp, stage, scheme, byte sizes or alignment.
    """
    stage = _check_stage(stage)
    dp = check_positive_int("dp", dp)
    for name, v in (("weight_bytes", weight_bytes), ("grad_bytes", grad_bytes), ("k", k)):
        check_nonnegative_int(name, v)
    shapes = normalize_shapes(params)
    total = sum(prod(s) for s in shapes)
    shards = shard_elements(shapes, dp, scheme, alignment)

    def held(sharded: bool, r: int) -> int:
        return shards[r] if sharded else total

    per_rank = tuple(
        RankBytes(
            params_bytes=weight_bytes * held(stage >= 3, r),
            grads_bytes=grad_bytes * held(stage >= 2, r),
            optimizer_bytes=k * held(stage >= 1, r),
        )
        for r in range(dp)
    )
    ideal_elems = Fraction(total, dp)

    def ideal(sharded: bool) -> Fraction:
        return ideal_elems if sharded else Fraction(total)

    ideal_bytes = weight_bytes * ideal(stage >= 3) + grad_bytes * ideal(stage >= 2) + k * ideal(stage >= 1)
    return ZeroPartition(scheme, stage, dp, total, tuple(shards), per_rank, _exact(ideal_bytes))


def model_state_bytes_per_gpu(params: int, dp: int, stage: int, k: int = 12) -> int:
    """Model-state bytes per GPU under ZeRO ``stage``, by flat-partitioning one buffer of ``params``.

    Weights and gradients are 2 bytes each (bf16/fp16) and the optimizer state
    ``k`` bytes per parameter. When ``dp`` divides ``params`` this is exactly the
    ZeRO paper's Figure 1 value (e.g. Psi = 7.5e9, N = 64, K = 12:
    120e9 / 31.40625e9 / 16.640625e9 / 1.875e9 bytes for stages 0..3); otherwise
    each rank allocates the padded chunk ``ceil(params / dp)`` and the result is
    slightly above the formula. O(1): every rank holds the same padded chunk, so
    no per-rank list is built and any ``dp`` works (equal to
    ``partition([params], dp, stage, "flat", k=k).max_bytes``).

    Raises:
        ConfigError: params or dp not an int >= 1, stage not in 0..3, k < 0.
    """
    params = check_positive_int("params", params)
    dp = check_positive_int("dp", dp)
    stage = _check_stage(stage)
    k = check_nonnegative_int("k", k)
    chunk = _ceil_div(params, dp)  # flat scheme, alignment 1: the buffer padded to a multiple of dp

    def held(sharded: bool) -> int:
        return chunk if sharded else params

    return 2 * held(stage >= 3) + 2 * held(stage >= 2) + k * held(stage >= 1)


def comm_elements_per_rank(params: int, dp: int, stage: int, exact_ring: bool = False) -> int | Fraction:
    """Elements each rank sends per training step under ZeRO ``stage`` (0 = DDP).

    Enumerates the collectives on the full parameter count Psi:
    stage 0 all-reduces gradients (= reduce-scatter + all-gather); stages 1 and 2
    reduce-scatter gradients and all-gather updated parameters; stage 3
    all-gathers parameters in the forward, again in the backward, and
    reduce-scatters gradients (ZeRO paper, section 7).

    Each reduce-scatter or all-gather of Psi elements costs a rank Psi in the
    paper's count (``exact_ring=False``: 2 Psi, 2 Psi, 2 Psi, 3 Psi), or
    ``(dp - 1) / dp * Psi`` with a ring (``exact_ring=True``; nccl-tests
    PERFORMANCE.md).

    Raises:
        ConfigError: params or dp not an int >= 1, stage not in 0..3.
    """
    params = check_positive_int("params", params)
    dp = check_positive_int("dp", dp)
    stage = _check_stage(stage)
    if not isinstance(exact_ring, bool):
        raise ConfigError("exact_ring", exact_ring, "must be a bool")
    collectives = {
        0: (Collective.REDUCE_SCATTER, Collective.ALL_GATHER),  # the two halves of one all-reduce
        1: (Collective.REDUCE_SCATTER, Collective.ALL_GATHER),
        2: (Collective.REDUCE_SCATTER, Collective.ALL_GATHER),
        3: (Collective.ALL_GATHER, Collective.ALL_GATHER, Collective.REDUCE_SCATTER),
    }[stage]
    per_collective = Fraction(dp - 1, dp) * params if exact_ring else Fraction(params)
    return _exact(sum((per_collective for _ in collectives), Fraction(0)))
