"""Closed forms of training FLOPs and throughput: FLOPs per token, recomputation, MFU and HFU, the
utilization of a FLOP rate, tokens per second, GPU-hours and compute time.

Inputs: ``params`` P, the parameters that multiply a token (the layers' projection and MLP matrices,
the active experts' and routers' for an MoE model, and the output head; not the input embedding, a
lookup, nor norms and biases); ``layer_params`` the part of P in the layers (what full recomputation
runs again); ``num_layers`` L; ``seq_len`` s; ``attention_width`` W = H x e, the query heads times
the head width (PaLM's H Q; for a model whose key and value heads differ in width, the mean of the
two). FLOPs count a multiply-add as 2; FLOP/s, seconds and tokens per second are exact rationals.
"""

from __future__ import annotations

from distcheck.core.closed_form import ClosedForm, Input, register

__all__ = ["MODEL_PER_TOKEN", "RECOMPUTE_PER_TOKEN", "HARDWARE_PER_TOKEN", "MEGATRON_PER_ITERATION",
           "GPT_MODEL_PER_ITERATION", "MFU", "HFU", "MFU_PALM", "UTILIZATION", "ACHIEVED_PER_GPU",
           "TOKENS_PER_SECOND", "GPU_HOURS", "COMPUTE_TIME"]

P_in = Input("params", "parameters that multiply a token (layers' matrices + output head; no embedding)", "params")
Pl_in = Input("layer_params", "the layers' part of params (what full recomputation runs again)", "params")
L_in = Input("num_layers", "transformer layers L", "count")
s_in = Input("seq_len", "sequence length s", "tokens")
W_in = Input("attention_width", "query heads x head width, H e (PaLM's H Q)", "elements", kind="positive")
P, Pl, L, s, W = (i.symbol for i in (P_in, Pl_in, L_in, s_in, W_in))

_PALM = "Chowdhery et al. 2022, 'PaLM' (arXiv:2204.02311), Appendix B"
_KORTHIKANTI = "Korthikanti et al. 2022 (arXiv:2205.05198) §5"
_NARAYANAN = "Narayanan et al. 2021 (arXiv:2104.04473) §5.1"

_model = 6 * P + 12 * L * s * W

MODEL_PER_TOKEN = register(ClosedForm(
    name="flops.model_per_token",
    expr=_model,
    inputs=(P_in, L_in, s_in, W_in),
    unit="flops",
    source=f"{_PALM}: 6N + 12LHQT; {_NARAYANAN} and Korthikanti et al. 2022 (the same terms for GPT)",
    description="model FLOPs of one training token, forward + backward: 6 P (2 P forward, 4 P backward) + "
                "12 L s W (scores and attention over the values, full s x s square); no recomputation",
))

_recompute = {
    "selective": (4 * L * s * W, (L_in, s_in, W_in),
                  "selective recomputation runs the attention core again: scores, softmax and attention over "
                  "the values, 4 L s W per token"),
    "full": (2 * Pl + 4 * L * s * W, (Pl_in, L_in, s_in, W_in),
             "full recomputation runs every layer's forward again: 2 layer_params + 4 L s W per token (the head "
             "is not recomputed)"),
}

RECOMPUTE_PER_TOKEN: dict[str, ClosedForm] = {
    mode: register(ClosedForm(
        # builds flops.recompute_per_token.full, flops.recompute_per_token.selective
        name=f"flops.recompute_per_token.{mode}",
        expr=expr,
        inputs=inputs,
        unit="flops",
        source=f"{_KORTHIKANTI} (what each mode recomputes); {_NARAYANAN} (full: 96 = 72 + 24 per l h^2)",
        description=desc,
    ))
    for mode, (expr, inputs, desc) in _recompute.items()
}

