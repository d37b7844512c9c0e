"""Every rank's step record shipped once (distcheck.parallel.step.records): an array a lower rank holds bitwise
travels as ``Same(rank)``, a drifted replica as itself, and the check sees every rank's own value."""

from __future__ import annotations

import numpy as np
import pytest

from distcheck.parallel.step.compare import within
from distcheck.parallel.step.records import Same, dedupe, digests, restore


def _steps(w: np.ndarray, m: np.ndarray) -> list[dict]:
    return [{"params": {"w": w, "b": None}, "state": {"w": (m, m * m), "b": (None, None)}, "loss": 1.0}]


def _shipped(ranks: list[list[dict]]) -> list[dict]:
    every = [digests(s) for s in ranks]
    return [{"steps": dedupe(s, r, every)} for r, s in enumerate(ranks)]


def test_equal_arrays_travel_as_the_lowest_rank_and_come_back_as_one_object():
    w, m = np.arange(6.0).reshape(2, 3), np.full((2, 3), 0.5)
    shipped = _shipped([_steps(w, m), _steps(w.copy(), m.copy()), _steps(w.copy(), m.copy())])
    for r in (1, 2):
        st = shipped[r]["steps"][0]
        assert st["params"]["w"] == Same(0) and st["state"]["w"] == (Same(0), Same(0))
        assert st["params"]["b"] is None and st["loss"] == 1.0
    back = restore(shipped)
    assert all(back[r]["steps"][0]["params"]["w"] is back[0]["steps"][0]["params"]["w"] for r in (1, 2))
    np.testing.assert_array_equal(back[2]["steps"][0]["state"]["w"][1], m * m)


def test_a_drifted_replica_travels_as_itself_and_fails_the_comparison():
    w, m = np.arange(6.0).reshape(2, 3), np.full((2, 3), 0.5)
    drifted = w.copy()
    drifted[1, 2] = np.nextafter(drifted[1, 2], np.inf)  # one ulp: its own digest
    shipped = _shipped([_steps(w, m), _steps(drifted, m.copy()), _steps(drifted.copy(), m.copy())])
    assert isinstance(shipped[1]["steps"][0]["params"]["w"], np.ndarray)
    assert shipped[1]["steps"][0]["state"]["w"] == (Same(0), Same(0))
    assert shipped[2]["steps"][0]["params"]["w"] == Same(1)  # the lowest rank holding the same bits
    back = restore(shipped)
    got = [back[r]["steps"][0]["params"]["w"] for r in range(3)]
    out = within("w", w, got, bound=0.0)
    assert not out.ok and out.ranks == (1, 2)


def test_same_shape_and_dtype_are_part_of_the_digest():
    a = np.zeros(4)
    assert digests(_steps(a, a))[(0, "params", "w", 0)] != digests(_steps(a.reshape(2, 2), a))[(0, "params", "w", 0)]
    assert digests(_steps(a, a))[(0, "params", "w", 0)] != digests(_steps(a.astype(np.float32), a))[
        (0, "params", "w", 0)]


def test_a_reference_to_a_rank_that_does_not_hold_the_value_is_refused():
    w = np.ones(2)
    broken = [{"steps": _steps(w, w)}, {"steps": [{"params": {"w": Same(2)}, "state": {}}]},
              {"steps": [{"params": {"w": Same(0)}, "state": {}}]}]
    with pytest.raises(ValueError, match="refers to rank 0"):
        restore(broken)


def unsynced(model, mesh, layout):
    """Each replica steps on its own tokens: no all-reduce (the parameters drift apart)."""
    return model


@pytest.mark.multiprocess
def test_ranks_ship_dtensor_values_once_and_drifted_replicas_whole(gloo2):
    from distcheck.parallel.step.contracts import TrainingStep
    from distcheck.parallel.step.harness import run_step
    from distcheck.parallel.step.hooks import StepTarget
    from distcheck.parallel.step.reference import StepLayout
    from examples.my_step import parallelize
    from tests.test_step_own_model import _case

    fsdp = _case(StepLayout(dp_shard=2))
    res = gloo2.run(run_step, StepTarget(parallelize), fsdp, timeout_s=120)
    rank1 = res[1]["steps"][0]
    assert rank1["params"] and all(v == Same(0) for v in rank1["params"].values())
    assert all(m == (Same(0), Same(0)) for m in rank1["state"].values())
    assert all(isinstance(v, np.ndarray) for v in res[0]["steps"][0]["params"].values())
    assert all(v.ok for v in TrainingStep().check(fsdp, res, 2, "float64", {}).values())

    drift = _case(StepLayout(dp_replicate=2))
    res = gloo2.run(run_step, StepTarget(unsynced, axes=("dp_replicate",)), drift, timeout_s=120)
    assert all(isinstance(v, np.ndarray) for v in res[1]["steps"][0]["params"].values())
    outcome = TrainingStep().check(drift, res, 2, "float64", {})["params"]
    assert not outcome.ok and 1 in outcome.ranks


def test_arrays_gathered_by_construction_are_never_hashed_and_refer_to_the_mesh_lowest_rank():
    w, m = np.arange(6.0).reshape(2, 3), np.full((2, 3), 0.5)
    ranks = [_steps(w, m), _steps(w + 1.0, m.copy())]  # rank 1's w differs, but it is a DTensor's all-gather
    for st in ranks:
        st[0]["gathered"] = {("params", "w", 0): 0}
    every = [digests(s) for s in ranks]
    assert (0, "params", "w", 0) not in every[0] and (0, "state", "w", 0) in every[0]
    shipped = [dedupe(s, r, every) for r, s in enumerate(ranks)]
    assert shipped[1][0]["params"]["w"] == Same(0) and isinstance(shipped[0][0]["params"]["w"], np.ndarray)
    assert all("gathered" not in st for s in shipped for st in s)


@pytest.mark.multiprocess
def test_the_check_runs_on_rank0_and_the_parent_gets_outcomes_only(gloo2):
    from distcheck.certify.engine import rank_entry
    from distcheck.parallel.step.contracts import TrainingStep
    from distcheck.parallel.step.hooks import StepTarget
    from distcheck.parallel.step.reference import StepLayout
    from tests.test_step_own_model import _case

    contract = TrainingStep()
    case = _case(StepLayout(dp_replicate=2))
    target, options = contract.resolve(StepTarget(unsynced, axes=("dp_replicate",)), None, {})
    res = gloo2.run(rank_entry, contract, target, case, "float64", options, timeout_s=120)
    assert res[1] == {"checked_on_rank": 0} and set(res[0]) == {"outcomes"}
    out = contract.check(case, res, 2, "float64", {})
    assert not out["params"].ok and 1 in out["params"].ranks  # the drifted replica, checked on rank 0


def test_a_config_error_of_the_check_on_rank0_is_raised_in_the_parent():
    from distcheck.core.errors import ConfigError
    from distcheck.parallel.step.contracts import TrainingStep

    with pytest.raises(ConfigError, match="dtypes="):
        TrainingStep().check(None, [{"check_error": ConfigError("dtypes", "bfloat16", "is certified on CPU")}, {}],
                             2, "bfloat16", {})
