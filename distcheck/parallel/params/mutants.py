"""Mutants of the parameter count: the mistakes of counting a transformer's parameters by hand.

==============================  =================================================  =========================
mutant                          mistake                                            killed by
==============================  =================================================  =========================
params.attention_ignores_kv     k and v sized with num_heads (ignores GQA)         params.total.closed_form
params.tied_counted_twice       a tied output head counted again                   params.total.closed_form
params.tied_subtracted_twice    a tied head subtracted from a count that omits it  params.total.closed_form
params.final_norm_forgotten     the final norm's weights (and biases) not counted  params.components.additive
params.swiglu_gate_missing      SwiGLU's gate matrix not counted (two matrices)    params.option.delta
==============================  =================================================  =========================
"""

from __future__ import annotations

import dataclasses

from distcheck.engine.mutants import mutant
from distcheck.parallel.params.reference import TransformerConfig, count_params

__all__ = ["count_params_ignoring_kv_heads", "count_params_tied_counted_twice", "count_params_tied_subtracted_twice",
           "count_params_final_norm_forgotten", "count_params_swiglu_gate_missing"]


@mutant("params.attention_ignores_kv", "params.total.closed_form")
def count_params_ignoring_kv_heads(cfg: TransformerConfig) -> int:
    """Attention count that sizes k and v with num_heads (ignores grouped-query attention)."""
    return count_params(dataclasses.replace(cfg, num_kv_heads=cfg.num_heads))


@mutant("params.tied_counted_twice", "params.total.closed_form")
def count_params_tied_counted_twice(cfg: TransformerConfig) -> int:
    """Tied embeddings counted twice: the shared matrix counted again as the output head."""
    return count_params(dataclasses.replace(cfg, tied_embeddings=False))


@mutant("params.tied_subtracted_twice", "params.total.closed_form")
def count_params_tied_subtracted_twice(cfg: TransformerConfig) -> int:
    """Tied embeddings subtracted twice: V x d removed again from a count that already omits the head."""
    n = count_params(cfg)
    return n - cfg.vocab_size * cfg.hidden_size if cfg.tied_embeddings else n


@mutant("params.final_norm_forgotten", "params.components.additive")
def count_params_final_norm_forgotten(cfg: TransformerConfig) -> int:
    """The final norm after the last layer left out of the count (its weights, and biases for a layer norm)."""
    return count_params(dataclasses.replace(cfg, final_norm=False))


@mutant("params.swiglu_gate_missing", "params.option.delta")
def count_params_swiglu_gate_missing(cfg: TransformerConfig) -> int:
    """A SwiGLU MLP counted as two matrices, as a GELU one: the gate matrix is missing."""
    return count_params(dataclasses.replace(cfg, swiglu=False))