HARDWARE_PER_TOKEN: dict[str, ClosedForm] = {
    mode: register(ClosedForm(
        # builds flops.hardware_per_token.full, flops.hardware_per_token.selective
        name=f"flops.hardware_per_token.{mode}",
        expr=_model + expr,
        inputs=(P_in,) + ((Pl_in,) if mode == "full" else ()) + (L_in, s_in, W_in),
        unit="flops",
        source=f"{_PALM} (hardware FLOPs count the recomputation); {_KORTHIKANTI}",
        description=f"hardware FLOPs of one training token with {mode} recomputation: "
                    f"flops.model_per_token + flops.recompute_per_token.{mode}",
    ))
    for mode, (expr, _, _) in _recompute.items()
}

B_in = Input("batch", "sequences per iteration B", "sequences")
l_in = Input("num_layers", "transformer layers l", "count")
h_in = Input("hidden_size", "hidden size h", "elements")
V_in = Input("vocab_size", "vocabulary size V", "count")
Bv, lv, hv, Vv = (i.symbol for i in (B_in, l_in, h_in, V_in))

MEGATRON_PER_ITERATION = register(ClosedForm(
    name="flops.megatron_per_iteration",
    expr=96 * Bv * s * lv * hv**2 * (1 + s / (6 * hv) + Vv / (16 * lv * hv)),
    inputs=(B_in, s_in, l_in, h_in, V_in),
    unit="flops",
    source=f"{_NARAYANAN}, the FLOPs of one iteration of a GPT model with full recomputation",
    description="96 B s l h^2 (1 + s/(6h) + V/(16 l h)): GPT layers (4h MLP, multi-head attention), the logit "
                "layer, every layer's forward run again (hardware FLOPs)",
))

GPT_MODEL_PER_ITERATION = register(ClosedForm(
    name="flops.gpt_model_per_iteration",
    expr=72 * Bv * s * lv * hv**2 * (1 + s / (6 * hv) + Vv / (12 * lv * hv)),
    inputs=(B_in, s_in, l_in, h_in, V_in),
    unit="flops",
    source="Korthikanti et al. 2022 (arXiv:2205.05198), model FLOPs of a GPT iteration (no recomputation)",
    description="72 B s l h^2 (1 + s/(6h) + V/(12 l h)): the model FLOPs of one iteration of a GPT model",
))

fpt_in = Input("flops_per_token", "model FLOPs of one training token", "flops", kind="positive")
hpt_in = Input("hardware_flops_per_token", "hardware FLOPs of one training token (recomputation counted)", "flops",
               kind="positive")
tps_in = Input("tokens_per_second", "training tokens processed per second, the whole run", "tokens_per_second",
               kind="positive")
g_in = Input("gpus", "GPUs (or chips) in the run", "GPUs")
peak_in = Input("peak_flops", "peak dense FLOP/s of one GPU in the training precision", "flops_per_second",
                kind="positive")
fpt, hpt, tps, g, peak = (i.symbol for i in (fpt_in, hpt_in, tps_in, g_in, peak_in))

MFU = register(ClosedForm(
    name="flops.mfu",
    expr=fpt * tps / (g * peak),
    inputs=(fpt_in, tps_in, g_in, peak_in),
    unit="fraction",
    source=_PALM,
    description="model FLOPs utilization: model FLOPs per token x tokens per second / (GPUs x peak FLOP/s)",
))

HFU = register(ClosedForm(
    name="flops.hfu",
    expr=hpt * tps / (g * peak),
    inputs=(hpt_in, tps_in, g_in, peak_in),
    unit="fraction",
    source=_PALM,
    description="hardware FLOPs utilization: hardware FLOPs per token (recomputation counted) x tokens per "
                "second / (GPUs x peak FLOP/s)",
))

N_in = Input("params", "parameters N (PaLM counts every parameter; its embedding is shared with the head)", "params")
H_in = Input("num_heads", "query heads H", "count")
Q_in = Input("head_dim", "width of one head Q", "elements")
att_in = Input("attention", "1: the attention term 12 L H Q T counted; 0: 6N alone", kind="flag", default=1)
rec_in = Input("recompute", "1: the whole forward counted again, 2N + 4 L H Q T (full recomputation: hardware "
               "FLOPs, HFU); 0: model FLOPs", kind="flag", default=0)
