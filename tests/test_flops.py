"""FLOPs, MFU and ring-time forms against values computed by hand, the published figures they reproduce, and
their bad input (distcheck.parallel.flops; comm.time_s.*)."""

from __future__ import annotations

from fractions import Fraction as F

import pytest

from distcheck.closed_form import get
from distcheck.core.errors import ConfigError
from distcheck.parallel import ep, flops, params


def test_the_lesson_70b_style_model_per_token_by_hand():
    cfg = params.PRESETS["lesson-70b-style"]
    # per layer: q, o 8192^2 each; k, v 8192 x 1024 each; MLP 3 x 8192 x 28672; head 32000 x 8192
    layer = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672
    assert flops.matmul_params(cfg) == (80 * layer, 32000 * 8192) == (68_451_041_280, 262_144_000)
    p = 68_451_041_280 + 262_144_000  # the 68,975,329,280 parameters less the 262,144,000 of the embedding lookup
    t = flops.training_flops_per_token(cfg, 2048)
    assert t.model == 6 * p + 12 * 80 * 2048 * 8192 == 428_385_239_040
    assert t.recompute == 0 and t.hardware == t.model
    assert flops.training_flops_per_token(cfg, 2048, "selective").recompute == 4 * 80 * 2048 * 8192 == 5_368_709_120
    full = flops.training_flops_per_token(cfg, 2048, "full")
    assert full.recompute == 2 * 68_451_041_280 + 4 * 80 * 2048 * 8192 == 142_270_791_680
    form = get("flops.model_per_token").evaluate(params=p, num_layers=80, seq_len=2048, attention_width=64 * 128)
    assert form == 428_385_239_040


def test_mixtral_flops_per_token_by_hand():
    # per layer: q, o 4096^2; k, v 4096 x 1024; router 4096 x 8; two of the eight experts, 3 x 4096 x 14336 each
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 8 + 2 * 3 * 4096 * 14336
    p = 32 * layer + 32000 * 4096
    assert flops.moe_matmul_params(ep.MIXTRAL_8X7B) == (32 * layer, 32000 * 4096)
    t = flops.moe_training_flops_per_token(ep.MIXTRAL_8X7B, 4096)
    assert t.model == 6 * p + 12 * 32 * 4096 * 32 * 128 == 82_933_972_992


def test_deepseek_v3_attention_counts_its_key_and_value_widths():
    fwd = flops.moe_forward_flops_per_token(ep.DEEPSEEK_V3, 4096)
    assert fwd["scores"] == 61 * 2 * 4096 * 128 * 192 and fwd["context"] == 61 * 2 * 4096 * 128 * 128


def test_palm_540b_mfu_reproduces_table_3():
    """PaLM 540B (Chowdhery et al. 2022): N = 540.35B, L = 118, H = 48, Q = 256, T = 2048, 238.3K tokens/s on 6144
    TPU v4 chips of 275 TFLOP/s: (6N + 12LHQT) x 238.3e3 / (6144 x 275e12) = 46.23%, printed 46.2%."""
    inputs = dict(params=540_350_000_000, num_layers=118, num_heads=48, head_dim=256, seq_len=2048,
                  tokens_per_second=238_300, gpus=6144, peak_flops=275 * 10**12)
    value = get("flops.mfu.palm").evaluate(**inputs)
    per_token = 6 * 540_350_000_000 + 12 * 118 * 48 * 256 * 2048
    assert value == F(per_token * 238_300, 6144 * 275 * 10**12)
    assert abs(value - F(462, 1000)) <= F(5, 10000)
    without = get("flops.mfu.palm").evaluate(**inputs, attention=0)  # 6N alone: 45.7%, not the printed figure
    assert abs(without - F(462, 1000)) > F(5, 10000) and round(float(without) * 1000) == 457


def test_megatron_and_llama3_utilization():
    # Narayanan et al. 2021 Table 1, 1T row: 163 TFLOP/s per A100 of 312: 52%; Llama 3 Table 4 row 1: 430 of 989.5: 43%
    util = get("flops.utilization")
    assert round(util.evaluate(achieved_flops_per_gpu=163 * 10**12, peak_flops=312 * 10**12) * 100) == 52
    assert round(util.evaluate(achieved_flops_per_gpu=430 * 10**12, peak_flops=F(9895, 10) * 10**12) * 100) == 43


