"""DDP exactness on real gloo worlds, and the checks' ability to fail."""

from __future__ import annotations

import numpy as np
import pytest

from distcheck import dp
from distcheck.errors import ConfigError
from distcheck.report import FAIL, PASS, SKIP
from distcheck.runners import ddp
from distcheck.runners.ddp import DDPExample


# ----------------------------------------------------------------------------- pure parts (no processes)


@pytest.mark.parametrize(
    "kwargs, field",
    [({"model": "cnn"}, "model"), ({"n": 0}, "n"), ({"seed": -1}, "seed"), ({"model": "mlp", "integer": False}, "integer")],
)
def test_example_validation(kwargs, field):
    with pytest.raises(ConfigError) as info:
        DDPExample(**kwargs)
    assert info.value.field == field


def test_default_examples_have_the_promised_shards():
    for N in (2, 4):
        for ex in ddp.default_examples(N, "equal", 5):
            assert len(set(dp.shard_sizes(ex.n, N))) == 1
        for ex in ddp.default_examples(N, "unequal", 5):
            assert len(set(dp.shard_sizes(ex.n, N))) == 2
    with pytest.raises(ConfigError):
        ddp.default_examples(1, "unequal")


def test_reference_matches_distcheck_dp_and_the_lesson_figure():
    # lesson: 60 examples on 8 ranks (8,8,8,8,7,7,7,7); the plain mean is off by a visible amount
    ex = DDPExample(model="linear", n=60, d=5, seed=3)
    ref = ddp.reference(ex, 8)
    params, X, y = ddp.make_data(ex)
    assert ref["sizes"] == [8, 8, 8, 8, 7, 7, 7, 7]
    np.testing.assert_array_equal(ref["plain"]["w"], dp.data_parallel_grad(dp.mse_grad, params["w"], X, y, 8))
    full = dp.mse_grad(params["w"], X, y)
    bound = dp.mse_dp_error_bound(params["w"], X, y, 8, "plain")
    assert np.all(np.abs(ref["plain"]["w"] - full - ref["bias"]["w"]) <= bound)
    assert np.max(np.abs(ref["bias"]["w"])) > 1e3 * np.max(bound)


def test_relu_mlp_reference_is_the_gradient():
    # exact integer data: the hand-written backward equals central differences of the exact (integer) loss
    for seed in range(200):  # a seed whose pre-activations avoid the ReLU kink at 0
        ex = DDPExample(model="mlp", n=6, d=3, hidden=4, out=2, seed=seed, integer=True)
        params, X, Y = ddp.make_data(ex)
        if np.all(X @ params["W1"] + params["b1"] != 0):
            break
    else:
        pytest.fail("no seed without a zero pre-activation")
    g = ddp._relu_mlp_grad_sum(params, X, Y)

    def loss(p):
        Z = X @ p["W1"] + p["b1"]
        return np.sum((np.maximum(Z, 0) @ p["W2"] + p["b2"] - Y) ** 2)

    h = 2.0**-20  # |pre-activation| >= 1 (nonzero integers): +-h never crosses the kink
    for k, v in params.items():
        for idx in np.ndindex(v.shape):
            up = {kk: vv.copy() for kk, vv in params.items()}
            dn = {kk: vv.copy() for kk, vv in params.items()}
            up[k][idx] += h
            dn[k][idx] -= h
            num = (loss(up) - loss(dn)) / (2 * h)
            assert abs(num - g[k][idx]) <= 1e-6 * max(1.0, abs(g[k][idx])), (k, idx)


def _fake_results(ex, N, plain_from):
    """Per-rank results as a correct DDP would return them, with 'plain' replaced by ``plain_from``."""
    ref = ddp.reference(ex, N)
    out = {"full": ref["full"], "plain": plain_from(ref), "hook": ref["full"], "loss_scale": ref["full"]}
    return [out] * N, ref


def test_checks_fail_on_wrong_implementations():
    eq = DDPExample(model="linear", n=12, d=3, seed=5)
    uneq = DDPExample(model="mlp", n=11, d=3, seed=6, integer=True)
    N = 4
    # correct answers pass
    res, ref = _fake_results(eq, N, lambda r: r["plain"])
    assert ddp._check_equal(eq, N, res, ref)[0]
    res, ref = _fake_results(uneq, N, lambda r: r["plain"])
    assert ddp._check_plain(uneq, N, res, ref)[0]
    assert ddp._check_weighted(uneq, N, res, ref)[0]
    # DDP that sums instead of averaging
    res, ref = _fake_results(eq, N, lambda r: {k: N * v for k, v in r["plain"].items()})
    assert not ddp._check_equal(eq, N, res, ref)[0]
    # a "plain" DDP that is secretly weighted: the plain-mean error is not there
    res, ref = _fake_results(uneq, N, lambda r: r["full"])
    ok, _, _, detail = ddp._check_plain(uneq, N, res, ref)
    assert not ok and "not detected" in detail
    # a weighted fix that is off by a relative 1e-9
    res, ref = _fake_results(uneq, N, lambda r: r["plain"])
    res = [dict(res[0], hook={k: v * (1 + 1e-9) for k, v in ref["full"].items()})] * N
    assert not ddp._check_weighted(uneq, N, res, ref)[0]