N, H, Q, att, rec = (i.symbol for i in (N_in, H_in, Q_in, att_in, rec_in))

MFU_PALM = register(ClosedForm(
    name="flops.mfu.palm",
    expr=(6 * N + att * 12 * L * H * Q * s + rec * (2 * N + att * 4 * L * H * Q * s)) * tps / (g * peak),
    inputs=(N_in, L_in, H_in, Q_in, s_in, tps_in, g_in, peak_in, att_in, rec_in),
    unit="fraction",
    source=_PALM,
    description="MFU as PaLM computes it: (6N + 12 L H Q T) x tokens per second / (chips x peak FLOP/s), "
                "T = seq_len; with recompute = 1 the forward counted twice, 8N + 16 L H Q T (an HFU)",
))

ach_in = Input("achieved_flops_per_gpu", "FLOP/s one GPU achieves (model or hardware FLOPs, as the source "
               "counts them)", "flops_per_second", kind="positive")
ach = ach_in.symbol

UTILIZATION = register(ClosedForm(
    name="flops.utilization",
    expr=ach / peak,
    inputs=(ach_in, peak_in),
    unit="fraction",
    source=f"{_NARAYANAN}, Table 1 (% of theoretical peak FLOP/s); Llama Team 2024, 'The Llama 3 Herd of "
           "Models' (arXiv:2407.21783), Table 4 (BF16 MFU beside TFLOPs/GPU)",
    description="the fraction of the peak FLOP/s one GPU achieves: achieved / peak",
))

ACHIEVED_PER_GPU = register(ClosedForm(
    name="flops.achieved_per_gpu",
    expr=fpt * tps / g,
    inputs=(fpt_in, tps_in, g_in),
    unit="flops_per_second",
    source=_PALM,
    description="FLOP/s one GPU achieves: FLOPs per token x tokens per second / GPUs",
))

tok_in = Input("tokens_per_step", "tokens in one training step (global batch x sequence length)", "tokens")
st_in = Input("step_time_s", "seconds of one training step", "seconds", kind="positive")
tok, st = tok_in.symbol, st_in.symbol

TOKENS_PER_SECOND = register(ClosedForm(
    name="flops.tokens_per_second",
    expr=tok / st,
    inputs=(tok_in, st_in),
    unit="tokens_per_second",
    source=_PALM,
    description="training throughput: tokens per step / seconds per step",
))

T_in = Input("tokens", "training tokens of the whole run", "tokens")
u_in = Input("mfu", "model FLOPs utilization (0..1]", "fraction", kind="positive")
T, u = T_in.symbol, u_in.symbol

GPU_HOURS = register(ClosedForm(
    name="flops.gpu_hours",
    expr=T * fpt / (peak * u * 3600),
    inputs=(T_in, fpt_in, peak_in, u_in),
    unit="gpu_hours",
    source=f"{_PALM} (MFU); Kaplan et al. 2020 (arXiv:2001.08361) §2.1 (C = 6 N D)",
    description="GPU-hours of a run: tokens x model FLOPs per token / (peak FLOP/s x MFU) / 3600 s",
))

fl_in = Input("flops", "FLOPs one GPU runs", "flops", kind="positive")
eff_in = Input("efficiency", "achievable fraction of the peak (0..1]", "fraction", kind="positive")
fl, eff = fl_in.symbol, eff_in.symbol

COMPUTE_TIME = register(ClosedForm(
    name="flops.compute_time_s",
    expr=fl / (peak * eff),
    inputs=(fl_in, peak_in, eff_in),
    unit="seconds",
    source=f"{_PALM} (peak FLOP/s); the achievable fraction is an assumption of the plan, stated with it",
    description="seconds to run a number of FLOPs at a fraction of the peak: flops / (peak_flops x efficiency)",
))
