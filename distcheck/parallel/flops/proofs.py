"""Proofs (sympy): the published GPT formulas are the general FLOPs forms at a GPT's shape.

A GPT layer (multi-head attention, a two-matrix MLP of width 4h) has 4 h^2 projection and 8 h^2 MLP
weights: layer_params = 12 l h^2, P = 12 l h^2 + V h with the logit layer, W = h. At that shape
``flops.gpt_model_per_iteration`` (Korthikanti et al. 2022) is B s x ``flops.model_per_token`` and
``flops.megatron_per_iteration`` (Narayanan et al. 2021 §5.1) is B s x ``flops.hardware_per_token.full``.
"""

from __future__ import annotations

from distcheck.core.closed_form import ClosedForm
from distcheck.engine.catalogue import get
from distcheck.engine.proofs import proof, zero

__all__ = ["gpt_model_flops", "megatron_hardware_flops"]


def _at_gpt_shape(per_iteration: ClosedForm, per_token: ClosedForm) -> tuple[bool, str]:
    sym = per_iteration.symbols
    b, s, l_, h, v = (sym[k] for k in ("batch", "seq_len", "num_layers", "hidden_size", "vocab_size"))
    shape = {"params": 12 * l_ * h**2 + v * h, "layer_params": 12 * l_ * h**2, "num_layers": l_, "seq_len": s,
             "attention_width": h}
    general = b * s * per_token.expr.subs({per_token.symbols[k]: shape[k] for k in per_token.symbols})
    return zero(per_iteration.expr - general), f"{per_iteration.expr} = B s ({per_token.name} at a GPT shape)"


@proof("proof.flops.gpt_model")
def gpt_model_flops() -> tuple[bool, str]:
    """flops.gpt_model_per_iteration == B s x flops.model_per_token at P = 12 l h^2 + V h, W = h."""
    return _at_gpt_shape(get("flops.gpt_model_per_iteration"), get("flops.model_per_token"))


@proof("proof.flops.megatron_hardware")
def megatron_hardware_flops() -> tuple[bool, str]:
    """flops.megatron_per_iteration == B s x flops.hardware_per_token.full at the GPT shape (full recomputation)."""
    return _at_gpt_shape(get("flops.megatron_per_iteration"), get("flops.hardware_per_token.full"))
