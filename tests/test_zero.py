"""ZeRO: explicit partitions (flat, FSDP2, ZeroRedundancyOptimizer) vs the ZeRO paper's closed forms."""

from __future__ import annotations

from fractions import Fraction
from math import prod

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distcheck.core.errors import ConfigError
from distcheck.core.units import GB, bytes_to
from distcheck.parallel.zero import (
    comm_elements_per_rank,
    fsdp2_shard_elements,
    fsdp2_shard_rows,
    model_state_bytes_per_gpu,
    partition,
    shard_elements,
    zero_redundancy_assignment,
    zero_redundancy_shard_elements,
)
from distcheck.parallel.zero import forms as F

PSI, N = 7_500_000_000, 64
PAPER_GB = {0: Fraction(120), 1: Fraction(3140625, 100000), 2: Fraction(16640625, 1000000), 3: Fraction(1875, 1000)}


@pytest.mark.parametrize("stage", range(4))
def test_zero_paper_example(stage):
    expected = PAPER_GB[stage] * GB
    assert model_state_bytes_per_gpu(PSI, N, stage) == expected
    assert F.BYTES_PER_GPU[stage](params=PSI, dp=N) == expected
    assert partition([PSI], N, stage).max_bytes == expected
    # the paper prints one decimal: 120 / 31.4 / 16.6 / 1.9 GB
    assert round(float(bytes_to(expected, "GB")), 1) == {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}[stage]


def test_paper_example_exact_values():
    assert [model_state_bytes_per_gpu(PSI, N, s) for s in range(4)] == [
        120_000_000_000, 31_406_250_000, 16_640_625_000, 1_875_000_000]


@settings(max_examples=50, deadline=None)
@given(per_rank=st.lists(st.integers(1, 1000), min_size=1, max_size=6), dp=st.integers(1, 16),
       stage=st.integers(0, 3), k=st.integers(0, 16))
def test_flat_equals_closed_form_when_dp_divides(per_rank, dp, stage, k):
    params = [n * dp for n in per_rank]  # every sum divisible by dp
    psi = sum(params)
    part = partition(params, dp, stage, "flat", k=k)
    expected = F.BYTES_PER_GPU[stage](params=psi, dp=dp, k=k)
    assert all(r.total_bytes == expected for r in part.per_rank)
    assert part.max_bytes == part.ideal_bytes == expected
    assert part.imbalance == 1 and part.excess_bytes == 0


@settings(max_examples=50, deadline=None)
@given(shapes=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 5)), min_size=1, max_size=6),
       dp=st.integers(1, 8), stage=st.integers(0, 3))
def test_fsdp2_equals_closed_form_when_dp_divides_dim0(shapes, dp, stage):
    shapes = [(r * dp, c) for r, c in shapes]
    psi = sum(prod(s) for s in shapes)
    part = partition(shapes, dp, stage, "fsdp2")
    assert part.max_bytes == F.BYTES_PER_GPU[stage](params=psi, dp=dp)
    assert len(set(part.shard_elements)) == 1


@settings(max_examples=50, deadline=None)
@given(shapes=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 5)), min_size=1, max_size=6),
       dp=st.integers(1, 8), stage=st.integers(0, 3))
def test_padding_never_below_ideal(shapes, dp, stage):
    psi = sum(prod(s) for s in shapes)
    for scheme in ("flat", "fsdp2", "zero_redundancy"):
        part = partition(shapes, dp, stage, scheme)
        assert part.max_bytes >= part.ideal_bytes == F.BYTES_PER_GPU[stage](params=psi, dp=dp)
        assert part.excess_bytes == part.max_bytes - part.ideal_bytes
    # unpadded FSDP2 shards and ZRO shards hold every element exactly once
    assert sum(fsdp2_shard_elements(shapes, dp, padded=False)) == psi
    assert sum(shard_elements(shapes, dp, "zero_redundancy")) == psi


def test_flat_padding_imbalance():
    part = partition([10], 4, 3)
    assert part.shard_elements == (3, 3, 3, 3)  # 10 padded to 12
    assert part.max_bytes == 16 * 3 == 48
    assert part.ideal_bytes == 40 and part.imbalance == Fraction(6, 5) and part.excess_bytes == 8
    assert model_state_bytes_per_gpu(10, 4, 3) == 48  # above the formula's 40
    assert partition([10], 4, 3, alignment=2).shard_elements == (4, 4, 4, 4)  # padded to 16
    assert partition([10], 4, 1).max_bytes == 4 * 10 + 12 * 3  # stage 1: only optimizer sharded


