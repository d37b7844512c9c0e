"""Tensor parallelism reference (distcheck.parallel.tp) and its closed forms (tp.* of distcheck.closed_form)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distcheck.core.errors import ConfigError
from distcheck.parallel import tp
from distcheck.parallel.tp import forms as tp_forms

LESSON_X = np.array([1.0, 2.0])
LESSON_W = np.array([[1.0, 0.0, 2.0, 1.0], [0.0, 1.0, 1.0, 3.0]])


def _expect_config_error(exc_info, field, value, rule_part):
    err = exc_info.value
    assert err.field == field
    assert err.value == value
    assert rule_part in err.rule
    assert str(err).startswith(f"{field}={value!r} ")


def _int_array(rng, shape, lo=-4, hi=5):
    return rng.integers(lo, hi, size=shape).astype(np.float64)


# ----------------------------------------------------------------------------- lesson example


def test_lesson_example_by_columns():
    parts = tp.column_parallel_parts(LESSON_X, LESSON_W, 2)
    assert [p.tolist() for p in parts] == [[1.0, 2.0], [4.0, 7.0]]
    assert tp.column_parallel(LESSON_X, LESSON_W, 2).tolist() == [1.0, 2.0, 4.0, 7.0]


def test_lesson_example_by_rows():
    parts = tp.row_parallel_parts(LESSON_X, LESSON_W, 2)
    assert [p.tolist() for p in parts] == [[1.0, 0.0, 2.0, 1.0], [0.0, 2.0, 2.0, 6.0]]
    log = []
    assert tp.row_parallel(LESSON_X, LESSON_W, 2, log=log).tolist() == [1.0, 2.0, 4.0, 7.0]
    assert log == [("all_reduce", (4,))]


def test_lesson_example_bias_added_once():
    b = np.array([10.0, 20.0, 30.0, 40.0])
    assert tp.row_parallel(LESSON_X, LESSON_W, 2, b=b).tolist() == [11.0, 22.0, 34.0, 47.0]
    # column-parallel shards the bias with the columns
    assert [p.tolist() for p in tp.column_parallel_parts(LESSON_X, LESSON_W, 2, b=b)] == [[11.0, 22.0], [34.0, 47.0]]
    # adding it on every rank before the reduce would give [21, 42, 64, 87]
    assert (sum(tp.row_parallel_parts(LESSON_X, LESSON_W, 2)) + 2 * b).tolist() == [21.0, 42.0, 64.0, 87.0]


# ----------------------------------------------------------------------------- splits


def test_split_sizes():
    assert tp.split_sizes(10, 4) == [3, 3, 2, 2]
    assert tp.split_sizes(7, 7) == [1] * 7
    assert tp.split_sizes(8, 1) == [8]
    assert tp.split_bounds([3, 3, 2, 2]) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    for n, s in [(10, 4), (11, 3), (5, 5), (100, 7)]:
        assert tp.split_sizes(n, s) == [len(a) for a in np.array_split(np.arange(n), s)]


@pytest.mark.parametrize(
    "n, s, field, value, rule",
    [(4, 5, "shards", 5, "must be <= n=4"), (4, 0, "shards", 0, "must be >= 1"), (0, 1, "n", 0, "must be >= 1")],
)
def test_split_sizes_rejects(n, s, field, value, rule):
    with pytest.raises(ConfigError) as e:
        tp.split_sizes(n, s)
    _expect_config_error(e, field, value, rule)


def test_shape_and_degree_errors():
    with pytest.raises(ConfigError) as e:
        tp.column_parallel(LESSON_X, LESSON_W, 5)
    _expect_config_error(e, "tp", 5, "must be <= output_cols=4")
    with pytest.raises(ConfigError) as e:
        tp.row_parallel(LESSON_X, LESSON_W, 3)
    _expect_config_error(e, "tp", 3, "must be <= input_rows=2")
    with pytest.raises(ConfigError) as e:
        tp.row_parallel(np.ones(3), LESSON_W, 1)
    _expect_config_error(e, "x.shape", (3,), "must end with d_in=2")
    with pytest.raises(ConfigError) as e:
        tp.column_parallel(LESSON_X, LESSON_W, 2, b=np.ones(3))
    _expect_config_error(e, "b.shape", (3,), "must be (4,)")
    with pytest.raises(ConfigError) as e:
        tp.megatron_mlp(LESSON_X, LESSON_W, np.ones((4, 2)), 2, act="softmax")
    _expect_config_error(e, "act", "softmax", "must be one of 'relu', 'gelu', 'tanh', 'silu'")
    with pytest.raises(ConfigError) as e:
        tp.megatron_mlp(LESSON_X, LESSON_W, np.ones((3, 2)), 2)
    _expect_config_error(e, "W_down.shape", (3, 2), "must start with ffn=4")


# ----------------------------------------------------------------------------- exactness (integers)


@settings(max_examples=25, deadline=None)
@given(
    d_in=st.integers(1, 9),
    d_out=st.integers(1, 9),
    batch=st.integers(1, 3),
    data=st.data(),
)
def test_integer_inputs_bitwise_equal_any_split(d_in, d_out, batch, data):
    """Integer-valued inputs: every partial sum is an integer < 2**53, so all splits are exact."""
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    x, W, b = _int_array(rng, (batch, d_in)), _int_array(rng, (d_in, d_out)), _int_array(rng, (d_out,))
    t_col = data.draw(st.integers(1, d_out))
    t_row = data.draw(st.integers(1, d_in))
    assert np.array_equal(tp.column_parallel(x, W, t_col, b), x @ W + b)
    assert np.array_equal(tp.row_parallel(x, W, t_row, b), x @ W + b)


@pytest.mark.parametrize("t", [1, 2, 3, 5, 7])
def test_megatron_mlp_integer_relu_exact(t):
    rng = np.random.default_rng(t)
    x = _int_array(rng, (2, 3, 4))  # (batch, seq, d)
    W_up, W_down = _int_array(rng, (4, 7)), _int_array(rng, (7, 4))
    b_up, b_down = _int_array(rng, (7,)), _int_array(rng, (4,))
    log = []
    out = tp.megatron_mlp(x, W_up, W_down, t, "relu", b_up, b_down, log=log)
    assert np.array_equal(out, tp.mlp(x, W_up, W_down, "relu", b_up, b_down))
    assert np.array_equal(out, np.maximum(x @ W_up + b_up, 0) @ W_down + b_down)
    assert log == [("all_reduce", (2, 3, 4))]  # exactly one all-reduce per forward
    # the bias of W_down must not be added per rank
    if t > 1:
        assert not np.array_equal(out, tp.megatron_mlp(x, W_up, W_down, t, "relu", b_up) + t * b_down)


# ----------------------------------------------------------------------------- float bounds


@pytest.mark.parametrize("t", [1, 2, 3, 4, 7, 50])
def test_row_parallel_within_bound(t):
    rng = np.random.default_rng(100 + t)
    x, W, b = rng.standard_normal((3, 50)), rng.standard_normal((50, 6)), rng.standard_normal(6)
    for bias in (None, b):
        full = x @ W if bias is None else x @ W + bias
        err = np.abs(tp.row_parallel(x, W, t, bias) - full)
        assert np.all(err <= tp.row_parallel_error_bound(x, W, t, bias))
    if t == 1:
        assert np.array_equal(tp.row_parallel(x, W, 1), x @ W)


def test_row_parallel_bound_value():
    # d_in = 10 over tp = 4 (sizes 3,3,2,2): k = max(10, 3 + 4 - 1) = 10
    x, W = np.ones((1, 10)), np.ones((10, 1))
    u = 2.0**-53
    expected = 2 * (10 * u / (1 - 10 * u)) * 10 / (1 - 14 * u / (1 - 14 * u))
    assert tp.row_parallel_error_bound(x, W, 4)[0, 0] == expected
    # d_in = 3 over tp = 3: k = max(3, 1 + 3 - 1) = 3; with a bias, k = 4 and |b| joins M
    bnd = tp.row_parallel_error_bound(np.ones(3), np.ones((3, 1)), 3, b=np.array([-2.0]))
    assert bnd[0] == 2 * (4 * u / (1 - 4 * u)) * 5 / (1 - 7 * u / (1 - 7 * u))


@pytest.mark.parametrize("t", [1, 2, 3, 6])
def test_column_parallel_within_bound(t):
    """Column shards are the same inner products, but BLAS may block a column slice
    differently from the full matrix: bitwise equality is NOT asserted for floats."""
    rng = np.random.default_rng(200 + t)
    x, W = rng.standard_normal((4, 40)), rng.standard_normal((40, 6))
    assert np.all(np.abs(tp.column_parallel(x, W, t) - x @ W) <= tp.column_parallel_error_bound(x, W))


@pytest.mark.parametrize("act", tp.ACTIVATIONS)
@pytest.mark.parametrize("t", [1, 3, 4])
def test_megatron_mlp_float(act, t):
    rng = np.random.default_rng(300 + t)
    x = rng.standard_normal((5, 8))
    W_up, W_down = rng.standard_normal((8, 10)), rng.standard_normal((10, 8))
    b_up, b_down = rng.standard_normal(10), rng.standard_normal(8)
    out = tp.megatron_mlp(x, W_up, W_down, t, act, b_up, b_down)
    h = tp.activation(act, tp.column_parallel(x, W_up, t, b_up))
    # the same operations in the same order: bitwise
    assert np.array_equal(out, tp.row_parallel(h, W_down, t, b_down))
    # the reduce step against the single-device product of the same hidden activation
    assert np.all(np.abs(out - (h @ W_down + b_down)) <= tp.row_parallel_error_bound(h, W_down, t, b_down))


def test_activation_values():
    z = np.array([-2.0, 0.0, 1.0])
    assert tp.activation("relu", z).tolist() == [0.0, 0.0, 1.0]
    assert tp.activation("tanh", z).tolist() == [math.tanh(-2.0), 0.0, math.tanh(1.0)]
    # gelu(1) = Phi(1) (standard normal CDF); silu(1) = sigmoid(1)
    assert tp.activation("gelu", z)[1:].tolist() == [0.0, 0.5 * (1 + math.erf(1 / math.sqrt(2)))]
    assert tp.activation("silu", z)[1:].tolist() == [0.0, 1 / (1 + math.exp(-1.0))]
    assert abs(tp.activation("gelu", np.array([1.0]))[0] - 0.8413447460685429) <= 2 * 2.0**-53


# ----------------------------------------------------------------------------- elementwise vs layer norm


def test_relu_is_local_layer_norm_is_not():
    h = np.array([[-1.0, 2.0, -3.0, 4.0]])
    shards = np.array_split(h, 2, axis=-1)
    local_relu = np.concatenate([np.maximum(s, 0) for s in shards], axis=-1)
    assert local_relu.tolist() == np.maximum(h, 0).tolist() == [[0.0, 2.0, 0.0, 4.0]]

    g = np.array([[1.0, 2.0, 3.0, 4.0]])
    local_ln = np.concatenate([tp.layer_norm(s) for s in np.array_split(g, 2, axis=-1)], axis=-1)
    # each half [1, 2] and [3, 4] normalises to [-1, 1] on its own ...
    assert local_ln.tolist() == [[-1.0, 1.0, -1.0, 1.0]]
    # ... but the full vector has mean 2.5 and variance 1.25
    full_ln = tp.layer_norm(g)
    assert full_ln.tolist() == ((g - 2.5) / np.sqrt(1.25)).tolist()
    assert abs(full_ln[0, 0] - local_ln[0, 0]) > 0.3


# ----------------------------------------------------------------------------- SwiGLU and fused gate/up


def test_shard_fused_gate_up_layout():
    # columns 0..2 are gate units g0..g2, columns 3..5 are up units u0..u2
    W_fused = np.tile(np.arange(6.0), (2, 1))
    shards = tp.shard_fused_gate_up(W_fused, 2)
    assert [s[0].tolist() for s in shards] == [[0.0, 1.0, 3.0, 4.0], [2.0, 5.0]]
    # the naive split pairs gate with gate and up with up
    naive = np.array_split(W_fused, 2, axis=1)
    assert [s[0].tolist() for s in naive] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert [s[0].tolist() for s in tp.shard_fused_gate_up(W_fused, 3)] == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]


def test_shard_fused_gate_up_errors():
    with pytest.raises(ConfigError) as e:
        tp.shard_fused_gate_up(np.ones((2, 5)), 2)
    _expect_config_error(e, "W_fused.shape", (2, 5), "layout [gate | up]")
    with pytest.raises(ConfigError) as e:
        tp.shard_fused_gate_up(np.ones((2, 6)), 4)
    _expect_config_error(e, "tp", 4, "must be <= ffn=3")


@pytest.mark.parametrize("t", [1, 2, 3, 5])
def test_tp_swiglu_and_fused(t):
    """Integer x and weights make every pre-activation exact, so the hidden activations of
    all paths are bitwise equal and only the reduce order differs (row-parallel bound)."""
    rng = np.random.default_rng(400 + t)
    x = _int_array(rng, (3, 6), -2, 3)
    W_gate, W_up, W_down = (_int_array(rng, s, -2, 3) for s in ((6, 5), (6, 5), (5, 6)))
    h = tp.silu(x @ W_gate) * (x @ W_up)
    full = tp.swiglu_mlp(x, W_gate, W_up, W_down)
    assert np.array_equal(full, h @ W_down)
    bound = tp.row_parallel_error_bound(h, W_down, t)
    log = []
    split = tp.tp_swiglu_mlp(x, W_gate, W_up, W_down, t, log=log)
    assert np.array_equal(split, tp.row_parallel(h, W_down, t))
    assert np.all(np.abs(split - full) <= bound)
    assert len(log) == 1
    fused = tp.tp_swiglu_mlp_fused(x, np.concatenate([W_gate, W_up], axis=1), W_down, t)
    assert np.array_equal(fused, split)


def test_naive_fused_split_is_wrong():
    rng = np.random.default_rng(500)
    x = rng.standard_normal((3, 6))
    W_gate, W_up, W_down = rng.standard_normal((6, 4)), rng.standard_normal((6, 4)), rng.standard_normal((4, 6))
    W_fused = np.concatenate([W_gate, W_up], axis=1)
    full = tp.swiglu_mlp(x, W_gate, W_up, W_down)
    # naive: rank r takes np.array_split(W_fused, 2, axis=1)[r] (4 columns) and halves it,
    # so rank 0 pairs gate g0,g1 with gate g2,g3 and rank 1 pairs up u0,u1 with up u2,u3
    naive = 0
    for r, S in enumerate(np.array_split(W_fused, 2, axis=1)):
        gu = x @ S
        naive = naive + (tp.silu(gu[:, :2]) * gu[:, 2:]) @ W_down[2 * r : 2 * r + 2]
    h = tp.silu(x @ W_gate) * (x @ W_up)
    assert np.max(np.abs(naive - full)) > 1e6 * np.max(tp.row_parallel_error_bound(h, W_down, 2))
    right = tp.tp_swiglu_mlp_fused(x, W_fused, W_down, 2)
    assert np.max(np.abs(right - full)) < np.max(np.abs(naive - full))


# ----------------------------------------------------------------------------- closed forms


def test_form_output_cols_per_shard():
    f = tp_forms.OUTPUT_COLS_PER_SHARD
    assert f.name == "tp.column.output_cols_per_shard"
    assert [f.evaluate(output_cols=10, tp=4, rank=r) for r in range(4)] == [3, 3, 2, 2]
    assert f.evaluate(output_cols=28672, tp=8) == 3584  # 70B-style MLP width, divisible case
    for n, t in [(10, 4), (11, 3), (7, 7), (100, 7), (28672, 8)]:
        assert [f.evaluate(output_cols=n, tp=t, rank=r) for r in range(t)] == tp.split_sizes(n, t)


def test_form_allreduce_counts_match_reference_log():
    assert tp_forms.MLP_ALLREDUCE_PER_FORWARD.name == "tp.mlp.allreduce_per_forward"
    assert tp_forms.ATTENTION_ALLREDUCE_PER_FORWARD.name == "tp.attention.allreduce_per_forward"
    assert tp_forms.ROW_ALLREDUCE_COUNT.name == "tp.row.allreduce_count"
    for f in (tp_forms.MLP_ALLREDUCE_PER_FORWARD, tp_forms.ATTENTION_ALLREDUCE_PER_FORWARD,
              tp_forms.ROW_ALLREDUCE_COUNT):
        assert f.evaluate() == 1 and f.source
    log = []
    tp.megatron_mlp(np.ones((2, 4)), np.ones((4, 8)), np.ones((8, 4)), 4, log=log)
    assert len(log) == tp_forms.MLP_ALLREDUCE_PER_FORWARD.evaluate()


def test_form_comm_per_layer():
    el, by = tp_forms.COMM_ELEMENTS_PER_LAYER, tp_forms.COMM_BYTES_PER_LAYER
    assert el.name == "tp.comm_elements_per_layer" and by.name == "tp.comm_bytes_per_layer"
    # 8 b s h (t-1)/t: b=1, s=2048, h=8192, t=8 -> 8 * 2048 * 8192 * 7/8
    assert el.evaluate(s=2048, b=1, h=8192, t=8) == 117_440_512
    assert by.evaluate(s=2048, b=1, h=8192, t=8) == 234_881_024  # 2 bytes per element (default)
    assert by.evaluate(s=2048, b=1, h=8192, t=8, bytes_per_element=4) == 469_762_048
    assert el.evaluate(s=2048, b=1, h=8192, t=1) == 0  # no tensor parallelism, no traffic
    assert el.evaluate(s=1, b=1, h=3, t=2) == 12
    assert el.unit == "elements" and by.unit == "bytes"
    with pytest.raises(ConfigError) as e:
        el.evaluate(s=1, b=1, h=3)
    _expect_config_error(e, "t", None, "is required by tp.comm_elements_per_layer")


def test_layer_norm_of_a_constant_row_needs_eps_and_junk_is_refused():
    with pytest.raises(ConfigError, match=r"eps=0\.0 must be > 0 when a row of h is constant"):
        tp.layer_norm(np.array([[2.0, 2.0], [1.0, 3.0]]))
    assert np.array_equal(tp.layer_norm(np.array([[2.0, 2.0]]), eps=1.0), np.zeros((1, 2)))
    with pytest.raises(ConfigError, match="eps=nan must be a finite number >= 0"):
        tp.layer_norm(np.ones((1, 2)), eps=float("nan"))
    with pytest.raises(ConfigError, match="log=.* must be a list"):
        tp.row_parallel(LESSON_X, LESSON_W, 2, log=())
    with pytest.raises(ConfigError, match="must be finite"):
        tp.column_parallel(np.array([[np.inf, 1.0]]), LESSON_W, 2)
    with pytest.raises(ConfigError, match=r"W_up\.shape"):
        tp.swiglu_mlp(LESSON_X, LESSON_W, np.ones((2, 3)), np.ones((4, 2)))
