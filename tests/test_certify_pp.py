"""The pipeline-schedule contracts of distcheck certify (distcheck/parallel/pp/contracts.py): a user's
action table or a torch schedule class against the simulator, and, on a world, the gradients of one
step against the unsplit model's. Each property is shown failing on a known-wrong target."""

from __future__ import annotations

import warnings

import pytest

from distcheck.certify import certify
from distcheck.certify.worlds import LocalWorld
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.report import FAIL, PASS

TABLES = "examples.my_pipeline_schedules"


def _verdicts(cert):
    return {v.property: v for v in cert.verdicts}


def test_a_users_1f1b_table_is_certified():
    cert = certify(f"{TABLES}:one_f_one_b", "pipeline-table", options={"schedule": "1f1b"}, seed=0,
                   world=LocalWorld()).assert_certified()
    assert {v.property for v in cert.verdicts} == {"dependencies", "order", "bubble", "stash"}
    assert all(v.examples > 0 for v in cert.verdicts)


def test_one_warm_up_forward_too_many_fails_order_and_stash_not_bubble():
    cert = certify(f"{TABLES}:one_f_one_b_deep_warmup", "pipeline-table", options={"schedule": "1f1b"}, seed=0,
                   world=LocalWorld())
    v = _verdicts(cert)
    assert v["dependencies"].verdict == PASS and v["bubble"].verdict == PASS  # it runs, as long as 1F1B
    assert v["order"].verdict == FAIL and v["stash"].verdict == FAIL
    assert v["stash"].counterexample == "(1, 2)"
    assert v["stash"].failure == "p=1, m=2: peak in flight [2] != simulator's [1]"


def test_weight_pass_before_its_input_pass_deadlocks():
    cert = certify(f"{TABLES}:zb_h1_weight_first", "pipeline-table", options={"schedule": "zb_h1"}, seed=0,
                   world=LocalWorld())
    v = _verdicts(cert)
    assert {x.verdict for x in v.values()} == {FAIL}
    assert v["dependencies"].failure == ("p=1, m=1: the table does not replay: deadlock: rank 0 cannot run "
                                         "W(mb=0, stage=0) (rank 0 at W(mb=0, stage=0) waits for I(mb=0, stage=0))")


def test_a_table_needs_the_schedule_it_claims():
    with pytest.raises(ProtocolError, match="needs --option schedule=NAME"):
        certify(f"{TABLES}:one_f_one_b", "pipeline-table", world=LocalWorld())


def test_torch_tables_against_the_simulator():
    pytest.importorskip("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        certify("torch.distributed.pipelining:ScheduleDualPipeV", "pipeline-table", seed=0,
                world=LocalWorld()).assert_certified()
        cert = certify("torch.distributed.pipelining:Schedule1F1B", "pipeline-table", seed=0, world=LocalWorld())
    # the recorded torch 2.13 finding: the last rank's table names micro-batch m
    assert _verdicts(cert)["dependencies"].failure == ("p=1, m=1: the table does not replay: microbatch=1 must be "
                                                       "< num_microbatches=1 (in F(mb=1, stage=0) on rank 0)")


@pytest.mark.multiprocess
def test_a_torch_schedule_on_gloo_and_a_wrong_one():
    pytest.importorskip("torch")
    from distcheck.runners import RankPool

    with warnings.catch_warnings(), RankPool(world_size=2, backend="gloo", timeout_s=90) as pool:
        warnings.simplefilter("ignore")
        good = certify("torch.distributed.pipelining:ScheduleZBVZeroBubble", "pipeline-schedule", pool=pool, seed=0,
                       examples=10)
        bad = certify("examples.my_torch_schedules:GPipeMeanLoss", "pipeline-schedule", pool=pool, seed=0,
                      examples=10, options={"schedule": "gpipe"})
    good.assert_certified()
    assert _verdicts(good)["gradients"].regime == "bitwise"
    v = _verdicts(bad)
    assert [p for p, x in v.items() if x.verdict == FAIL] == ["gradients"]
    assert "differ from the unsplit model's" in v["gradients"].failure and v["gradients"].ranks == [0, 1]