def test_bitwise_claim_is_not_weakened_to_a_bound():
    ex = DDPExample(model="linear", n=8, d=3, seed=2, integer=True)  # N=2, n_k=4: exact
    res, ref = _fake_results(ex, 2, lambda r: {k: np.nextafter(v, np.inf) for k, v in r["full"].items()})
    ok, err, bound, detail = ddp._check_equal(ex, 2, res, ref)
    assert not ok and bound == 0.0 and err > 0 and detail.startswith("bitwise")


def test_unavailable_backend_gives_skip_rows():
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        pytest.skip("GPUs present")
    rows = ddp.run_ddp_checks((2,), backend="nccl")
    assert [r.verdict for r in rows] == [SKIP] * 3
    assert all("nccl" in r.detail.lower() for r in rows)


# ----------------------------------------------------------------------------- real worlds


@pytest.mark.multiprocess
def test_ddp_rows_pass_at_2_and_4_ranks():
    rows = ddp.run_ddp_checks((2, 4), examples=4)
    assert [(r.check, r.world_size) for r in rows] == [
        (name, N) for N in (2, 4) for name in ("ddp.equal_shards", "ddp.unequal_shards.plain", "ddp.unequal_shards.weighted")
    ]
    for r in rows:
        assert r.verdict == PASS, r.detail
        assert r.examples == 4 and r.backend == "gloo"
        assert r.max_error is not None and r.max_error <= r.bound or r.bound == 0.0 and r.max_error == 0.0


@pytest.mark.multiprocess
def test_ddp_is_bitwise_for_integer_power_of_two_shards_and_shows_the_plain_mean_error():
    from distcheck.runners import RankPool

    exact = [DDPExample(model="linear", n=8, d=4, seed=1, integer=True),
             DDPExample(model="mlp", n=16, d=3, seed=2, integer=True)]
    uneven = DDPExample(model="linear", n=7, d=3, seed=3, integer=True)  # shards 4, 3
    with RankPool(2, timeout_s=60, preload=("torch._dynamo",)) as pool:
        res = pool.run(ddp.ddp_grad_checks, exact, ("plain",))
        res_uneven = pool.run(ddp.ddp_grad_checks, [uneven], ("plain", "hook", "loss_scale"))
    for i in range(len(exact)):
        for r in range(2):
            for k, v in res[r][i]["plain"].items():
                np.testing.assert_array_equal(v, res[r][i]["full"][k])
    out, ref = res_uneven[0][0], ddp.reference(uneven, 2)
    observed = out["plain"]["w"] - out["full"]["w"]
    # closed form: (1/(N n_k) - 1/n) weights; here 1/8 - 1/7 and 1/6 - 1/7
    assert ref["sizes"] == [4, 3]
    bound = ddp._scaled(dp.gamma(ref["K"]), ref["M_plain"], ref["M_full"], ref["M_bias"])["w"]
    assert np.all(np.abs(observed - ref["bias"]["w"]) <= bound)
    assert np.max(np.abs(observed)) > 1e6 * np.max(bound)
    for method in ("hook", "loss_scale"):
        assert np.max(np.abs(out[method]["w"] - out["full"]["w"])) <= np.max(bound)


@pytest.mark.multiprocess
def test_ddp_rows_on_the_threaded_backend():
    from distcheck.runners import RankPool

    with RankPool(4, backend="threaded", timeout_s=60) as pool:
        rows = ddp.ddp_rows(pool, 2)
    assert [r.verdict for r in rows] == [PASS] * 3
    assert {r.backend for r in rows} == {"threaded"}


def test_rank_failure_becomes_a_fail_row():
    class Broken:
        world_size, backend = 2, "gloo"

        def run(self, fn, *args, **kwargs):
            from distcheck.errors import RankFailure

            err = RankFailure(1, "Traceback...\nRuntimeError: gloo went away\n(also failed: ranks [0])")
            err.failures = {0: "Traceback...\nRuntimeError: gloo went away too", 1: "Traceback...\nRuntimeError: gloo went away"}
            raise err

    rows = ddp.ddp_rows(Broken(), 2)
    assert [r.verdict for r in rows] == [FAIL] * 3
    # the first failing rank's exception line, not only "rank 1 failed:"
    assert rows[0].detail == "RankFailure: rank 1 failed: RuntimeError: gloo went away (also failed: ranks [0])"
