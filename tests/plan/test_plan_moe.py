"""``distcheck plan memory`` for mixture-of-experts models: the planner's figures are the ep package's closed
forms (ep.params.total, ep.params.active, ep.memory.bytes_per_gpu) and its tensor-by-tensor counts, for the
DeepSeek-V3 and Mixtral 8x7B presets and for explicit MoE sizes."""

from __future__ import annotations

import json

import pytest

from distcheck.cli import main
from distcheck.closed_form import get
from distcheck.parallel.ep import models
from distcheck.plan import Hardware
from distcheck.plan.moe import moe_estimate, moe_plan, resolve_moe


@pytest.mark.parametrize("name, total, active", [("deepseek-v3", 671_026_404_352, 37_552_282_624),
                                                 ("mixtral-8x7b", 46_702_792_704, 12_879_925_248)])
@pytest.mark.parametrize("tp, ep", [(1, 1), (2, 4), (8, 8)])
def test_the_planner_and_the_forms_agree(name, total, active, tp, ep):
    cfg = models.MODELS[name]
    e = moe_estimate(cfg, Hardware(gpus=64 * tp, gpu_memory="80 GB"), "mixed_adamw", tp=tp, ep=ep)
    inputs = cfg.closed_form_inputs()
    assert (e.total_params, e.active_params) == (total, active) == models.param_counts(cfg)
    assert e.total_params == get("ep.params.total").evaluate(**inputs)
    assert e.active_params == get("ep.params.active").evaluate(k=cfg.k, **inputs)
    assert e.dense_params + e.expert_params == total
    want = get("ep.memory.bytes_per_gpu").evaluate(dense_params=e.dense_params, expert_params=e.expert_params, tp=tp,
                                                   ep=ep, bytes_per_parameter=16)
    assert e.bytes_per_gpu == want
    # and the tensor-by-tensor count of one GPU's share (rank 0 of its ep group), at 16 B per parameter
    assert e.bytes_per_gpu == sum(models.params_per_gpu(cfg, tp=tp, ep=ep)) * 16
    assert (e.dp, e.fits) == (64, e.bytes_per_gpu <= 80 * 10**9)


def test_plan_memory_deepseek_v3_names_total_active_and_conventions(capsys):
    assert main(["plan", "memory", "--model", "DeepSeek-V3", "--gpus", "2048", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["total_params"], data["active_params"]) == (671_026_404_352, 37_552_282_624)
    assert any("Megatron-core" in c for c in data["conventions"]) and any("16 B" in c for c in data["conventions"])
    cfg, hw = models.DEEPSEEK_V3, Hardware(gpus=2048, gpu_memory="80 GB")
    ranked = moe_plan(cfg, hw)
    assert [(r["tp"], r["ep"], r["bytes_per_gpu"]) for r in data["layouts"]] == \
        [(e.tp, e.ep, e.bytes_per_gpu) for e in ranked]
    best = ranked[0]  # TP 8 x EP 256 x DP 256: (17.1e9 / 8 + 653.9e9 / 2048) x 16 B
    assert (best.tp, best.ep, best.dp) == (8, 256, 256)
    assert best.bytes_per_gpu == (17_117_633_536 // 8 + 653_908_770_816 // 2048) * 16
    assert main(["plan", "memory", "--model", "deepseek-v3", "--gpus", "2048", "--tp", "1", "--ep", "64"]) == 1
    assert "does not fit" not in capsys.readouterr().out  # the MoE table, not the dense planner's


def test_explicit_moe_sizes_equal_the_preset(capsys):
    flags = ["--hidden-size", "4096", "--num-layers", "32", "--vocab-size", "32000", "--num-heads", "32",
             "--num-kv-heads", "8", "--num-experts", "8", "--experts-per-token", "2", "--expert-ffn", "14336"]
    assert main(["plan", "memory", *flags, "--gpus", "16", "--tp", "2", "--ep", "8", "--format", "json"]) == 0
    explicit = json.loads(capsys.readouterr().out)
    assert main(["plan", "memory", "--model", "mixtral-8x7b", "--gpus", "16", "--tp", "2", "--ep", "8",
                 "--format", "json"]) == 0
    preset = json.loads(capsys.readouterr().out)
    for key in ("total_params", "active_params", "dense_params", "expert_params", "layouts"):
        assert explicit[key] == preset[key], key
    assert resolve_moe(None) is None and resolve_moe("llama-3-70b") is None


@pytest.mark.parametrize("argv, message", [
    (["--model", "llama-3-70b", "--gpus", "8", "--ep", "2"], "--ep"),
    (["--model", "mixtral-8x7b", "--gpus", "8", "--ep", "16"], "must divide"),
    (["--model", "mixtral-8x7b", "--gpus", "8", "--tp", "2", "--ep", "8"], "dp=4"),
    (["--model", "mixtral-8x7b", "--gpus", "8", "--pp", "2"], "--pp"),
    (["--expert-ffn", "8", "--gpus", "8", "--model", "llama-3-8b"], "--num-experts"),
    (["--num-experts", "8", "--gpus", "8", "--hidden-size", "64"], "num_layers"),
])
def test_bad_moe_input_is_exit_2_naming_the_field(argv, message, capsys):
    assert main(["plan", "memory", *argv]) == 2
    assert message in capsys.readouterr().err
