"""Closed forms of activation memory per transformer layer (bytes, one GPU).

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models" (arXiv:2205.05198), Table 2: 16-bit activations, 1-byte
dropout masks, MLP width 4h. s = sequence length, b = micro-batch size,
h = hidden size, a = attention heads, t = tensor-parallel size.

Every form of the family takes the same inputs (s, b, h, a, t) so a caller can
pass one set to all of them; an input a form does not use has a default and
no effect (e.g. t in ``none``, a in the selective rows).

Also ``activations.bytes_per_layer.megatron``: Megatron-LM's
``theoretical_memory_usage.py`` writes the sequence-parallel + selective row as
s b h (18 + 4 ffn / h) / t, which is 34 s b h / t at ffn = 4h.
"""

from __future__ import annotations

import sympy as sp

from distcheck.core.closed_form import ClosedForm, Input, register

__all__ = ["BYTES_PER_LAYER"]

s_in = Input("s", "sequence length", "tokens")
b_in = Input("b", "micro-batch size", "sequences")
h_in = Input("h", "hidden size", "elements")
t_in = Input("t", "tensor-parallel size (unused where the row has no TP)", "count", default=1)
a_req = Input("a", "attention heads", "count")
a_opt = Input("a", "attention heads (unused: the scores are recomputed or not stored)", "count", default=1)
f_in = Input("ffn", "MLP width", "elements")
s, b, h, t, a, f = (i.symbol for i in (s_in, b_in, h_in, t_in, a_req, f_in))

_SRC = "Korthikanti et al. 2022 (arXiv:2205.05198) Table 2"

_rows = {
    "none": (s * b * h * (34 + 5 * a * s / h), True, "no parallelism: s b h (34 + 5 a s / h)"),
    "tp": (s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), True,
           "tensor parallel: s b h (10 + 24/t + 5 a s / (h t))"),
    "tp_sp": (s * b * h / t * (34 + 5 * a * s / h), True,
              "tensor + sequence parallel: s b h / t (34 + 5 a s / h)"),
    "tp_selective": (s * b * h * (10 + 24 / t), False,
                     "tensor parallel + selective recompute: s b h (10 + 24/t)"),
    "tp_sp_selective": (34 * s * b * h / t, False,
                        "tensor + sequence parallel + selective recompute: 34 s b h / t"),
    "full_recompute": (2 * s * b * h, False, "full recompute: only the layer input, 2 s b h"),
}

BYTES_PER_LAYER: dict[str, ClosedForm] = {
    name: register(ClosedForm(
        # builds:
        #   activations.bytes_per_layer.full_recompute, activations.bytes_per_layer.none,
        #   activations.bytes_per_layer.tp, activations.bytes_per_layer.tp_selective, activations.bytes_per_layer.tp_sp,
        #   activations.bytes_per_layer.tp_sp_selective
        name=f"activations.bytes_per_layer.{name}",
        expr=sp.together(expr),
        inputs=(s_in, b_in, h_in, a_req if needs_a else a_opt, t_in),
        unit="bytes",
        source=_SRC,
        description=f"activation bytes per layer per GPU, 16-bit activations, 1-byte masks, ffn = 4h; {desc}",
    ))
    for name, (expr, needs_a, desc) in _rows.items()
}

BYTES_PER_LAYER["megatron"] = register(ClosedForm(
    name="activations.bytes_per_layer.megatron",
    expr=s * b * h * (18 + 4 * f / h) / t,
    inputs=(s_in, b_in, h_in, f_in, t_in),
    unit="bytes",
    source="Megatron-LM megatron/training/theoretical_memory_usage.py (Korthikanti et al. 2022 Table 2 generalized)",
    description="activation bytes per layer per GPU with sequence parallel + selective recompute, any MLP width",
    constraints=("equals tp_sp_selective when ffn == 4h",),
))
