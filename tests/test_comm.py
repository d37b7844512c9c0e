"""Collective simulations: results, bytes sent per rank, closed forms, conventions, errors."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distcheck.core.errors import ConfigError, PropertyFailure
from distcheck.parallel import comm
from distcheck.parallel.comm.forms import BYTES_PER_RANK

RING = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")

# ---------------------------------------------------------------- results on hand data


def test_all_reduce_hand_case():
    res = comm.ring_all_reduce([np.array([1, 2, 3, 4]), np.array([10, 20, 30, 40]), np.array([100, 200, 300, 400])])
    for out in res.outputs:
        assert out.tolist() == [111, 222, 333, 444]
    # 4 int64 elements on 3 ranks: chunks of 2, 1, 1 elements (16, 8, 8 bytes).
    # rank r skips chunk r+1 in phase 1 and chunk r+2 in phase 2: 64 - 8 - 8, 64 - 8 - 16, 64 - 16 - 8
    assert res.sent_bytes == (48, 40, 40)
    assert res.received_bytes == (40, 48, 40)
    assert res.steps == 4


def test_reduce_scatter_hand_case():
    res = comm.ring_reduce_scatter([np.array([1, 2, 3, 4]), np.array([5, 6, 7, 8])])
    assert [o.tolist() for o in res.outputs] == [[6, 8], [10, 12]]
    assert res.sent_bytes == (16, 16) and res.steps == 1


def test_all_gather_hand_case_unequal_shards():
    res = comm.ring_all_gather([np.array([1, 2, 3]), np.array([4]), np.array([5, 6])])
    for out in res.outputs:
        assert out.tolist() == [1, 2, 3, 4, 5, 6]
    assert res.size_bytes == 48
    # rank r sends every shard but shard r+1
    assert res.sent_bytes == (48 - 8, 48 - 16, 48 - 24)


def test_all_to_all_hand_case():
    res = comm.all_to_all([np.array([1, 2, 3]), np.array([4, 5, 6]), np.array([7, 8, 9])])
    assert [o.tolist() for o in res.outputs] == [[1, 4, 7], [2, 5, 8], [3, 6, 9]]
    assert res.sent_bytes == (16, 16, 16) and res.steps == 1


def test_broadcast_hand_case():
    res = comm.chain_broadcast(np.arange(6), 4, root=2, num_chunks=3)
    for out in res.outputs:
        assert out.tolist() == [0, 1, 2, 3, 4, 5]
    # chain 2 -> 3 -> 0 -> 1: every rank but the last (rank 1) forwards all 48 bytes
    assert res.sent_bytes == (48, 0, 48, 48)
    assert res.received_bytes == (48, 48, 0, 48)
    assert res.steps == 3 + 4 - 2


def test_float_all_reduce_within_bound():
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(40) for _ in range(5)]
    res = comm.ring_all_reduce(xs)
    bound = comm.sum_error_bound(xs)
    exact = [sum(Fraction(float(x[i])) for x in xs) for i in range(40)]
    for out in res.outputs:
        err = np.array([abs(Fraction(float(out[i])) - exact[i]) for i in range(40)], dtype=float)
        assert np.all(err <= bound / 2)  # one summation order is within gamma(n-1)*sum|x| of exact


def test_wrong_results_are_caught():
    from distcheck.parallel.comm import reference as comm  # the private checks of the simulations

    xs = [np.array([1, 2]), np.array([3, 4])]
    with pytest.raises(PropertyFailure):
        comm._check_sum(np.array([4, 7]), xs, "t")
    with pytest.raises(PropertyFailure):
        comm._check_sum(np.array([4.0, 6.0 + 1e-12]), [x.astype(float) for x in xs], "t")
    with pytest.raises(PropertyFailure):
        comm._check_equal(np.array([1, 2]), np.array([1, 3]), "t")


# ---------------------------------------------------------------- volumes vs closed forms


@settings(max_examples=40, deadline=None)
@given(collective=st.sampled_from(RING), n=st.integers(1, 7), per_rank=st.integers(0, 5))
def test_even_ring_volumes_equal_closed_forms(collective, n, per_rank):
    size_bytes = 8 * n * per_rank  # int64 elements, divisible by n
    res = comm.simulate(collective, size_bytes, n, seed=n + per_rank)
    form = BYTES_PER_RANK[collective].evaluate(size_bytes=size_bytes, n=n)
    assert res.even
    assert res.ideal_bytes_per_rank == form
    assert res.sent_bytes == (form,) * n
    assert res.received_bytes == (form,) * n
    assert comm.volume(collective, size_bytes, n) == form
    assert res.steps == {"all_reduce": 2 * (n - 1), "all_to_all": 1 if n > 1 else 0}.get(collective, n - 1)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 7), count=st.integers(0, 30), chunks=st.integers(1, 9))
def test_broadcast_volume(n, count, chunks):
    res = comm.chain_broadcast(np.arange(count, dtype=np.int64), n, root=count % n, num_chunks=chunks)
    size_bytes = 8 * count
    assert res.max_sent_bytes == BYTES_PER_RANK["broadcast"].evaluate(size_bytes=size_bytes, n=n) == size_bytes
    assert res.total_sent_bytes == (n - 1) * size_bytes
    assert sorted(res.sent_bytes) == [0] + [size_bytes] * (n - 1)
    assert res.steps == chunks + n - 2


def test_closed_form_values():
    S = 1_000_000
    assert BYTES_PER_RANK["all_reduce"].evaluate(size_bytes=S, n=8) == 1_750_000
    assert BYTES_PER_RANK["all_gather"].evaluate(size_bytes=S, n=8) == 875_000
    assert BYTES_PER_RANK["reduce_scatter"].evaluate(size_bytes=S, n=4) == 750_000
    assert BYTES_PER_RANK["all_to_all"].evaluate(size_bytes=S, n=3) == Fraction(2_000_000, 3)
    assert BYTES_PER_RANK["broadcast"].evaluate(size_bytes=S, n=8) == S
    assert {f.name for f in BYTES_PER_RANK.values()} == {f"comm.bytes_per_rank.{c}" for c in comm.COLLECTIVES}
    assert all(f.unit == "bytes" and "nccl-tests" in f.source for f in BYTES_PER_RANK.values())


@settings(max_examples=40, deadline=None)
@given(collective=st.sampled_from(RING), n=st.integers(2, 6), count=st.integers(0, 40))
def test_uneven_chunking(collective, n, count):
    size_bytes = 8 * count
    res = comm.simulate(collective, size_bytes, n, seed=count)
    ideal = res.ideal_bytes_per_rank
    assert res.total_sent_bytes == n * ideal  # the mean is the ideal
    slack = 2 * 8 if collective == "all_reduce" else 8  # < one element per ring phase
    assert ideal <= res.max_sent_bytes < ideal + slack
    if count % n:
        assert not res.even
        # ranks send different amounts, except all-reduce on 2 ranks (each skips both chunks once)
        assert (len(set(res.sent_bytes)) > 1) == (collective != "all_reduce" or n >= 3)


def test_uneven_all_reduce_hand_values():
    res = comm.simulate("all_reduce", 80, 3)  # 10 elements: chunks 4, 3, 3
    assert res.sent_bytes == (112, 104, 104)
    assert res.ideal_bytes_per_rank == Fraction(320, 3)


def test_single_rank_sends_nothing():
    for c in comm.COLLECTIVES:
        res = comm.simulate(c, 64, 1)
        assert res.sent_bytes == (0,) and res.steps == 0
        assert comm.volume(c, 64, 1) == 0


# ---------------------------------------------------------------- conventions


def test_shard_convention():
    # the chapter's "model_size / world_size" for all-gather is the shard s; a rank moves (n-1)*s
    S, n = 1_600, 8
    s = S // n
    for c in ("all_gather", "reduce_scatter", "all_to_all"):
        assert comm.volume(c, s, n, convention="shard") == (n - 1) * s == comm.volume(c, S, n)
    assert comm.volume("all_reduce", s, n, convention="shard") == 2 * (n - 1) * s
    assert comm.volume("all_gather", S, n) != s  # the shard is not the bytes moved
    # the chapter's "2 x model_size" for all-reduce is the n -> infinity limit, an upper bound
    assert comm.volume("all_reduce", S, n) < 2 * S
    assert set(comm.CONVENTIONS) == {"full", "shard"}


def test_bus_bandwidth_factors():
    assert comm.bus_bandwidth_factor("all_reduce", 8) == Fraction(7, 4)
    assert comm.bus_bandwidth_factor("all_gather", 8) == Fraction(7, 8)
    assert comm.bus_bandwidth_factor("broadcast", 8) == 1


# ---------------------------------------------------------------- errors


def test_errors():
    cases = [
        (lambda: comm.simulate("all_reduce", 10, 2), "size_bytes=10 must be a multiple of itemsize=8 (int64)"),
        (lambda: comm.simulate("allreduce", 8, 2),
         "collective='allreduce' must be one of 'all_reduce', 'all_gather', 'reduce_scatter', 'all_to_all', "
         "'broadcast'"),
        (lambda: comm.simulate("all_reduce", 8, 0), "n=0 must be >= 1"),
        (lambda: comm.simulate("all_reduce", -8, 2), "size_bytes=-8 must be >= 0"),
        (lambda: comm.ring_all_reduce([]), "n=0 must be >= 1"),
        (lambda: comm.ring_all_reduce([np.zeros(2), np.zeros(3)]),
         "inputs[1]=(3,) must have the shape of inputs[0] (2,)"),
        (lambda: comm.ring_all_reduce([np.zeros(2), np.zeros(2, dtype=np.int32)]),
         "inputs[1]=dtype('int32') must have the dtype of inputs[0] (float64)"),
        (lambda: comm.all_to_all([np.zeros((2, 2))]), "inputs[0]=(2, 2) must be a 1-D array"),
        (lambda: comm.chain_broadcast(np.zeros(4), 3, root=3), "root=3 must be in range(0, 3)"),
        (lambda: comm.chain_broadcast(np.zeros(4), 3, num_chunks=0), "num_chunks=0 must be >= 1"),
        (lambda: comm.volume("broadcast", 8, 2, convention="shard"),
         "convention='shard' does not apply to broadcast (the root holds the whole tensor)"),
        (lambda: comm.volume("all_gather", 8, 2, convention="bus"), "convention='bus' must be one of 'full', 'shard'"),
        (lambda: comm.volume("all_gather", -1, 2), "size_bytes=-1 must be >= 0"),
    ]
    for call, message in cases:
        with pytest.raises(ConfigError) as info:
            call()
        assert str(info.value) == message
    with pytest.raises(ConfigError, match="n=0 must be an integer >= 1"):
        BYTES_PER_RANK["all_reduce"].evaluate(size_bytes=8, n=0)
