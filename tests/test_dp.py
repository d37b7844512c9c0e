"""Data parallelism reference (distcheck.parallel.dp) and its closed forms (dp.* of distcheck.closed_form)."""

from __future__ import annotations

from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest

from distcheck.core.errors import ConfigError
from distcheck.parallel import dp
from distcheck.parallel.dp import forms as dp_forms


def _frac(a):
    return np.vectorize(Fraction, otypes=[object])(np.asarray(a))


def _dec(a):
    return np.vectorize(lambda v: Decimal(float(v)), otypes=[object])(np.asarray(a))


def _int_problem(n, d, seed, k=None):
    rng = np.random.default_rng(seed)
    X = rng.integers(-5, 6, size=(n, d))
    w = rng.integers(-3, 4, size=(d,) if k is None else (d, k))
    y = rng.integers(-9, 10, size=(n,) if k is None else (n, k))
    return X, w, y


def _float_problem(n, d, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)), rng.standard_normal(d), rng.standard_normal(n)


def _expect_config_error(exc_info, field, value, rule_part):
    err = exc_info.value
    assert err.field == field
    assert err.value == value
    assert rule_part in err.rule
    assert str(err).startswith(f"{field}={value!r} ")


# ----------------------------------------------------------------------------- shards


def test_shard_sizes_lesson_numbers():
    assert dp.shard_sizes(60, 8).tolist() == [8, 8, 8, 8, 7, 7, 7, 7]
    assert dp.shard_sizes(64, 8).tolist() == [8] * 8
    assert dp.shard_sizes(5, 5).tolist() == [1] * 5
    for n, k in [(60, 8), (17, 5), (3, 1), (100, 7)]:
        assert dp.shard_sizes(n, k).tolist() == [len(a) for a in np.array_split(np.arange(n), k)]


@pytest.mark.parametrize(
    "n, k, field, value, rule",
    [
        (7, 8, "dp", 8, "must be <= n=7"),
        (7, 0, "dp", 0, "must be >= 1"),
        (7, True, "dp", True, "must be an integer"),
        (0, 1, "n", 0, "must be >= 1"),
        (7.0, 2, "n", 7.0, "must be an integer"),
    ],
)
def test_shard_sizes_rejects(n, k, field, value, rule):
    with pytest.raises(ConfigError) as e:
        dp.shard_sizes(n, k)
    _expect_config_error(e, field, value, rule)


# ----------------------------------------------------------------------------- MSE model


def test_mse_hand_values():
    X = _frac([[1, 0], [0, 1], [1, 1]])
    w = _frac([1, 1])
    y = _frac([1, 0, 3])
    # residual r = Xw - y = [0, 1, -1]; loss = (0 + 1 + 1)/3; grad = 2 X^T r / 3 = 2 [-1, 0] / 3
    assert dp.mse_loss(w, X, y) == Fraction(2, 3)
    assert dp.mse_grad(w, X, y).tolist() == [Fraction(-2, 3), Fraction(0)]
    assert dp.mse_grad_sum(w, X, y).tolist() == [Fraction(-2), Fraction(0)]


def test_mse_shape_errors():
    with pytest.raises(ConfigError) as e:
        dp.mse_grad(np.zeros(3), np.zeros((4, 2)), np.zeros(4))
    _expect_config_error(e, "w.shape", (3,), "must start with d=2")
    with pytest.raises(ConfigError) as e:
        dp.mse_grad(np.zeros(2), np.zeros((4, 2)), np.zeros(5))
    _expect_config_error(e, "y.shape", (5,), "must start with n=4")


# ----------------------------------------------------------------------------- DP identity


def test_equal_shards_exact_in_rationals():
    X, w, y = _int_problem(64, 4, seed=1, k=2)
    X, w, y = _frac(X), _frac(w), _frac(y)
    full = dp.mse_grad(w, X, y)
    assert np.array_equal(dp.data_parallel_grad(dp.mse_grad, w, X, y, 8), full)
    assert np.array_equal(dp.data_parallel_grad(dp.mse_grad, w, X, y, 8, "examples"), full)


