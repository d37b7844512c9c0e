"""Attention with GQA, tensor-parallel by heads (distcheck.parallel.tp), and its closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest

from distcheck.core.errors import ConfigError
from distcheck.parallel import tp as A
from distcheck.parallel.dp import gamma
from distcheck.parallel.tp import forms as attn_forms
from distcheck.parallel.tp import forms as tp_forms
from distcheck.parallel.tp import row_parallel_error_bound


def _expect_config_error(exc_info, field, value, rule_part):
    err = exc_info.value
    assert err.field == field
    assert err.value == value
    assert rule_part in err.rule
    assert str(err) == f"{field}={value!r} {err.rule}"


def _weights(rng, d, num_heads, num_kv_heads, head_dim, d_out=None):
    d_out = d if d_out is None else d_out
    return (
        rng.standard_normal((d, num_heads * head_dim)),
        rng.standard_normal((d, num_kv_heads * head_dim)),
        rng.standard_normal((d, num_kv_heads * head_dim)),
        rng.standard_normal((num_heads * head_dim, d_out)),
    )


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "tp, heads, kv, field, value, rule",
    [
        (3, 24, 8, "tp", 3, "must divide num_kv_heads=8"),
        (3, 8, 8, "tp", 3, "must divide num_heads=8"),
        (16, 128, 8, "tp", 16, "must divide num_kv_heads=8"),
        (2, 8, 3, "num_kv_heads", 3, "must divide num_heads=8"),
        (0, 8, 8, "tp", 0, "must be >= 1"),
        (2, 0, 1, "num_heads", 0, "must be >= 1"),
        (2, 8, 2.0, "num_kv_heads", 2.0, "must be an integer"),
    ],
)
def test_validate_tp_heads_rejects(tp, heads, kv, field, value, rule):
    with pytest.raises(ConfigError) as e:
        A.validate_tp_heads(tp, heads, kv)
    _expect_config_error(e, field, value, rule)


def test_validate_tp_heads_message_format():
    with pytest.raises(ConfigError, match=r"^tp=3 must divide num_kv_heads=8$"):
        A.validate_tp_heads(3, 24, 8)
    A.validate_tp_heads(8, 128, 8)  # Llama 3 405B: 128 heads, 8 KV heads, TP 8


def test_tp_attention_rejects_bad_tp():
    rng = np.random.default_rng(0)
    Wq, Wk, Wv, Wo = _weights(rng, 6, 6, 2, 2)
    with pytest.raises(ConfigError) as e:
        A.tp_attention(rng.standard_normal((3, 6)), Wq, Wk, Wv, Wo, 6, 2, 3)
    _expect_config_error(e, "tp", 3, "must divide num_kv_heads=2")


def test_shape_errors():
    rng = np.random.default_rng(1)
    Wq, Wk, Wv, Wo = _weights(rng, 4, 4, 2, 2)
    x = rng.standard_normal((3, 4))
    with pytest.raises(ConfigError) as e:
        A.attention(x, Wq, Wk[:, :2], Wv, Wo, 4, 2)
    _expect_config_error(e, "Wk.shape", (4, 2), "must be (d, num_kv_heads * head_dim) = (4, 4)")
    with pytest.raises(ConfigError) as e:
        A.attention(x, Wq[:, :7], Wk, Wv, Wo, 4, 2)
    _expect_config_error(e, "Wq.shape", (4, 7), "num_heads=4")
    with pytest.raises(ConfigError) as e:
        A.attention(x, Wq, Wk, Wv, Wo[:6], 4, 2)
    _expect_config_error(e, "Wo.shape", (6, 4), "must start with num_heads * head_dim = 8")
    with pytest.raises(ConfigError) as e:
        A.attention(rng.standard_normal((3, 5)), Wq, Wk, Wv, Wo, 4, 2)
    _expect_config_error(e, "x.shape", (3, 5), "must be (seq, 4) or (batch, seq, 4)")


# ----------------------------------------------------------------------------- hand values


def test_uniform_attention_hand_values():
    """Wq = 0 makes every score 0, so attention averages v over the visible keys (exact here)."""
    x = np.array([[1.0], [3.0], [5.0], [7.0]])
    Wq, Wk, Wv, Wo = np.zeros((1, 1)), np.ones((1, 1)), np.ones((1, 1)), np.ones((1, 1))
    assert A.attention(x, Wq, Wk, Wv, Wo, 1, 1, causal=False).ravel().tolist() == [4.0] * 4
    assert A.attention(x[:2], Wq, Wk, Wv, Wo, 1, 1, causal=True).ravel().tolist() == [1.0, 2.0]


def test_softmax_hand_value():
    """q = k = v = x, seq 2: causal row 1 is (1 + 2 e^2)/(1 + e^2), non-causal row 0 is (1 + 2 e)/(1 + e).

    Both sides are a handful of roundings of positive quantities (exp counted
    twice: libm exp is within 1 ulp); gamma_16 bounds the relative difference.
    """
    x = np.array([[1.0], [2.0]])
    one = np.ones((1, 1))
    causal = A.attention(x, one, one, one, one, 1, 1, causal=True).ravel()
    full = A.attention(x, one, one, one, one, 1, 1, causal=False).ravel()
    e = math.e
    expect_c1 = (1 + 2 * e**2) / (1 + e**2)
    expect_f0 = (1 + 2 * e) / (1 + e)
    assert causal[0] == 1.0  # the first position sees only itself
    assert abs(causal[1] - expect_c1) <= gamma(16) * expect_c1
    assert abs(full[0] - expect_f0) <= gamma(16) * expect_f0
    assert causal[1] == full[1]  # the last row sees every key: masking changes nothing there


def test_gqa_head_to_kv_mapping():
    """4 query heads, 2 KV heads: heads 0,1 read KV head 0 and heads 2,3 read KV head 1."""
    x = np.array([[1.0, 10.0], [3.0, 30.0]])
    Wq = np.zeros((2, 4))  # head_dim 1, all scores 0
    Wk = np.ones((2, 2))
    Wv = np.eye(2)  # KV head 0 carries x[:, 0], KV head 1 carries x[:, 1]
    heads = A.attention_heads(x, Wq, Wk, Wv, 4, 2, causal=True)
    assert heads.tolist() == [[1.0, 1.0, 10.0, 10.0], [2.0, 2.0, 20.0, 20.0]]
    # a modulo mapping (h % num_kv_heads) would give [1, 10, 1, 10] in row 0


def test_tp_head_ranges():
    assert A.tp_head_ranges(2, 8, 4) == [(range(0, 4), range(0, 2)), (range(4, 8), range(2, 4))]
    assert A.tp_head_ranges(4, 8, 4) == [(range(2 * r, 2 * r + 2), range(r, r + 1)) for r in range(4)]


# ----------------------------------------------------------------------------- tensor parallel


@pytest.mark.parametrize(
    "heads, kv, tp, batched",
    [(8, 4, 1, False), (8, 4, 2, False), (8, 4, 4, True), (4, 4, 2, True), (4, 4, 4, False), (6, 1, 1, True),
     (6, 2, 2, True)],
)
def test_tp_attention_matches_full(heads, kv, tp, batched):
    rng = np.random.default_rng(heads * 100 + kv * 10 + tp)
    d, hd, seq = 8, 3, 5
    Wq, Wk, Wv, Wo = _weights(rng, d, heads, kv, hd, d_out=7)
    x = rng.standard_normal((2, seq, d) if batched else (seq, d))
    for causal in (True, False):
        heads_full = A.attention_heads(x, Wq, Wk, Wv, heads, kv, causal)
        full = A.attention(x, Wq, Wk, Wv, Wo, heads, kv, causal)
        assert np.array_equal(full, heads_full @ Wo)
        # per-head outputs are bitwise equal on the ranks
        local = []
        hq, hkv = heads // tp, kv // tp
        for qh, kh in A.tp_head_ranges(tp, heads, kv):
            qc, kc = slice(qh.start * hd, qh.stop * hd), slice(kh.start * hd, kh.stop * hd)
            local.append(A.attention_heads(x, Wq[:, qc], Wk[:, kc], Wv[:, kc], hq, hkv, causal))
        assert np.array_equal(np.concatenate(local, axis=-1), heads_full)
        log = []
        out = A.tp_attention(x, Wq, Wk, Wv, Wo, heads, kv, tp, causal, log=log)
        assert log == [("all_reduce", full.shape)]
        assert np.all(np.abs(out - full) <= row_parallel_error_bound(heads_full, Wo, tp))
        if tp == 1:
            assert np.array_equal(out, full)


def test_tp_attention_parts_sum_in_rank_order():
    rng = np.random.default_rng(7)
    Wq, Wk, Wv, Wo = _weights(rng, 4, 4, 2, 2)
    x = rng.standard_normal((3, 4))
    parts = A.tp_attention_parts(x, Wq, Wk, Wv, Wo, 4, 2, 2)
    assert len(parts) == 2 and parts[0].shape == (3, 4)
    assert np.array_equal(A.tp_attention(x, Wq, Wk, Wv, Wo, 4, 2, 2), parts[0] + parts[1])
    # a rank that used the wrong KV heads (KV head 0 for all) gives a different answer
    wrong_heads = A.attention_heads(x, Wq[:, 4:], Wk[:, :2], Wv[:, :2], 2, 1)
    assert not np.allclose(wrong_heads @ Wo[4:], parts[1])


# ----------------------------------------------------------------------------- closed forms


def test_forms_heads_per_rank():
    h, kv = attn_forms.HEADS_PER_RANK, attn_forms.KV_HEADS_PER_RANK
    assert h.name == "attention.heads_per_rank" and kv.name == "attention.kv_heads_per_rank"
    assert h.evaluate(num_heads=128, tp=8) == 16  # Llama 3 405B
    assert kv.evaluate(num_kv_heads=8, tp=8) == 1
    for heads, kvh, tp in [(8, 4, 2), (8, 4, 4), (6, 2, 2)]:
        ranges = A.tp_head_ranges(tp, heads, kvh)
        assert all(len(q) == h.evaluate(num_heads=heads, tp=tp) for q, _ in ranges)
        assert all(len(k) == kv.evaluate(num_kv_heads=kvh, tp=tp) for _, k in ranges)
    assert h.source and kv.source and h.constraints


def test_form_attention_allreduce_matches_log():
    rng = np.random.default_rng(8)
    Wq, Wk, Wv, Wo = _weights(rng, 4, 4, 2, 2)
    log = []
    A.tp_attention(rng.standard_normal((3, 4)), Wq, Wk, Wv, Wo, 4, 2, 2, log=log)
    assert len(log) == tp_forms.ATTENTION_ALLREDUCE_PER_FORWARD.evaluate() == 1
