"""The training-step contract's bound (distcheck/parallel/step/bound.py): a value that cancels to 0 in the
reference is held to its kind's floor, never to 0; AdamW's update carries the moments' bounds into the
parameters' soundly (a Hypothesis property over perturbations inside the bounds); and a relative bug far above
rounding still fails."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from distcheck.parallel.step.bound import BOUND, _update_bound, kind_floor, param_bounds, value_bound
from distcheck.parallel.step.contracts import _within

ADAMW = {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}


def _one_step(**moments):
    """One reference step of two parameters: ``wq`` whose gradient cancelled to exactly 0, ``wv`` a live one."""
    state = {"wq": (np.zeros((2, 2)), np.zeros((2, 2))),
             "wv": (np.array([[0.05, -0.02], [0.01, 0.3]]), np.array([[2.5e-4, 4e-5], [1e-6, 9e-3]]))}
    state.update(moments)
    return [{"params": {"wq": np.ones((2, 2)), "wv": np.full((2, 2), -0.5)}, "state": state}]


def test_a_cancelled_value_is_held_to_its_kinds_floor_not_to_zero():
    # the training-step line at 4 ranks (docs/CONTRACTS.md): exp_avg of a query projection is exactly 0 in the reference
    # (one kept token) and -1.08e-21 on the tensor-parallel ranks; a bound scaled by its own tensor is 0
    step = _one_step()
    bounds = param_bounds(step, lr=2.0**-7, **ADAMW)[0]
    noisy = np.full((2, 2), -1.0768013538183986e-21)
    assert _within("exp_avg of wq", step[0]["state"]["wq"][0], [noisy], bound=bounds["wq"][1]).ok
    assert bounds["wq"][1].min() == BOUND * 0.3  # the floor: the largest exp_avg anywhere in the step
    # the old bound, 2^-32 (|v_ref| + max |V_ref|), was 0 there
    assert not _within("exp_avg of wq", step[0]["state"]["wq"][0], [noisy],
                       bound=value_bound(step[0]["state"]["wq"][0], 0.0)).ok


def test_a_bug_far_above_rounding_still_fails():
    step = _one_step()
    bounds = param_bounds(step, lr=2.0**-7, **ADAMW)[0]
    m = step[0]["state"]["wv"][0]
    out = _within("exp_avg of wv", m, [m * (1 + 2.0**-12)], bound=bounds["wv"][1])
    assert not out.ok and "exp_avg of wv: ranks [0] differ" in out.message
    p = step[0]["params"]["wv"]
    assert not _within("wv", p, [p * (1 + 2.0**-12)], bound=bounds["wv"][0]).ok


def test_kind_floor_reads_every_tensor_and_skips_none():
    assert kind_floor({"a": np.array([1.0, -3.0]), "b": np.array([[2.0]])}) == 3.0
    assert kind_floor([None, np.zeros(0), np.array([-0.5])]) == 0.5
    assert kind_floor([]) == 0.0


def test_adamw_carries_a_moments_deviation_where_v_is_zero():
    # a moment that cancelled (m = v = 0): its bound dm moves m / (sqrt(v) + eps) by up to dm / eps
    lr = 2.0**-4
    bounds = param_bounds(_one_step(), lr=lr, **ADAMW)[0]
    dm = BOUND * 0.3 / (1 - 0.9)
    assert bounds["wq"][0].min() >= lr * dm / 1e-8
    # a live entry (sqrt(v_hat) >> eps) is moved far less: the same dm over sqrt(v_hat)
    assert bounds["wv"][0].max() < 1e-3 * bounds["wq"][0].min()
    # the bias corrections of step 2 (1 - 0.9^2, 1 - 0.95^2) shrink m_hat's bound: each step starts from the
    # parallel run's state, so nothing is carried from step 1
    two = param_bounds(_one_step() * 2, lr=lr, **ADAMW)
    assert np.all(two[1]["wq"][0] < two[0]["wq"][0])


finite = st.floats(0.0, 1.0, allow_nan=False, allow_subnormal=False)


@given(m=st.floats(-1.0, 1.0), v=finite, dm=st.floats(0.0, 1e-3), dv=st.floats(0.0, 1e-3),
       a=st.floats(-1.0, 1.0), b=st.floats(-1.0, 1.0), eps=st.sampled_from((1e-8, 1e-6, 1e-3)))
def test_update_bound_contains_every_perturbation_inside_the_moments_bounds(m, v, dm, dv, a, b, eps):
    # soundness of the AdamW step: any m' within dm and v' >= 0 within dv move m / (sqrt(v) + eps) by at most
    # the bound (exact, no linearisation of the square root)
    m2, v2 = m + a * dm, max(0.0, v + b * dv)

    def f(x: float, y: float) -> float:
        return x / (np.sqrt(y) + eps)

    bound = float(_update_bound(np.array(m), np.array(v), np.array(dm), np.array(dv), eps))
    assert abs(f(m2, v2) - f(m, v)) <= bound * (1 + 1e-12) + 1e-300


def test_the_check_runs_no_torch_in_the_parent():
    # the parent forks the next world's ranks (the pool's default start method for gloo): once it has run torch's
    # thread pools a fork can deadlock (benchmarks/bench_step.py hung so when the reference ran in the check).
    # The reference runs on rank 0; the check reads it and imports no torch
    import subprocess
    import sys

    code = """
import sys
import numpy as np
from distcheck.parallel.step.case import FREE_MAX_NORM, StepCase
from distcheck.parallel.step.contracts import TrainingStep
from distcheck.parallel.step.model import TinyConfig
from distcheck.parallel.step.reference import StepLayout

cfg = TinyConfig(dim=8, n_layers=1, n_heads=1, n_kv_heads=1, head_dim=2, ffn_dim=4, vocab_size=8, tied=False)
case = StepCase(StepLayout(dp_shard=2), cfg, 1, 1, 2, (((((1,),),((1,),)),),), FREE_MAX_NORM, 2.0**-7, 0)
w = np.ones((2, 2))
step = {"loss": 2.0, "tokens": 2, "norm": 1.0, "scale": 1.0, "params": {"w": w}, "state": {"w": (0.1 * w, 0.01 * w)}}
rank = {"loss": 2.0, "tokens": 2.0, "norm": 1.0, "scale": 1.0, "residual": 0.0, "grad_max": 1.0, "local_tokens": 1,
        "params": {"w": w}, "state": {"w": (0.1 * w, 0.01 * w)}}
results = [{"steps": [rank], "dp_index": 0, "reference": [step]}, {"steps": [rank], "dp_index": 1}]
out = TrainingStep().check(case, results, 2, "float64", {})
print(sorted(p for p, o in out.items() if o.ok), "torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split("]")[-1].strip() == "False", out.stdout + out.stderr
    assert "'params'" in out.stdout and "'tokens'" in out.stdout, out.stdout + out.stderr
