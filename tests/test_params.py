"""Parameter counts: presets exact, tensor enumeration vs closed forms, config validation."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distcheck.core.errors import ConfigError
from distcheck.parallel.params import PRESETS, TransformerConfig, component_counts, count_params, param_tensors
from distcheck.parallel.params import forms as F

EXPECTED = {
    "lesson-7b-style": 6_738_149_376,
    "lesson-70b-style": 68_975_329_280,
    "llama-2-7b": 6_738_415_616,
    "llama-3-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "llama-3-405b": 405_853_388_800,
    "llama-3.2-1b": 1_235_814_400,
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_totals_exact(name):
    assert count_params(PRESETS[name]) == EXPECTED[name]


def test_presets_cover_expected():
    assert set(PRESETS) == set(EXPECTED)


def test_lesson_7b_style_is_llama2_7b_without_norms():
    # 2 norms per layer + final norm, 4096 each
    assert EXPECTED["llama-2-7b"] - EXPECTED["lesson-7b-style"] == (2 * 32 + 1) * 4096 == 266_240
    assert component_counts(PRESETS["lesson-7b-style"])["norms"] == 0


def test_lesson_70b_style_worked_example():
    cfg = PRESETS["lesson-70b-style"]
    attn = F.ATTENTION_PER_LAYER(hidden_size=8192, num_heads=64, num_kv_heads=8, head_dim=128)
    mlp = F.MLP_PER_LAYER(hidden_size=8192, ffn_hidden_size=28672)
    assert attn == 2 * 67_108_864 + 2 * 8_388_608 == 150_994_944
    assert mlp == 3 * 234_881_024 == 704_643_072
    assert attn + mlp == 855_638_016
    c = component_counts(cfg)
    assert c["attention"] == 80 * 150_994_944
    assert c["mlp"] == 80 * 704_643_072
    assert c["attention"] + c["mlp"] == 68_451_041_280
    assert c["embedding"] + c["lm_head"] == 524_288_000
    assert cfg.kv_width == 1024


def test_llama32_1b_is_tied():
    cfg = PRESETS["llama-3.2-1b"]
    names = [n for n, _ in param_tensors(cfg)]
    assert "lm_head.weight" not in names
    assert component_counts(cfg)["lm_head"] == 0
    untied = dataclasses.replace(cfg, tied_embeddings=False)
    assert count_params(untied) - count_params(cfg) == 128256 * 2048


def test_llama2_7b_state_dict_layout():
    tensors = param_tensors(PRESETS["llama-2-7b"])
    # embedding + 32 * (q, k, v, o, gate, up, down, 2 norms) + final norm + lm_head
    assert len(tensors) == 1 + 32 * 9 + 2 == 291
    assert tensors[0] == ("model.embed_tokens.weight", (32000, 4096))
    assert tensors[1] == ("model.layers.0.self_attn.q_proj.weight", (4096, 4096))
    assert ("model.layers.31.mlp.down_proj.weight", (4096, 11008)) in tensors
    assert ("model.layers.31.mlp.gate_proj.weight", (11008, 4096)) in tensors
    assert tensors[-2] == ("model.norm.weight", (4096,))
    assert tensors[-1] == ("lm_head.weight", (32000, 4096))


def test_gqa_shapes():
    tensors = dict(param_tensors(PRESETS["llama-3-8b"]))
    assert tensors["model.layers.0.self_attn.k_proj.weight"] == (1024, 4096)
    assert tensors["model.layers.0.self_attn.o_proj.weight"] == (4096, 4096)


def test_biases_and_layernorm_counted():
    cfg = TransformerConfig(hidden_size=8, num_layers=2, ffn_hidden_size=16, num_heads=2, vocab_size=10,
                            swiglu=False, norm="layer", qkv_bias=True, mlp_bias=True, out_bias=True)
    # by hand: attention 4*64 + q,k,v biases 24 + o bias 8 = 288; mlp 2*128 + 16 + 8 = 280;
    # norms 2 layers * 2 norms * 16 + final 16 = 80; embedding + head 160
    assert count_params(cfg) == 2 * (288 + 280) + 80 + 160 == 1376
    names = [n for n, _ in param_tensors(cfg)]
    assert "model.layers.0.input_layernorm.bias" in names
    assert "model.norm.bias" in names
    assert "model.layers.1.self_attn.o_proj.bias" in names
    assert not any("gate_proj" in n for n in names)


def test_explicit_head_dim_need_not_divide_hidden():
    cfg = TransformerConfig(hidden_size=10, num_layers=1, ffn_hidden_size=4, num_heads=4, num_kv_heads=2,
                            head_dim=3, vocab_size=5)
    t = dict(param_tensors(cfg))
    assert t["model.layers.0.self_attn.q_proj.weight"] == (12, 10)
    assert t["model.layers.0.self_attn.v_proj.weight"] == (6, 10)
    assert t["model.layers.0.self_attn.o_proj.weight"] == (10, 12)


def _form_inputs(cfg: TransformerConfig) -> dict:
    return dict(
        hidden_size=cfg.hidden_size, num_layers=cfg.num_layers, ffn_hidden_size=cfg.ffn_hidden_size,
        num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        vocab_size=cfg.vocab_size, swiglu=int(cfg.swiglu), tied=int(cfg.tied_embeddings),
        norm_weights=int(cfg.norm is not None), norm_biases=int(cfg.norm == "layer"),
        qkv_bias=int(cfg.qkv_bias), mlp_bias=int(cfg.mlp_bias), out_bias=int(cfg.out_bias),
        final_norm=int(cfg.final_norm),
    )


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_closed_form_matches_presets(name):
    assert F.DECODER_ONLY(**_form_inputs(PRESETS[name])) == EXPECTED[name]


@st.composite
def configs(draw):
    kv = draw(st.integers(1, 4))
    heads = kv * draw(st.integers(1, 4))
    return TransformerConfig(
        hidden_size=draw(st.integers(1, 64)), num_layers=draw(st.integers(1, 4)),
        ffn_hidden_size=draw(st.integers(1, 64)), num_heads=heads, num_kv_heads=kv,
        head_dim=draw(st.integers(1, 16)), vocab_size=draw(st.integers(1, 100)),
        swiglu=draw(st.booleans()), tied_embeddings=draw(st.booleans()),
        norm=draw(st.sampled_from(["rms", "layer", None])), final_norm=draw(st.booleans()),
        qkv_bias=draw(st.booleans()), mlp_bias=draw(st.booleans()), out_bias=draw(st.booleans()),
    )


@settings(max_examples=60, deadline=None)
@given(configs())
def test_enumeration_equals_closed_forms(cfg):
    inputs = _form_inputs(cfg)
    assert cfg.closed_form_inputs() == inputs
    assert count_params(cfg) == F.DECODER_ONLY(**inputs)
    c = component_counts(cfg)
    assert sum(c.values()) == count_params(cfg)
    L = cfg.num_layers
    assert c["attention"] == L * F.ATTENTION_PER_LAYER(
        hidden_size=cfg.hidden_size, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, qkv_bias=inputs["qkv_bias"], out_bias=inputs["out_bias"])
    assert c["mlp"] == L * F.MLP_PER_LAYER(hidden_size=cfg.hidden_size, ffn_hidden_size=cfg.ffn_hidden_size,
                                           swiglu=inputs["swiglu"], mlp_bias=inputs["mlp_bias"])
    assert c["embedding"] == F.EMBEDDING(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size)
    assert c["lm_head"] == F.LM_HEAD(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, tied=inputs["tied"])
    assert c["norms"] == F.NORMS(hidden_size=cfg.hidden_size, num_layers=L, norm_weights=inputs["norm_weights"],
                                 norm_biases=inputs["norm_biases"], final_norm=inputs["final_norm"])


def test_forms_have_names_and_sources():
    forms = [F.DECODER_ONLY, F.ATTENTION_PER_LAYER, F.MLP_PER_LAYER, F.EMBEDDING, F.LM_HEAD, F.NORMS]
    assert [f.name for f in forms] == ["params.decoder_only", "params.attention_per_layer", "params.mlp_per_layer",
                                       "params.embedding", "params.lm_head", "params.norms"]
    for f in forms:
        assert f.unit == "params" and f.source and f.description


_BASE = dict(hidden_size=64, num_layers=2, ffn_hidden_size=128, num_heads=8, vocab_size=100)


@pytest.mark.parametrize("override, message", [
    ({"num_kv_heads": 3}, "num_heads=8 must be divisible by num_kv_heads=3"),
    ({"num_heads": 6}, "hidden_size=64 must be divisible by num_heads=6 when head_dim is not given"),
    ({"hidden_size": 0}, "hidden_size=0 must be >= 1"),
    ({"num_layers": 2.0}, "num_layers=2.0 must be an integer"),
    ({"vocab_size": True}, "vocab_size=True must be an integer"),
    ({"num_kv_heads": 0}, "num_kv_heads=0 must be >= 1"),
    ({"head_dim": 0}, "head_dim=0 must be >= 1"),
    ({"norm": "batch"}, "norm='batch' must be one of 'rms', 'layer', None"),
    ({"swiglu": 1}, "swiglu=1 must be a bool"),
    ({"tied_embeddings": "yes"}, "tied_embeddings='yes' must be a bool"),
])
def test_config_errors(override, message):
    with pytest.raises(ConfigError) as info:
        TransformerConfig(**{**_BASE, **override})
    assert str(info.value) == message
    assert info.value.field == message.split("=")[0]


def test_config_is_frozen_and_fills_defaults():
    cfg = TransformerConfig(**_BASE)
    assert cfg.num_kv_heads == 8 and cfg.head_dim == 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.hidden_size = 1  # type: ignore[misc]


def test_form_rejects_non_flag():
    with pytest.raises(ConfigError, match="swiglu=2 must be 0 or 1"):
        F.MLP_PER_LAYER(hidden_size=2, ffn_hidden_size=2, swiglu=2)


# ---- counts by layer multiplication equal the full tensor list; wrong types and huge lists refused


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.sampled_from(["rms", "layer", None]), st.booleans(), st.booleans())
def test_count_params_equals_the_sum_over_every_listed_tensor(layers, heads, norm, tied, final_norm):
    from math import prod

    cfg = TransformerConfig(hidden_size=4 * heads, num_layers=layers, ffn_hidden_size=7, num_heads=heads,
                            vocab_size=11, norm=norm, tied_embeddings=tied, final_norm=final_norm, qkv_bias=True)
    assert count_params(cfg) == sum(prod(shape) for _, shape in param_tensors(cfg))


def test_a_trillion_layers_counts_but_does_not_list():
    cfg = dataclasses.replace(PRESETS["llama-2-7b"], num_layers=10**12)
    per_layer = (count_params(PRESETS["llama-2-7b"]) - component_counts(PRESETS["llama-2-7b"])["embedding"]
                 - component_counts(PRESETS["llama-2-7b"])["lm_head"] - 4096) // 32
    assert count_params(cfg) == 2 * 32000 * 4096 + 4096 + 10**12 * per_layer
    with pytest.raises(ConfigError, match=r"num_layers=1000000000000 must be <= 100000"):
        param_tensors(cfg)


def test_norm_given_as_an_array_is_a_config_error():
    import numpy as np

    with pytest.raises(ConfigError, match="norm=.* must be one of 'rms', 'layer', None"):
        dataclasses.replace(PRESETS["llama-2-7b"], norm=np.array(["rms", "layer"]))
