"""pytest-benchmark variant of bench_pool.py: one example through a persistent pool vs a fresh world.

    python -m pytest benchmarks/test_bench_pool.py --benchmark-only --benchmark-group-by=param:world_size

Not part of the test suite (``testpaths`` does not include benchmarks/). Both
modes run the same all-reduce property, side by side in one run; the table
pytest-benchmark prints gives seconds per example (its ``OPS`` column is
examples per second).
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_pool  # rank functions live there (forked children find them by module name)

pytest.importorskip("pytest_benchmark")


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def world_size(request):
    return request.param


def test_persistent_pool(benchmark, world_size):
    from distcheck.runners import RankPool

    with RankPool(world_size, timeout_s=120) as pool:
        seeds = iter(range(10**9))
        result = benchmark.pedantic(lambda: pool.run(bench_pool.allreduce_property, next(seeds)),
                                    rounds=100, iterations=1, warmup_rounds=3)
    assert result == [True] * world_size


def test_fresh_forked_world_per_example(benchmark, world_size):
    from distcheck.runners import RankPool

    seeds = iter(range(1, 10**9))

    def one():
        with RankPool(world_size, timeout_s=120) as pool:
            return pool.run(bench_pool.allreduce_property, next(seeds))

    assert benchmark.pedantic(one, rounds=5, iterations=1, warmup_rounds=1) == [True] * world_size