def test_unequal_shards_exact_in_rationals():
    """60 examples on 8 ranks: plain mean - full == plain_mean_bias exactly; weighted == full."""
    X, w, y = _int_problem(60, 3, seed=2)
    X, w, y = _frac(X), _frac(w), _frac(y)
    full = dp.mse_grad(w, X, y)
    plain = dp.data_parallel_grad(dp.mse_grad, w, X, y, 8)
    sizes = dp.shard_sizes(60, 8)
    sums = [dp.mse_grad_sum(w, a, b) for a, b in zip(dp.split_batch(X, sizes), dp.split_batch(y, sizes), strict=True)]
    bias = dp.plain_mean_bias(sums, sizes)
    assert np.any(bias != 0)
    assert np.array_equal(plain - full, bias)
    assert np.array_equal(dp.data_parallel_grad(dp.mse_grad, w, X, y, 8, "examples"), full)


def test_plain_mean_bias_hand_value():
    # two shards of sizes 2 and 1 with gradient sums 6 and 6:
    # plain = (6/2 + 6/1)/2 = 4.5, full = 12/3 = 4, bias = (1/4 - 1/3)*6 + (1/2 - 1/3)*6 = 1/2
    G = [np.array([Fraction(6)], dtype=object), np.array([Fraction(6)], dtype=object)]
    assert dp.plain_mean_bias(G, [2, 1]).tolist() == [Fraction(1, 2)]
    assert dp.plain_mean_bias(G, [3, 3]).tolist() == [Fraction(0)]
    # float gradient sums: coefficients rounded once, 1/2 is exact
    assert dp.plain_mean_bias([np.array([6.0]), np.array([6.0])], [2, 1]).tolist() == [0.5]


def test_lesson_64_on_8_is_at_rounding_level():
    X, w, y = _float_problem(64, 5, seed=3)
    full = dp.mse_grad(w, X, y)
    plain = dp.data_parallel_grad(dp.mse_grad, w, X, y, 8)
    bound = dp.mse_dp_error_bound(w, X, y, 8)
    assert np.all(np.abs(plain - full) <= bound)
    assert bound.max() < 1e-10 * np.abs(full).max()  # rounding level, not a modelling error


def test_lesson_60_on_8_plain_is_off_weighted_fixes_it():
    X, w, y = _float_problem(60, 5, seed=4)
    full = dp.mse_grad(w, X, y)
    sizes = dp.shard_sizes(60, 8)
    plain = dp.data_parallel_grad(dp.mse_grad, w, X, y, 8)
    weighted = dp.data_parallel_grad(dp.mse_grad, w, X, y, 8, weighting="examples")
    sums = [dp.mse_grad_sum(w, a, b) for a, b in zip(dp.split_batch(X, sizes), dp.split_batch(y, sizes), strict=True)]
    bias = dp.plain_mean_bias(sums, sizes)
    bound = dp.mse_dp_error_bound(w, X, y, 8)
    # the plain-mean error is a real modelling error, far above rounding ...
    assert np.max(np.abs(plain - full)) > 1e6 * bound.max()
    # ... and it is exactly the closed-form bias, up to the derived rounding bound
    assert np.all(np.abs((plain - full) - bias) <= bound)
    assert np.all(np.abs(weighted - full) <= dp.mse_dp_error_bound(w, X, y, 8, "examples"))


def test_grad_trees_dicts_match_arrays_leafwise():
    rng = np.random.default_rng(5)
    g = [{"a": rng.standard_normal(3), "b": rng.standard_normal((2, 2))} for _ in range(3)]
    pm = dp.plain_mean(g)
    wm = dp.weighted_mean(g, [3, 2, 2])
    for key in ("a", "b"):
        leaves = [t[key] for t in g]
        assert np.array_equal(pm[key], dp.plain_mean(leaves))
        assert np.array_equal(wm[key], dp.weighted_mean(leaves, [3, 2, 2]))
    with pytest.raises(ConfigError) as e:
        dp.plain_mean([{"a": 1}, {"b": 1}])
    assert e.value.field == "grads" and "same keys" in e.value.rule


def test_weighted_mean_rejects_bad_sizes():
    with pytest.raises(ConfigError) as e:
        dp.weighted_mean([np.ones(2)] * 2, [1])
    _expect_config_error(e, "sizes", [1], "one positive entry per gradient (2)")
    with pytest.raises(ConfigError) as e:
        dp.weighted_mean([np.ones(2)] * 2, [1, 0])
    _expect_config_error(e, "sizes[1]", 0, "must be >= 1")