def test_ring_time_by_hand():
    # 1 GB all-reduce on 8 ranks of one node at 450 GB/s: 8.4 us + 14 steps x 3.4 us + 2 x 7/8 x 1e9 / 450e9
    t = get("comm.time_s.ring.all_reduce").evaluate(size_bytes=10**9, n=8, busbw=450 * 10**9)
    assert t == F(84, 10**7) + 14 * F(34, 10**7) + F(7, 4) * F(10**9, 450 * 10**9)
    # on 2 nodes (4 + 4): 2 of the 14 steps cross the network at 14 us
    t2 = get("comm.time_s.ring.all_reduce").evaluate(size_bytes=10**9, n=8, nodes=2, busbw=450 * 10**9)
    assert t2 - t == 2 * (F(14, 10**6) - F(34, 10**7))
    ag = get("comm.time_s.ring.all_gather").evaluate(size_bytes=8 * 10**6, n=4, busbw=50 * 10**9, nodes=4)
    assert ag == F(84, 10**7) + 3 * F(14, 10**6) + F(3, 4) * F(8 * 10**6, 50 * 10**9)


@pytest.mark.parametrize("call, field", [
    (lambda: flops.training_flops_per_token(params.PRESETS["llama-3-8b"], 0), "seq_len"),
    (lambda: flops.training_flops_per_token(params.PRESETS["llama-3-8b"], 8, "partial"), "recompute"),
    (lambda: flops.training_flops_per_token("llama-3-8b", 8), "cfg"),
    (lambda: flops.mfu(10, 10, 0, 10), "gpus"),
    (lambda: flops.mfu(10, 1.5, 1, 10), "tokens_per_second"),
    (lambda: flops.mfu(10, 10, 1, 0), "peak_flops"),
    (lambda: flops.moe_forward_flops_per_token(
        ep.MoEConfig(vocab_size=8, h=4, num_layers=1, attention_shapes=((4, 4),), num_experts=2, k=1,
                     expert_ffn=4), 8), "attention"),
])
def test_bad_input_names_its_field(call, field):
    with pytest.raises(ConfigError) as err:
        call()
    assert err.value.field == field


def test_forms_refuse_out_of_domain_inputs():
    with pytest.raises(ConfigError, match="peak_flops"):
        get("flops.utilization").evaluate(achieved_flops_per_gpu=1, peak_flops=0)
    with pytest.raises(ConfigError, match="busbw"):
        get("comm.time_s.ring.all_reduce").evaluate(size_bytes=1, n=2, busbw=-1)


def test_throughput_claims_are_read_in_their_units():
    from distcheck.audit import audit_key, parse_key
    from distcheck.audit.claim_units import unit_factor

    assert unit_factor("flops_per_second", "TFLOP/s") == 10**12 == unit_factor("flops_per_second", "TFLOPS")
    assert unit_factor("flops", "PFLOPs") == 10**15 and unit_factor("seconds", "ms") == F(1, 1000)
    assert unit_factor("tokens_per_second", "M tokens/s") == 10**6 and unit_factor("gpu_hours", "M GPU-hours") == 10**6
    with pytest.raises(ConfigError, match="does not measure"):
        unit_factor("flops_per_second", "TFLOPs")  # a count of FLOPs is not a rate
    text = '[meta]\ntitle = "t"\nsource = "s"\n' + "".join(
        f'\n[[claim]]\nid = "c{i}"\nquantity = "{q}"\ninputs = {inputs}\nclaimed = {claimed}\nunit = "{unit}"\n'
        for i, (q, inputs, claimed, unit) in enumerate([
            ("flops.achieved_per_gpu", "{ flops_per_token = 428e9, tokens_per_second = 1e6, gpus = 1024 }",
             '"~418"', "TFLOP/s"),
            ("flops.tokens_per_second", "{ tokens_per_step = 4194304, step_time_s = 8 }", '"0.52"', "M tokens/s"),
            ("flops.compute_time_s", '{ flops = 1e15, peak_flops = "1000 TFLOP/s", efficiency = 0.5 }', 2000, "ms"),
            ("flops.gpu_hours", '{ tokens = 15e12, flops_per_token = 6e9, peak_flops = "1000 TFLOP/s", mfu = 0.5 }',
             '"0.05"', "M GPU-hours"),
            ("flops.model_per_token", "{ params = 1e9, num_layers = 2, seq_len = 1024, attention_width = 512 }",
             '"6.01"', "GFLOPs"),
        ]))
    verdicts = [v.verdict for v in audit_key(parse_key(text, "k.toml")).claims]
    assert verdicts == ["holds"] * 5, verdicts
