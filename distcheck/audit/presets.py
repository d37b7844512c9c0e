"""Model presets for audit claims: which input of a quantity a preset fills, and the nominal
parameter count a preset's name prints (``llama-3-70b`` -> 70e9)."""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

from distcheck.core.validate import check_type

__all__ = ["preset_names", "nominal_params"]


#: input name of a quantity -> how to read it from a TransformerConfig
_PRESET_FIELDS: dict[str, Callable] = {
    "hidden_size": lambda c: c.hidden_size, "h": lambda c: c.hidden_size,
    "num_layers": lambda c: c.num_layers,
    "ffn_hidden_size": lambda c: c.ffn_hidden_size, "ffn": lambda c: c.ffn_hidden_size,
    "num_heads": lambda c: c.num_heads, "a": lambda c: c.num_heads,
    "num_kv_heads": lambda c: c.num_kv_heads, "head_dim": lambda c: c.head_dim,
    "vocab_size": lambda c: c.vocab_size,
    "swiglu": lambda c: int(c.swiglu), "tied": lambda c: int(c.tied_embeddings),
    "norm_weights": lambda c: int(c.norm is not None), "norm_biases": lambda c: int(c.norm == "layer"),
    "qkv_bias": lambda c: int(c.qkv_bias), "mlp_bias": lambda c: int(c.mlp_bias),
    "out_bias": lambda c: int(c.out_bias), "final_norm": lambda c: int(c.final_norm),
}
_DECODER_INPUTS = ("hidden_size", "num_layers", "ffn_hidden_size", "num_heads", "num_kv_heads", "head_dim",
                   "vocab_size", "swiglu", "tied", "norm_weights", "norm_biases", "qkv_bias", "mlp_bias",
                   "out_bias", "final_norm")


def preset_names() -> list[str]:
    """The names of :data:`distcheck.parallel.params.PRESETS`, sorted."""
    from distcheck.parallel.params.reference import PRESETS

    return sorted(PRESETS)


_NOMINAL = re.compile(r"(?<![0-9.])(\d+(?:\.\d+)?)([bm])(?![a-z0-9])", re.IGNORECASE)


def nominal_params(model: str) -> Fraction | None:
    """The parameter count printed in a preset's name ("llama-3-70b" -> 70e9), None if it has none.
    Raises ConfigError when ``model`` is not a str."""
    check_type("model", model, str, "must be a preset name (a str)")
    m = _NOMINAL.search(model)
    if not m:
        return None
    scale = 10**9 if m[2].lower() == "b" else 10**6
    return Fraction(m[1]) * scale
