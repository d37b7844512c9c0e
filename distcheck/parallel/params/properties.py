"""Parameter-count properties: the tensor-enumerating reference against the closed forms.

Exact (integers). Implementation slot: ``count_params(cfg: TransformerConfig) -> int``
(:func:`distcheck.parallel.params.count_params`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from distcheck.core.errors import PropertyFailure
from distcheck.engine.catalogue import form_value as _form
from distcheck.engine.registry import Property, register
from distcheck.engine.runner import call_impl
from distcheck.parallel.params import strategies as ds

if TYPE_CHECKING:
    from distcheck.parallel.params.reference import TransformerConfig

__all__ = ["form_inputs", "total_matches_closed_form", "additive_over_components", "option_delta"]


def _count(cfg: TransformerConfig) -> int:
    from distcheck.parallel.params.reference import count_params

    return count_params(cfg)


def form_inputs(cfg: TransformerConfig) -> dict[str, int | None]:
    """The inputs of ``params.decoder_only`` for a TransformerConfig (flags as 0/1)."""
    return dict(
        hidden_size=cfg.hidden_size, num_layers=cfg.num_layers, ffn_hidden_size=cfg.ffn_hidden_size,
        num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, vocab_size=cfg.vocab_size,
        swiglu=int(cfg.swiglu), tied=int(cfg.tied_embeddings), norm_weights=int(cfg.norm is not None),
        norm_biases=int(cfg.norm == "layer"), qkv_bias=int(cfg.qkv_bias), mlp_bias=int(cfg.mlp_bias),
        out_bias=int(cfg.out_bias), final_norm=int(cfg.final_norm),
    )


def total_matches_closed_form(cfg: TransformerConfig, *, impl: Callable[[TransformerConfig], int] = _count) -> None:
    """count_params(cfg) == params.decoder_only(cfg), exactly."""
    got = call_impl("count_params", impl, cfg)
    expected = _form("params.decoder_only", **form_inputs(cfg))
    if got != expected:
        raise PropertyFailure(f"total parameters of {cfg}", expected=expected, got=got)


def additive_over_components(cfg: TransformerConfig, *, impl: Callable[[TransformerConfig], int] | None = None) -> None:
    """The component counts sum to the total, and each equals its closed form
    (L x attention_per_layer, L x mlp_per_layer, embedding, lm_head, norms)."""
    from distcheck.parallel.params.reference import component_counts

    parts = component_counts(cfg)
    total = call_impl("count_params", impl or _count, cfg)
    if sum(parts.values()) != total:
        raise PropertyFailure(f"components do not add up for {cfg}", expected=total, got=sum(parts.values()))
    v = form_inputs(cfg)
    L = cfg.num_layers
    expected = {
        "attention": L * _form("params.attention_per_layer", **v),
        "mlp": L * _form("params.mlp_per_layer", **v),
        "embedding": _form("params.embedding", **v),
        "lm_head": _form("params.lm_head", **v),
        "norms": _form("params.norms", **v),
    }
    for key, value in expected.items():
        if parts.get(key) != value:
            raise PropertyFailure(f"component {key} of {cfg}", expected=value, got=parts.get(key))


def _options() -> SearchStrategy[tuple[TransformerConfig, str]]:
    return st.tuples(ds.transformer_configs(), st.sampled_from(["gqa", "swiglu", "tied"]))


def option_delta(case: tuple[TransformerConfig, str], *, impl: Callable[[TransformerConfig], int] = _count) -> None:
    """Switching one option (GQA -> MHA, SwiGLU on, tied off) changes the count by exactly
    the closed-form delta: decoder_only(with) - decoder_only(without)."""
    cfg, option = case
    if option == "gqa":
        other = dataclasses.replace(cfg, num_kv_heads=cfg.num_heads)
    elif option == "swiglu":
        other = dataclasses.replace(cfg, swiglu=not cfg.swiglu)
    else:
        other = dataclasses.replace(cfg, tied_embeddings=not cfg.tied_embeddings)
    got = call_impl("count_params", impl, other) - call_impl("count_params", impl, cfg)
    expected = _form("params.decoder_only", **form_inputs(other)) - _form("params.decoder_only", **form_inputs(cfg))
    if got != expected:
        raise PropertyFailure(f"changing {option} on {cfg}", expected=expected, got=got)


_SIG = "count_params(cfg: TransformerConfig) -> int"


def _configs() -> tuple[TransformerConfig, ...]:
    """GQA (4 query heads, 2 kv heads) with tied embeddings and SwiGLU; multi-head attention,
    untied, with every bias and a layer norm."""
    from distcheck.parallel.params.reference import TransformerConfig

    return (TransformerConfig(hidden_size=8, num_layers=2, ffn_hidden_size=16, num_heads=4, num_kv_heads=2,
                              vocab_size=32, swiglu=True, tied_embeddings=True, norm="rms"),
            TransformerConfig(hidden_size=6, num_layers=1, ffn_hidden_size=4, num_heads=3, vocab_size=10,
                              swiglu=False, tied_embeddings=False, norm="layer", qkv_bias=True, mlp_bias=True,
                              out_bias=True))


def _option_edges() -> tuple[tuple[TransformerConfig, str], ...]:
    gqa_tied = _configs()[0]
    return tuple((gqa_tied, option) for option in ("gqa", "swiglu", "tied"))

register(Property("params.total.closed_form", lambda: ds.transformer_configs(), total_matches_closed_form,
                  "count_params == params.decoder_only for GQA/SwiGLU/tied/norm/bias options, exactly", _count, _SIG,
                  _configs))
register(Property("params.components.additive", lambda: ds.transformer_configs(), additive_over_components,
                  "components sum to the total; each == its closed form", _count, _SIG, _configs))
register(Property("params.option.delta", _options, option_delta,
                  "toggling GQA, SwiGLU or tying changes the count by exactly the closed-form delta", _count, _SIG,
                  _option_edges))