def test_fsdp2_chunking_hand_case():
    assert fsdp2_shard_rows(5, 4) == [2, 2, 1, 0]  # torch.chunk gives 3 chunks; the 4th is empty
    assert fsdp2_shard_rows(8, 3) == [3, 3, 2]
    assert fsdp2_shard_rows(1, 3) == [1, 0, 0]
    assert fsdp2_shard_elements([(5, 3), 7], 4) == [8, 8, 8, 8]
    assert fsdp2_shard_elements([(5, 3), 7], 4, padded=False) == [8, 8, 5, 1]
    # per-parameter padding costs more than one flat buffer: 32 vs 24 elements allocated
    assert sum(shard_elements([(5, 3), 7], 4, "flat")) == 24


def test_zero_redundancy_greedy_hand_cases():
    # sort largest first (stable), give each to the least-loaded rank, lowest rank on ties
    assert zero_redundancy_assignment([1, 3, 3, 2], 2) == [[1, 3], [2, 0]]
    assert zero_redundancy_assignment([5, 5, 4, 3, 3, 3], 3) == [[0, 4], [1, 5], [2, 3]]
    # greedy is not optimal: {3,3,2,2,2} on 2 ranks -> 7 / 5, where 6 / 6 exists
    assert zero_redundancy_shard_elements([3, 3, 2, 2, 2], 2) == [7, 5]
    part = partition([3, 3, 2, 2, 2], 2, 1, "zero_redundancy")
    assert part.max_bytes == 4 * 12 + 12 * 7 and part.ideal_bytes == 4 * 12 + 12 * 6
    assert part.excess_bytes == 12
    # more ranks than parameters: some ranks own nothing
    assert zero_redundancy_shard_elements([4, 1], 3) == [4, 1, 0]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torch_fsdp2_chunking_matches():
    torch = pytest.importorskip("torch")
    from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty

    for dim0 in range(1, 20):
        for dp in range(1, 9):
            chunks = _chunk_with_empty(torch.empty(dim0, 3), dp, dim=0)
            assert [c.size(0) for c in chunks] == fsdp2_shard_rows(dim0, dp)
            assert chunks[0].size(0) == -(-dim0 // dp)  # FSDP2's padded size is chunk 0's


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torch_zero_redundancy_partition_matches():
    torch = pytest.importorskip("torch")
    from torch.distributed.optim import ZeroRedundancyOptimizer

    cases = [([1, 3, 3, 2], 2), ([5, 5, 4, 3, 3, 3], 3), ([3, 3, 2, 2, 2], 2), ([7, 1, 7, 2, 9, 4, 4, 1], 3),
             ([4, 1], 3), ([2, 2, 2, 2, 2], 4)]
    for numels, dp in cases:
        tensors = [torch.empty(n) for n in numels]
        # drive the real method on a bare instance (no process group needed)
        zro = object.__new__(ZeroRedundancyOptimizer)
        zro.world_size = dp
        zro.param_groups = [{"params": tensors}]
        zro._partition_parameters_cache = []
        got = zro._partition_parameters()
        ids = {id(t): i for i, t in enumerate(tensors)}
        torch_assignment = [[ids[id(t)] for t in groups[0]["params"]] for groups in got]
        assert torch_assignment == zero_redundancy_assignment(numels, dp), (numels, dp)


@pytest.mark.parametrize("stage, key", [(0, "ddp"), (1, "stage1"), (2, "stage2"), (3, "stage3")])
def test_comm_reference_equals_forms(stage, key):
    for psi, dp in [(PSI, N), (10, 4), (1, 1)]:
        assert comm_elements_per_rank(psi, dp, stage) == F.COMM_ELEMENTS_PER_RANK[key](params=psi)
        assert comm_elements_per_rank(psi, dp, stage, exact_ring=True) == \
            Fraction(dp - 1, dp) * F.COMM_ELEMENTS_PER_RANK[key](params=psi)


def test_comm_figures():
    assert comm_elements_per_rank(PSI, N, 0) == 2 * PSI
    assert comm_elements_per_rank(PSI, N, 2) == 2 * PSI
    assert Fraction(comm_elements_per_rank(PSI, N, 3), comm_elements_per_rank(PSI, N, 0)) == Fraction(3, 2)
    assert comm_elements_per_rank(8, 4, 0, exact_ring=True) == 12


def test_form_names_and_sources():
    names = sorted(f.name for f in [*F.BYTES_PER_GPU.values(), *F.COMM_ELEMENTS_PER_RANK.values()])
    assert names == sorted([f"zero.bytes_per_gpu.stage{s}" for s in range(4)]
                           + [f"zero.comm_elements_per_rank.{k}" for k in ("ddp", "stage1", "stage2", "stage3")])
    assert F.BYTES_PER_GPU[3](params=12, dp=3) == 64  # k defaults to 12
    for f in [*F.BYTES_PER_GPU.values(), *F.COMM_ELEMENTS_PER_RANK.values()]:
        assert f.source.startswith("ZeRO paper") and f.description


@pytest.mark.parametrize("call, message", [
    (lambda: partition([10], 4, 4), "stage=4 must be 0, 1, 2 or 3"),
    (lambda: partition([10], 0, 1), "dp=0 must be >= 1"),
    (lambda: partition([10], 4, 1, "deepspeed"), "scheme='deepspeed' must be one of 'flat', 'fsdp2'"),
    (lambda: partition([], 4, 1), "params=[] must be a non-empty list"),
    (lambda: partition([0], 4, 1), "params[0] dimension=0 must be >= 1"),
    (lambda: partition([()], 4, 1), "params[0]=() must be a numel >= 1 or a non-empty shape"),
    (lambda: partition([10], 4, 1, "fsdp2", alignment=2), "alignment=2 is only used by scheme='flat'"),
    (lambda: partition([10], 4, 1, k=-1), "k=-1 must be >= 0"),
    (lambda: model_state_bytes_per_gpu(7.5e9, 64, 1), "params=7500000000.0 must be an integer"),
    (lambda: comm_elements_per_rank(10, 4, -1), "stage=-1 must be >= 0"),
    (lambda: comm_elements_per_rank(10, 4, 1, exact_ring=1), "exact_ring=1 must be a bool"),
])
def test_errors(call, message):
    with pytest.raises(ConfigError) as info:
        call()
    assert str(info.value).startswith(message)


# ---- per-rank lists: fast formulas agree with the per-rank definitions; huge dp refused


def _greedy_by_scan(numels, dp):
    """The definition: assign each parameter (largest first) to the rank with the smallest total, lowest rank on a
    tie."""
    order = sorted(range(len(numels)), key=lambda i: numels[i], reverse=True)
    sizes, ranks = [0] * dp, [[] for _ in range(dp)]
    for i in order:
        r = min(range(dp), key=lambda j: (sizes[j], j))
        ranks[r].append(i)
        sizes[r] += numels[i]
    return ranks


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=9), st.integers(1, 6))
def test_zero_redundancy_heap_matches_the_greedy_scan(numels, dp):
    assert zero_redundancy_assignment(numels, dp) == _greedy_by_scan(numels, dp)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 9), st.integers(1, 3)), min_size=1, max_size=4), st.integers(1, 12))
