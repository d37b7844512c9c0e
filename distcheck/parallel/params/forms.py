"""Closed forms for the parameter count of a decoder-only transformer.

Derived by hand from the layer structure (not from :mod:`distcheck.parallel.params`,
which enumerates tensors): with d = hidden_size, f = ffn_hidden_size,
H = num_heads, G = num_kv_heads, e = head_dim, V = vocab_size, L = num_layers,

* attention per layer: q and o are d x He, k and v are d x Ge, so
  2dHe + 2dGe, plus biases qkv_bias (He + 2Ge) and out_bias d;
* MLP per layer: (2 + swiglu) d f, plus mlp_bias ((1 + swiglu) f + d);
* norms: (2L + final_norm) d (norm_weights + norm_biases);
* embedding V d, output head (1 - tied) V d.

Source: the lesson "Scaling and distributed training" (section 3, 70B-style worked example: q, o are
d^2, k, v are d x KV width, MLP is 3 d f, embedding plus head 2 V d), and the
Llama 2 / 3 model configs.
"""

from __future__ import annotations

from distcheck.core.closed_form import ClosedForm, Input, register

__all__ = ["DECODER_ONLY", "ATTENTION_PER_LAYER", "MLP_PER_LAYER", "EMBEDDING", "LM_HEAD", "NORMS"]

_SRC = "lesson 'Scaling and distributed training' section 3, 70B-style worked example; Llama 2/3 model configs"

d_in = Input("hidden_size", "model width d", "elements")
L_in = Input("num_layers", "transformer layers L", "count")
f_in = Input("ffn_hidden_size", "MLP width f", "elements")
H_in = Input("num_heads", "query heads H", "count")
G_in = Input("num_kv_heads", "key/value heads G", "count")
e_in = Input("head_dim", "width of one head e", "elements")
V_in = Input("vocab_size", "vocabulary size V", "count")
swiglu_in = Input("swiglu", "1: gate, up and down matrices (SwiGLU); 0: up and down", kind="flag", default=1)
tied_in = Input("tied", "1: the output head shares the embedding matrix", kind="flag", default=0)
nw_in = Input("norm_weights", "1: each norm has a weight vector of d", kind="flag", default=1)
nb_in = Input("norm_biases", "1: each norm has a bias vector of d (LayerNorm)", kind="flag", default=0)
qkvb_in = Input("qkv_bias", "1: q, k, v projections have biases", kind="flag", default=0)
mlpb_in = Input("mlp_bias", "1: MLP matrices have biases", kind="flag", default=0)
outb_in = Input("out_bias", "1: the attention output projection has a bias", kind="flag", default=0)
fn_in = Input("final_norm", "1: a norm after the last layer", kind="flag", default=1)

d, L, f, H, G, e, V = (i.symbol for i in (d_in, L_in, f_in, H_in, G_in, e_in, V_in))
swiglu, tied, nw, nb, qkvb, mlpb, outb, fn = (
    i.symbol for i in (swiglu_in, tied_in, nw_in, nb_in, qkvb_in, mlpb_in, outb_in, fn_in)
)

_attn = 2 * d * H * e + 2 * d * G * e + qkvb * (H * e + 2 * G * e) + outb * d
_mlp = (2 + swiglu) * d * f + mlpb * ((1 + swiglu) * f + d)
_norms = (2 * L + fn) * d * (nw + nb)

ATTENTION_PER_LAYER = register(ClosedForm(
    name="params.attention_per_layer",
    expr=_attn,
    inputs=(d_in, H_in, G_in, e_in, qkvb_in, outb_in),
    unit="params",
    source=_SRC,
    description="q, k, v, o projections of one layer: 2 d H e + 2 d G e (+ biases)",
))

MLP_PER_LAYER = register(ClosedForm(
    name="params.mlp_per_layer",
    expr=_mlp,
    inputs=(d_in, f_in, swiglu_in, mlpb_in),
    unit="params",
    source=_SRC,
    description="MLP of one layer: (2 + swiglu) d f (+ biases)",
))

EMBEDDING = register(ClosedForm(
    name="params.embedding",
    expr=V * d,
    inputs=(V_in, d_in),
    unit="params",
    source=_SRC,
    description="token embedding matrix V x d (the output head is params.lm_head)",
))

LM_HEAD = register(ClosedForm(
    name="params.lm_head",
    expr=(1 - tied) * V * d,
    inputs=(V_in, d_in, tied_in),
    unit="params",
    source=_SRC,
    description="output head V x d, zero when tied to the embedding",
))

NORMS = register(ClosedForm(
    name="params.norms",
    expr=_norms,
    inputs=(d_in, L_in, nw_in, nb_in, fn_in),
    unit="params",
    source=_SRC,
    description="norm parameters: two norms per layer plus the final norm, d weights (+ d biases) each",
))

DECODER_ONLY = register(ClosedForm(
    name="params.decoder_only",
    expr=L * (_attn + _mlp) + _norms + (2 - tied) * V * d,
    inputs=(d_in, L_in, f_in, H_in, G_in, e_in, V_in, swiglu_in, tied_in, nw_in, nb_in, qkvb_in, mlpb_in,
            outb_in, fn_in),
    unit="params",
    source=_SRC,
    description="total parameters of a Llama-style decoder-only transformer",
    constraints=("num_heads % num_kv_heads == 0",),
))
