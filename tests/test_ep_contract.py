"""The ``moe-layer`` contract on gloo worlds: the plain torch.distributed MoE of examples/my_moe.py and the
layer of distcheck.parallel.ep.plans are certified; the twin with capacity over the global batch fails with its
shrunk counterexample; the reference's conventions (residual, renormalised gates, aux loss) by hand; one rank is a
skip with the reason."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from distcheck.core.results import FAIL
from distcheck.engine.contracts.contract import get_contract
from distcheck.parallel.ep.contracts import expected
from distcheck.parallel.ep.strategies import EPMoECase

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # examples/my_moe.py, as `distcheck certify` finds it from the repository root
    sys.path.insert(0, str(ROOT))


def _case(**kw):
    base = dict(x=np.array([[1.0], [1.0]]), wg=np.array([[1.0, 0.0]]), w1=np.ones((2, 1, 1)), w2=np.ones((2, 1, 1)),
                dout=np.ones((2, 1)), ep=2, k=1, capacity_factor=0.5, router="topk_then_softmax")
    return EPMoECase(**{**base, **kw})


def test_conventions_by_hand():
    c = get_contract("moe-layer")
    opts = c.parse_options({})
    # one token per rank, both choose expert 0 (logit 1 > 0); capacity ceil(1 * 1 * 0.5 / 2) = 1: both kept
    got = expected(_case(), opts)
    assert got["out"].tolist() == [[2.0], [2.0]] and not got["dropped"].any() and got["capacity"] == 1
    # two tokens on each rank: the second over capacity 1, passed through (or 0 without the residual)
    four = _case(x=np.ones((4, 1)), dout=np.ones((4, 1)))
    assert expected(four, opts)["out"].ravel().tolist() == [2.0, 1.0, 2.0, 1.0]
    assert expected(four, c.parse_options({"residual": False}))["out"].ravel().tolist() == [1.0, 0.0, 1.0, 0.0]
    # top-2, capacity 1, two tokens per rank: token 0 keeps both choices (g0 + g1 = 1), token 1 drops both
    two = _case(x=np.ones((4, 1)), dout=np.ones((4, 1)), k=2)
    plain, renorm = expected(two, opts), expected(two, c.parse_options({"renormalise": True}))
    assert plain["out"][:2, 0].tolist() == [2.0, 1.0] and renorm["out"][:2, 0].tolist() == [2.0, 1.0]
    # aux: E sum f P over the batch; per rank equal here (both ranks alike); 1/E scale divides by E^2
    aux = expected(_case(), opts)["aux"]
    small = expected(_case(), c.parse_options({"aux_scale": "1/E", "aux_scope": "per_rank"}))["aux"]
    assert aux[0] == aux[1] and small[0] == pytest.approx(aux[0] / 4, rel=1e-15)


def test_one_rank_cannot_fail():
    why = get_contract("moe-layer").cannot_fail(1, get_contract("moe-layer").parse_options({}))
    assert why is not None and "world size 1" in why and "no all-to-all moves a token" in why


@pytest.mark.multiprocess
def test_example_and_plan_certified_global_capacity_twin_fails():
    pytest.importorskip("torch")
    from distcheck.certify.engine import certify
    from distcheck.runners import RankPool

    with warnings.catch_warnings(), RankPool(world_size=2, backend="gloo", timeout_s=90) as pool:
        warnings.simplefilter("ignore")
        good = certify("examples.my_moe:make", "moe-layer", pool=pool, seed=0, examples=10)
        plan = certify("distcheck.parallel.ep.plans:ALL_TO_ALL_MOE", "moe-layer", pool=pool, seed=0, examples=10)
        bad = certify("examples.my_moe:make_global_capacity", "moe-layer", pool=pool, seed=0, examples=20,
                      dtypes=("float32",))
        # the example keeps its gates as they are: held to renormalised gates (the bound then also covers the
        # router gradient through the softmax over all experts), forward and grads fail
        unnormalised = certify("examples.my_moe:make", "moe-layer", pool=pool, seed=0, examples=20,
                               dtypes=("float32",), options={"renormalise": True, "k": 2})
    good.assert_certified()
    plan.assert_certified()
    failed = {v.property: v for v in bad.verdicts if v.verdict == FAIL}
    assert {"all_to_all.forward", "all_to_all.backward"} <= set(failed)
    one = failed["all_to_all.forward"]
    # the smallest counterexample: one token per rank, two experts, top-1: C = 1 per rank, 2 from the whole batch
    assert one.counterexample.startswith("EPMoECase(ep=2, k=1,") and "x=[[-1.0], [-1.0]]" in one.counterexample
    assert "all_to_all x2 (S=8 B)" in one.failure and "all_to_all x2 (S=16 B)" in one.failure
    assert {v.property for v in unnormalised.verdicts if v.verdict == FAIL} == {"forward", "grads"}


@pytest.mark.multiprocess
@pytest.mark.slow
def test_example_certified_on_four_ranks():
    pytest.importorskip("torch")
    from distcheck.certify.engine import certify
    from distcheck.runners import RankPool

    with warnings.catch_warnings(), RankPool(world_size=4, backend="gloo", timeout_s=120) as pool:
        warnings.simplefilter("ignore")
        certify("examples.my_moe:make", "moe-layer", pool=pool, seed=0, examples=8).assert_certified()


@pytest.mark.multiprocess
@pytest.mark.parametrize("world", [2, 4])
def test_check_rows_on_gloo(world):
    pytest.importorskip("torch")
    from distcheck.certify.runs import contract_rows
    from distcheck.parallel.ep.checks import CERTIFY
    from distcheck.runners import RankPool

    with warnings.catch_warnings(), RankPool(world_size=world, backend="gloo", timeout_s=120) as pool:
        warnings.simplefilter("ignore")
        rows = {r.check: r for r in contract_rows(pool, CERTIFY, examples=4)}
    props = ("forward", "grads", "tokens", "aux_loss", "all_to_all.forward", "all_to_all.backward")
    assert set(rows) == {f"ep.all_to_all.{p}[{dt}]" for p in props for dt in ("float64", "float32")}
    assert {r.verdict for r in rows.values()} == {"pass"}, [r.detail for r in rows.values() if r.verdict != "pass"]
