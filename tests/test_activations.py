"""Activation memory: the tensor-by-tensor sum vs Korthikanti et al. 2022 Table 2."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest

from distcheck.core.errors import ConfigError
from distcheck.parallel.activations import (
    LAYER_TENSORS,
    TABLE2_SETTINGS,
    bytes_per_layer,
    megatron_bytes_per_layer,
    stored_tensor_bytes,
    table2_bytes_per_layer,
)
from distcheck.parallel.activations import forms as F

GRID = list(itertools.product([1, 3, 16, 2048], [1, 2], [8, 12, 4096], [1, 3, 32], [1, 2, 3, 8]))


def test_table2_rows_cover_the_forms():
    assert set(TABLE2_SETTINGS) == {"none", "tp", "tp_sp", "tp_selective", "tp_sp_selective", "full_recompute"}
    assert set(F.BYTES_PER_LAYER) == set(TABLE2_SETTINGS) | {"megatron"}
    for name, form in F.BYTES_PER_LAYER.items():
        assert form.name == f"activations.bytes_per_layer.{name}"
        assert form.unit == "bytes" and form.source and form.description


@pytest.mark.parametrize("setting", sorted(TABLE2_SETTINGS))
def test_reference_equals_table2_on_grid(setting):
    form = F.BYTES_PER_LAYER[setting]
    for s, b, h, a, t in GRID:
        assert table2_bytes_per_layer(setting, s, b, h, a, t) == form(s=s, b=b, h=h, a=a, t=t), (s, b, h, a, t)


def test_block_totals_match_the_paper_derivation():
    s, b, h, a = 7, 3, 10, 5
    sbh, scores = s * b * h, a * s * s * b
    parts = dict(stored_tensor_bytes(s, b, h, a))
    block = {x.name: x.block for x in LAYER_TENSORS}

    def total(name):
        return sum(v for k, v in parts.items() if block[k] == name)

    assert total("attention") == 11 * sbh + 5 * scores
    assert total("mlp") == 19 * sbh
    assert total("layernorm") == 4 * sbh
    # tensors tensor parallelism leaves whole: 10 sbh
    split = {x.name: x.tp_split for x in LAYER_TENSORS}
    assert sum(v for k, v in parts.items() if not split[k]) == 10 * sbh


def test_hand_values():
    # s=4, b=2, h=8, a=2: sbh = 64, a s^2 b = 64
    assert bytes_per_layer(4, 2, 8, 2) == 34 * 64 + 5 * 64 == 2496
    assert bytes_per_layer(4, 2, 8, 2, 2) == 10 * 64 + (24 * 64 + 5 * 64) // 2 == 1568
    assert bytes_per_layer(4, 2, 8, 2, 2, sequence_parallel=True) == 2496 // 2
    assert bytes_per_layer(4, 2, 8, 2, 2, recompute="selective") == 10 * 64 + 12 * 64
    assert bytes_per_layer(4, 2, 8, 2, 2, sequence_parallel=True, recompute="selective") == 17 * 64
    assert bytes_per_layer(4, 2, 8, 2, 2, recompute="full") == 128
    assert bytes_per_layer(4, 2, 8, 2, 2, sequence_parallel=True, recompute="full") == 64
    assert bytes_per_layer(1, 1, 1, 1, 3) == Fraction(10) + Fraction(29, 3)


def test_gpt3_scale_value():
    # s = 2048, b = 1, h = 12288, a = 96, t = 8 (the paper's 175B setting)
    assert table2_bytes_per_layer("tp_sp_selective", 2048, 1, 12288, 96, 8) == 34 * 2048 * 12288 // 8 == 106_954_752
    assert table2_bytes_per_layer("none", 2048, 1, 12288, 96, 8) == 2048 * 12288 * 34 + 5 * 96 * 2048**2


def test_megatron_variant():
    for s, b, h, _, t in GRID:
        for ffn in (1, h, 4 * h, 3 * h + 5):
            ref = megatron_bytes_per_layer(s, b, h, ffn, t)
            assert ref == F.BYTES_PER_LAYER["megatron"](s=s, b=b, h=h, ffn=ffn, t=t)
        assert megatron_bytes_per_layer(s, b, h, 4 * h, t) == F.BYTES_PER_LAYER["tp_sp_selective"](s=s, b=b, h=h, t=t)
    assert megatron_bytes_per_layer(2, 1, 8, 8 * 3) != F.BYTES_PER_LAYER["tp_sp_selective"](s=2, b=1, h=8)


def test_unused_inputs_have_no_effect():
    f = F.BYTES_PER_LAYER["tp_selective"]
    assert f(s=8, b=1, h=16, t=2) == f(s=8, b=1, h=16, a=99, t=2) == 8 * 16 * (10 + 12)
    assert F.BYTES_PER_LAYER["none"](s=8, b=1, h=16, a=2) == F.BYTES_PER_LAYER["none"](s=8, b=1, h=16, a=2, t=7)
    with pytest.raises(ConfigError, match="a=None is required"):
        F.BYTES_PER_LAYER["tp"](s=8, b=1, h=16, t=2)


@pytest.mark.parametrize("call, message", [
    (lambda: bytes_per_layer(0, 1, 8, 1), "s=0 must be >= 1"),
    (lambda: bytes_per_layer(1, 1, 8, 1, 2.0), "t=2.0 must be an integer"),
    (lambda: bytes_per_layer(1, 1, 8, 1, recompute="some"), "recompute='some' must be one of 'none'"),
    (lambda: bytes_per_layer(1, 1, 8, 1, sequence_parallel=1), "sequence_parallel=1 must be a bool"),
    (lambda: bytes_per_layer(1, 1, 8, 1, ffn=0), "ffn=0 must be >= 1"),
    (lambda: table2_bytes_per_layer("sp", 1, 1, 8, 1), "setting='sp' must be one of 'none'"),
    (lambda: table2_bytes_per_layer("none", 1, 1, 8, 1, 0), "t=0 must be >= 1"),
])
def test_errors(call, message):
    with pytest.raises(ConfigError) as info:
        call()
    assert str(info.value).startswith(message)
