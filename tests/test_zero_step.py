"""The sharded optimizer step contract: ZeRO-1 (torch's ZeroRedundancyOptimizer) and FSDP2
(fully_shard) as Hypothesis-driven properties on real worlds, the bytes each rank holds against
the ZeRO references, and the contract's ability to fail (a step that never sends the updated
parameters back, an optimizer that shards nothing, padded bytes held to the unpadded reference)."""

from __future__ import annotations

import sys
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from distcheck.certify import get_contract
from distcheck.parallel.zero.contracts import StepCase, exact_gradients, is_exact
from distcheck.report import PASS

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the examples/ package, as `distcheck certify` finds it from the repository root
    sys.path.insert(0, str(ROOT))

CONTRACT = get_contract("sharded-optimizer-step")
ZERO = "torch.distributed.optim:ZeroRedundancyOptimizer"
FSDP = "torch.distributed.fsdp:fully_shard"
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning")


def _case(widths, optimizer="adam", steps=1, batch=8, N=2, seed=0) -> StepCase:
    rng = np.random.default_rng(seed)
    weights = tuple(rng.integers(-4, 5, size=(b, a)) / 8 for a, b in pairwise(widths))
    biases = tuple(rng.integers(-4, 5, size=(b,)) / 8 for b in widths[1:])
    X = rng.integers(-3, 4, size=(batch, widths[0])).astype(np.float64)
    T = rng.integers(-3, 4, size=(batch, widths[-1])).astype(np.float64)
    return StepCase(N, optimizer, steps, weights, biases, X, T)


def _rank_results(pool, target, case, **options):
    """Every rank's raw results for one case (what the contract's check receives)."""
    from distcheck.certify.engine import rank_entry
    from distcheck.engine.contracts.targets import import_target

    opts = CONTRACT.parse_options(options)
    spec, opts = CONTRACT.resolve(import_target(target)[0], target, opts)
    return pool.run(rank_entry, CONTRACT, spec, case, "float64", opts), opts


# ----------------------------------------------------------------------------- pure parts


def test_the_exactness_guard_and_the_strategy():
    from hypothesis import given, settings

    exact_gradients(_case([5, 7, 3], "sgd", steps=2, batch=16))  # the old fixed example: exact
    big = _case([7, 7, 7, 7], "sgd", steps=2, batch=16)
    big = StepCase(2, "sgd", 2, tuple(W * 64 for W in big.weights), big.biases, big.X * 1e6, big.T)
    with pytest.raises(RuntimeError, match="distcheck defect: a drawn case is not exact in float64"):
        exact_gradients(big)
    assert not is_exact(big)

    @settings(max_examples=40, database=None, deadline=None)
    @given(CONTRACT.cases(4, "float64", CONTRACT.parse_options({})))
    def draws(case):
        assert is_exact(case) and case.steps == 1 or case.optimizer != "adam"
        assert len(case.widths) <= (4 if case.steps == 1 else 3) and case.X.shape[0] <= 16

    draws()
    assert CONTRACT.cases(2, "bfloat16", CONTRACT.parse_options({})) is None


def test_targets_of_each_kind_and_a_target_outside_the_protocol():
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from distcheck.certify import ProtocolError

    opts = CONTRACT.parse_options({})
    assert CONTRACT.resolve(ZeroRedundancyOptimizer, ZERO, opts)[0].kind == "optimizer"
    assert CONTRACT.resolve(fully_shard, FSDP, opts)[0].kind == "fully_shard"
    with pytest.raises(ProtocolError, match="sharded optimizer class"):
        CONTRACT.resolve(torch.nn.Linear, None, opts)


# ----------------------------------------------------------------------------- real worlds


@pytest.fixture(scope="module")
def gloo2():
    from distcheck.runners import RankPool

    with RankPool(2, backend="gloo", timeout_s=90,
                  preload=("torch.distributed.optim", "torch.distributed.fsdp")) as pool:
        yield pool