def test_data_parallel_grad_rejects_bad_weighting():
    X, w, y = _float_problem(8, 2, seed=6)
    with pytest.raises(ConfigError) as e:
        dp.data_parallel_grad(dp.mse_grad, w, X, y, 2, weighting="tokens")
    _expect_config_error(e, "weighting", "tokens", "must be one of 'plain', 'examples'")


# ----------------------------------------------------------------------------- MLP


def _mlp_decimal(seed, n=5, d_in=3, h=4, d_out=2):
    rng = np.random.default_rng(seed)
    params = {k: _dec(v) for k, v in dp.mlp_init(rng, d_in, h, d_out).items()}
    return params, _dec(rng.standard_normal((n, d_in))), _dec(rng.standard_normal((n, d_out)))


def test_mlp_grad_matches_finite_differences():
    """Central differences in 50-digit decimal arithmetic against the hand backprop.

    Error budget: truncation <= h^2/6 * |L'''| ~ 1e-30 * O(10) with h = 1e-15, rounding
    ~ (50-digit ulp ~ 1e-50)/h = 1e-35, backprop rounding ~ 1e-48: the two agree to
    < 1e-28; we require 1e-24 (four orders of margin). A wrong backprop (a missing
    tanh' factor or factor 2) is off by O(0.1), which the last assert shows.
    """
    with localcontext() as ctx:
        ctx.prec = 50
        params, X, y = _mlp_decimal(seed=7)
        loss, grads = dp.mlp_loss_and_grad(params, X, y)
        h = Decimal("1e-15")
        worst = Decimal(0)
        for name in dp.MLP_PARAM_NAMES:
            p = params[name]
            for idx in np.ndindex(p.shape):
                plus = {k: v.copy() for k, v in params.items()}
                minus = {k: v.copy() for k, v in params.items()}
                plus[name][idx] += h
                minus[name][idx] -= h
                fd = (dp.mlp_loss_and_grad(plus, X, y)[0] - dp.mlp_loss_and_grad(minus, X, y)[0]) / (2 * h)
                worst = max(worst, abs(fd - grads[name][idx]))
        assert worst < Decimal("1e-24")
        assert max(abs(v) for g in grads.values() for v in g.ravel()) > Decimal("1e-3")


def test_mlp_sum_reduction_is_n_times_mean():
    with localcontext() as ctx:
        ctx.prec = 50
        params, X, y = _mlp_decimal(seed=8, n=4)
        l_mean, g_mean = dp.mlp_loss_and_grad(params, X, y)
        l_sum, g_sum = dp.mlp_loss_and_grad(params, X, y, reduction="sum")
        assert abs(l_sum - 4 * l_mean) < Decimal("1e-45")
        for k in g_mean:
            assert np.all(np.abs(g_sum[k] - 4 * g_mean[k]) < Decimal("1e-45"))


def test_mlp_data_parallel_weighted_is_full_plain_is_not():
    """dict-valued grads through data_parallel_grad, 10 examples on 4 ranks (3,3,2,2).

    50-digit arithmetic: rounding discrepancies are < 1e-45 for these O(1) values,
    so 1e-40 is a safe bound; the plain mean misses by > 1e-3.
    """
    with localcontext() as ctx:
        ctx.prec = 50
        params, X, y = _mlp_decimal(seed=9, n=10)
        full = dp.mlp_grad(params, X, y)
        weighted = dp.data_parallel_grad(dp.mlp_grad, params, X, y, 4, weighting="examples")
        plain = dp.data_parallel_grad(dp.mlp_grad, params, X, y, 4)
        for k in full:
            assert np.all(np.abs(weighted[k] - full[k]) < Decimal("1e-40"))
        assert max(np.max(np.abs(plain[k] - full[k])) for k in full) > Decimal("1e-3")


def test_mlp_float_path_and_errors():
    rng = np.random.default_rng(10)
    params = dp.mlp_init(rng, 3, 4, 2)
    assert {k: v.shape for k, v in params.items()} == {"W1": (3, 4), "b1": (4,), "W2": (4, 2), "b2": (2,)}
    loss, grads = dp.mlp_loss_and_grad(params, rng.standard_normal((5, 3)), rng.standard_normal((5, 2)))
    assert np.isfinite(loss) and grads["W1"].dtype == np.float64
    with pytest.raises(ConfigError) as e:
        dp.mlp_loss_and_grad(params, np.zeros((5, 4)), np.zeros((5, 2)))
    _expect_config_error(e, "X.shape", (5, 4), "must be (n, 3)")
    with pytest.raises(ConfigError) as e:
        dp.mlp_loss_and_grad(params, np.zeros((5, 3)), np.zeros((5, 2)), reduction="max")
    _expect_config_error(e, "reduction", "max", "must be one of 'mean', 'sum'")
    with pytest.raises(ConfigError) as e:
        dp.mlp_init(rng, 3, 0, 2)
    _expect_config_error(e, "d_hidden", 0, "must be >= 1")


