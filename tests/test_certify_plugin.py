"""The pytest plugin's certification support, through ``pytester``: the option group, the
``world_size`` marker, session-scoped rank pools, and a passing and a failing certification."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

pytest_plugins = ("pytester",)

ROOT = Path(__file__).resolve().parent.parent


def _plugin_args() -> list[str]:
    """``-p distcheck.pytest_plugin`` unless the installed ``pytest11`` entry point loads it already."""
    names = {ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
    return [] if "distcheck.pytest_plugin" in names else ["-p", "distcheck.pytest_plugin"]


@pytest.fixture
def run(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the examples/ package

    def go(*args, subprocess=False):
        call = pytester.runpytest_subprocess if subprocess else pytester.runpytest
        return call(*_plugin_args(), "-p", "no:cacheprovider", *args)

    return go


def test_help_shows_the_option_group(run):
    result = run("--help")
    text = result.stdout.str()
    for option in ("--distcheck-world-sizes=N[,N...]", "--distcheck-backend={gloo,threaded,nccl}",
                   "--distcheck-examples=N", "--distcheck-seed=SEED", "--distcheck-timeout=SECONDS",
                   "--distcheck-profile={dev,ci,thorough}"):
        assert option in text, option


def test_world_size_marker_is_registered(run):
    result = run("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.world_size(*sizes, backend=None): run the test once per world size*"])


def test_marker_parametrizes_by_world_size_without_starting_anything(pytester, run):
    pytester.makepyfile("""
        import sys
        import pytest

        @pytest.mark.world_size(2, 4, 8)
        def test_sizes(world_size):
            assert world_size in (2, 4, 8)
            assert "torch" not in sys.modules  # world_size alone starts no pool

        def test_default_from_the_option(world_size):
            assert world_size == 3
    """)
    result = run("-v", "--distcheck-world-sizes=3", subprocess=True)  # a fresh process: torch not loaded yet
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*test_sizes?ws2? PASSED*", "*test_sizes?ws8? PASSED*",
                                 "*test_default_from_the_option?ws3? PASSED*"])


@pytest.mark.parametrize("marker, message", [
    ("world_size(2, backnd='threaded')", "takes world sizes and backend=, not backnd"),
    ("world_size()", "needs world sizes that are integers >= 1, got []"),
    ("world_size(0)", "needs world sizes that are integers >= 1, got [0]"),
    ("world_size(2, backend='mpi')", "backend='mpi' must be one of gloo, threaded, nccl"),
])
def test_bad_marker_arguments_are_collection_errors(pytester, run, marker, message):
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.{marker}
        def test_x(world_size):
            pass
    """)
    result = run()
    assert result.ret == pytest.ExitCode.INTERRUPTED  # the collection error stops the session
    assert message in result.stdout.str()


def test_a_suites_own_world_size_is_left_alone(pytester, run):
    pytester.makeconftest("""
        import pytest

        @pytest.fixture
        def world_size():
            return 7
    """)
    pytester.makepyfile("""
        import pytest

        def test_own_fixture(world_size):
            assert world_size == 7

        @pytest.mark.parametrize("world_size", [5])
        def test_own_parameter(world_size):
            assert world_size == 5
    """)
    run().assert_outcomes(passed=2)


def test_marker_without_a_world_fixture_is_an_error(pytester, run):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.world_size(2)
        def test_x():
            pass
    """)
    result = run()
    result.stdout.fnmatch_lines(["*a test marked world_size must use the rank_pool or world_size fixture*"])


@pytest.mark.multiprocess
def test_pools_are_shared_and_certifications_pass_and_fail(pytester, run):
    pytester.makepyfile("""
        import sys
        import pytest

        from distcheck.certify import certify

        SEEN = {}

        def test_torch_not_imported_before_a_pool():
            assert "torch" not in sys.modules

        @pytest.mark.world_size(2, 4, backend="threaded")
        def test_row_parallel_is_certified(rank_pool, world_size):
            SEEN.setdefault(world_size, rank_pool)
            assert rank_pool.world_size == world_size and rank_pool.backend == "threaded"
            certify("examples.my_tp_layers:RowParallelLinear", contract="row-parallel-linear", pool=rank_pool,
                    examples=5, dtypes=["float64"]).assert_certified()

        @pytest.mark.world_size(2, backend="threaded")
        def test_same_pool_for_the_whole_session(rank_pool):
            assert SEEN[2] is rank_pool and rank_pool.running

        @pytest.mark.world_size(2, backend="threaded")
        def test_broken_layer(distcheck_certify):
            distcheck_certify("examples.my_tp_layers:RowParallelBiasEveryRank", "row-parallel-linear",
                              dtypes=["float64"]).assert_certified()
    """)
    result = run("-v", "--distcheck-examples=10", "--distcheck-seed=5", subprocess=True)
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines([
        "*test_row_parallel_is_certified?ws2-threaded? PASSED*",
        "*test_row_parallel_is_certified?ws4-threaded? PASSED*",
        "*CertificationFailed: examples.my_tp_layers:RowParallelBiasEveryRank is not certified under "
        "row-parallel-linear*",
        "*row-parallel-linear.forward?float64? at world size 2 (threaded) FAILED: output: ranks ?0, 1? differ from the "
        "reference*Shrunk case: TPCase(tp=2, *Reproduce: distcheck certify *--seed 5 * --examples 10 --dtypes float64*",
    ])