@pytest.mark.multiprocess
def test_zero1_bytes_are_whole_parameters_largest_first(gloo2):
    # widths [6, 10, 4]: parameters of 60, 10, 40, 4 elements; largest first to the lightest rank:
    # rank 0 gets [60], rank 1 [40, 10, 4] (54). Adam in float64 keeps 16 B per element: 960 B and 864 B,
    # against the ideal K * Psi / N = 16 * 114 / 2 = 912 B
    case = _case([6, 10, 4], "adam")
    results, opts = _rank_results(gloo2, ZERO, case)
    assert [r["state_bytes"] for r in results] == [960, 864] and [r["owned"] for r in results] == [[0], [1, 2, 3]]
    out = CONTRACT.check(case, results, 2, "float64", opts)
    assert out["params"].ok and out["params"].max_error == 0.0 and out["bytes_per_rank"].ok


@pytest.mark.multiprocess
def test_fsdp2_bytes_are_padded_for_parameters_and_gradients_and_the_check_can_fail(gloo2):
    # widths 5-7-3, SGD (no state), N = 2: each rank allocates the padded halves of dim 0 (4 of 7 rows, 2 of
    # 3 rows) of parameters and gradients: (4*5 + 4 + 2*7 + 2) * 8 * 2 = 640 B, against (4 + K) Psi / N = 528 B
    case = _case([5, 7, 3], "sgd", steps=2, batch=4)
    results, opts = _rank_results(gloo2, FSDP, case)
    assert [r["param_bytes"] + r["grad_bytes"] + r["state_bytes"] for r in results] == [640, 640]
    assert CONTRACT.check(case, results, 2, "float64", opts)["bytes_per_rank"].ok
    # a rank holding only its real rows (3 of 7, 1 of 3: the unpadded count) is off the padded reference
    unpadded = [dict(r, param_bytes=8 * (3 * 5 + 3 + 1 * 7 + 1)) if i == 1 else r for i, r in enumerate(results)]
    out = CONTRACT.check(case, unpadded, 2, "float64", opts)["bytes_per_rank"]
    assert not out.ok and out.ranks == (1,) and "parameters 208 B, reference 320 B" in out.message


@pytest.mark.multiprocess
def test_the_layers_stage_certifies_zero1_and_fsdp2_with_example_counts(gloo2):
    from distcheck.certify.runs import contract_rows
    from distcheck.parallel.zero.checks import CERTIFY

    rows = contract_rows(gloo2, CERTIFY)
    assert [r.check for r in rows] == [f"{run}.{prop}" for run in ("zero1", "fsdp2[reshard=True]",
                                                                   "fsdp2[reshard=False]")
                                       for prop in ("params", "bytes_per_rank")]
    assert {(r.verdict, r.examples) for r in rows} == {(PASS, 10)}, [r.detail for r in rows]


@pytest.mark.multiprocess
def test_a_zero_step_that_forgets_to_send_the_parameters_back_fails_naming_the_stale_ranks(gloo2):
    from distcheck.certify import certify

    cert = certify("examples.zero_mutants:ZeroWithoutAllGather", CONTRACT, pool=gloo2, examples=10)
    (v,) = cert.failures
    assert v.property == "params" and v.ranks  # the ranks whose copies are stale
    assert all(f"rank {r}: expected" in v.failure for r in v.ranks) and "(bitwise)" in v.failure
    assert v.counterexample.startswith("StepCase(N=2, ") and "Reproduce" not in v.counterexample
    cert = certify("examples.zero_mutants:StateOnEveryRank", CONTRACT, pool=gloo2, examples=10)
    assert [v.property for v in cert.failures] == ["bytes_per_rank"]
    assert "keeps the state of parameters" in cert.failures[0].failure


@pytest.mark.multiprocess
def test_zero1_and_fsdp2_on_a_threaded_world_of_4():
    from distcheck.certify import certify
    from distcheck.runners import RankPool

    with RankPool(4, backend="threaded", timeout_s=90) as pool:
        for target in (ZERO, FSDP):
            assert certify(target, CONTRACT, pool=pool, examples=4).ok


@pytest.mark.multiprocess
@pytest.mark.slow
def test_fsdp2_stays_bitwise_at_32_ranks_with_ranks_holding_no_rows():
    from distcheck.certify import certify
    from distcheck.runners import RankPool

    with RankPool(32, backend="threaded", timeout_s=180) as pool:
        cert = certify(FSDP, CONTRACT, pool=pool, examples=4)
    assert cert.ok, cert.report()