# ----------------------------------------------------------------------------- accumulation


def _token_problem():
    rng = np.random.default_rng(11)
    X = _frac(rng.integers(-4, 5, size=(6, 4, 3)))
    w = _frac(rng.integers(-2, 3, size=3))
    y = _frac(rng.integers(-6, 7, size=(6, 4)))
    lengths = [4, 1, 3, 4, 2, 1]  # valid tokens per sequence (padding after)
    mask = np.array([[1] * L + [0] * (4 - L) for L in lengths])
    return X, w, y, mask


def test_accumulation_tiny_hand_example():
    # d = 1, w = 0: per-token gradient 2 x (x w - y) = -2 x y.
    X = np.array([[[1], [1]], [[1], [1]]], dtype=object) * Fraction(1)
    y = np.array([[1, 1], [4, 9]], dtype=object) * Fraction(1)
    mask = np.array([[1, 1], [1, 0]])
    w = np.array([Fraction(0)], dtype=object)
    # G_0 = -2 - 2 = -4 over 2 tokens, G_1 = -8 over 1 token (the 9 is padding)
    tok = dp.accumulate_grads(dp.token_mse_grad_sum, w, X, y, [1, 1], normalize="tokens", mask=mask)
    assert tok.grad.tolist() == [Fraction(-4)] and tok.counts == (2, 1)  # (-4 - 8)/3
    bad = dp.accumulate_grads(dp.token_mse_grad_sum, w, X, y, [1, 1], normalize="per_microbatch_mean", mask=mask)
    assert bad.grad.tolist() == [Fraction(-5)]  # (-4/2 + -8/1)/2
    assert dp.token_mse_grad(w, X, y, mask).tolist() == [Fraction(-4)]


@pytest.mark.parametrize("split", [[6], [1, 5], [2, 2, 2], [3, 1, 2], [1] * 6])
def test_token_accumulation_invariant_under_resplitting(split):
    X, w, y, mask = _token_problem()
    full = dp.token_mse_grad(w, X, y, mask)
    got = dp.accumulate_grads(dp.token_mse_grad_sum, w, X, y, split, normalize="tokens", mask=mask)
    assert np.array_equal(got.grad, full)
    assert sum(got.counts) == int(mask.sum())


def test_per_microbatch_mean_depends_on_the_split():
    X, w, y, mask = _token_problem()
    full = dp.token_mse_grad(w, X, y, mask)
    results = [
        dp.accumulate_grads(dp.token_mse_grad_sum, w, X, y, s, normalize="per_microbatch_mean", mask=mask).grad
        for s in ([6], [2, 2, 2], [3, 1, 2])
    ]
    assert np.array_equal(results[0], full)  # one micro-batch: trivially right
    assert not np.array_equal(results[1], full)
    assert not np.array_equal(results[2], full)
    assert not np.array_equal(results[1], results[2])


def test_per_microbatch_mean_right_when_counts_equal():
    X, w, y, _ = _token_problem()
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    # micro-batches of 2 sequences hold 6 tokens each: the mean of means is then exact
    good = dp.accumulate_grads(dp.token_mse_grad_sum, w, X, y, [2, 2, 2], normalize="per_microbatch_mean", mask=mask)
    assert good.counts == (6, 6, 6)
    assert np.array_equal(good.grad, dp.token_mse_grad(w, X, y, mask))


@pytest.mark.parametrize("split", [[8], [3, 5], [1, 2, 2, 3]])
def test_example_accumulation_invariant(split):
    X, w, y = _int_problem(8, 3, seed=12, k=2)
    X, w, y = _frac(X), _frac(w), _frac(y)
    got = dp.accumulate_grads(dp.mse_grad_sum, w, X, y, split, normalize="examples")
    assert np.array_equal(got.grad, dp.mse_grad(w, X, y))
    bad = dp.accumulate_grads(dp.mse_grad_sum, w, X, y, split, normalize="per_microbatch_mean")
    equal_sizes = len(set(split)) == 1
    assert np.array_equal(bad.grad, dp.mse_grad(w, X, y)) == equal_sizes