def test_fsdp2_unpadded_sum_matches_the_rows_of_each_rank(shapes, dp):
    expected = [sum(fsdp2_shard_rows(d0, dp)[r] * inner for d0, inner in shapes) for r in range(dp)]
    assert fsdp2_shard_elements(shapes, dp, padded=False) == expected


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 10**4), st.integers(1, 64), st.integers(0, 3), st.integers(0, 16))
def test_model_state_bytes_per_gpu_is_the_max_of_the_flat_partition(params, dp, stage, k):
    assert model_state_bytes_per_gpu(params, dp, stage, k) == partition([params], dp, stage, "flat", k=k).max_bytes


def test_per_rank_lists_refuse_a_huge_dp_and_the_formulas_take_it():
    for fn in (lambda: fsdp2_shard_rows(8, 2**40), lambda: shard_elements([8], 2**40),
               lambda: zero_redundancy_assignment([3, 2], 2**40), lambda: partition([8], 2**40, 3)):
        with pytest.raises(ConfigError, match=r"dp=1099511627776 must be <= 16777216"):
            fn()
    assert model_state_bytes_per_gpu(2**41, 2**40, 3) == 16 * 2  # 2 elements per rank, 16 bytes each
    with pytest.raises(ConfigError, match=r"numels\[1\]=0 must be >= 1"):
        zero_redundancy_assignment([3, 0], 2)