def test_mlp_accumulation_dicts():
    with localcontext() as ctx:
        ctx.prec = 50
        params, X, y = _mlp_decimal(seed=13, n=6)
        full = dp.mlp_grad(params, X, y)
        got = dp.accumulate_grads(dp.mlp_grad_sum, params, X, y, [1, 2, 3], normalize="examples").grad
        for k in full:
            assert np.all(np.abs(got[k] - full[k]) < Decimal("1e-40"))


def test_accumulation_errors():
    X, w, y, mask = _token_problem()
    with pytest.raises(ConfigError) as e:
        dp.accumulate_grads(dp.token_mse_grad_sum, w, X, y, [3, 3], normalize="tokens")
    _expect_config_error(e, "mask", None, "is required when normalize='tokens'")
    with pytest.raises(ConfigError) as e:
        dp.accumulate_grads(dp.token_mse_grad_sum, w, X, y, [3, 2], normalize="tokens", mask=mask)
    _expect_config_error(e, "sizes", [3, 2], "must sum to the batch size 6")
    with pytest.raises(ConfigError) as e:
        dp.accumulate_grads(dp.token_mse_grad_sum, w, X, y, [3, 3], normalize="mean", mask=mask)
    _expect_config_error(e, "normalize", "mean", "must be one of 'examples', 'tokens', 'per_microbatch_mean'")
    with pytest.raises(ConfigError) as e:
        dp.accumulate_grads(dp.token_mse_grad_sum, w, X, y, [6, 0], normalize="tokens", mask=mask)
    _expect_config_error(e, "microbatch_sizes[1]", 0, "must be >= 1")
    zero = mask.copy()
    zero[1] = 0
    with pytest.raises(ConfigError) as e:
        dp.accumulate_grads(dp.token_mse_grad_sum, w, X, y, [1, 1, 4], normalize="per_microbatch_mean", mask=zero)
    _expect_config_error(e, "mask[micro-batch 1]", "all zeros", "must have a valid token")
    with pytest.raises(ConfigError) as e:
        dp.token_mse_grad_sum(w, X, y, mask * 2)
    assert e.value.field == "mask" and "only 0 and 1" in e.value.rule


# ----------------------------------------------------------------------------- closed forms


def test_forms_weights():
    plain, exact = dp_forms.PLAIN_MEAN_WEIGHT, dp_forms.EXACT_WEIGHT
    assert plain.name == "dp.plain_mean_weight" and exact.name == "dp.exact_weight"
    assert plain.evaluate(dp=8, n_k=7) == Fraction(1, 56)
    assert plain.evaluate(dp=8, n_k=8) == Fraction(1, 64)
    assert exact.evaluate(n=60) == Fraction(1, 60)
    # equal shards: the two weights agree; 60 on 8: a 7-shard example is over-weighted by 60/56
    assert plain.evaluate(dp=8, n_k=8) == exact.evaluate(n=64)
    assert plain.evaluate(dp=8, n_k=7) / exact.evaluate(n=60) == Fraction(15, 14)
    assert plain.source and exact.source and plain.unit == "fraction"
    with pytest.raises(ConfigError) as e:
        plain.evaluate(dp=0, n_k=1)
    _expect_config_error(e, "dp", 0, "must be an integer >= 1")


def test_gamma():
    assert dp.gamma(0) == 0.0
    assert dp.gamma(1) == 2.0**-53 / (1 - 2.0**-53)
    # one definition: the exact Fraction of distcheck.core.exactness rounded once, bitwise the
    # float expression k*u/(1 - k*u); tp's reference uses the same function (its one public path is dp's)
    from distcheck.core import exactness
    from distcheck.parallel.tp import reference as tp

    assert tp.gamma is dp.gamma and tp.UNIT_ROUNDOFF == dp.UNIT_ROUNDOFF == 2.0**-53
    for k in (2, 3, 7, 1000, 123_456_789, 2**40 + 1, 2**52 - 1):
        assert dp.gamma(k) == float(exactness.gamma(k)) == k * 2.0**-53 / (1 - k * 2.0**-53)
    with pytest.raises(ConfigError) as e:
        dp.gamma(-1)
    _expect_config_error(e, "k", -1, "must be an integer >= 0")
