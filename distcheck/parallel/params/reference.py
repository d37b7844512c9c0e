"""Parameter counts of decoder-only transformers, by enumerating every tensor.

This is the reference: :func:`param_tensors` lists each tensor of the model the
way a Llama-style state dict names it (``model.embed_tokens.weight``,
``model.layers.{i}.self_attn.q_proj.weight``, ..., ``lm_head.weight``) with its
shape, and :func:`count_params` sums the products of the shapes. The closed
form ``params.decoder_only`` (:mod:`distcheck.parallel.params.forms`) is an independent
derivation of the same number; the properties check that they agree.

Conventions (the Llama family, Hugging Face ``LlamaForCausalLM`` layout):

* attention: q and o are ``num_heads * head_dim`` wide, k and v are
  ``num_kv_heads * head_dim`` wide (grouped-query attention when
  ``num_kv_heads < num_heads``); no bias unless ``qkv_bias`` / ``out_bias``;
* MLP: SwiGLU has three matrices (gate, up, down), a plain MLP two (up, down),
  each ``hidden_size x ffn_hidden_size``; biases only with ``mlp_bias``;
* norms: two per layer (before attention, before the MLP) and one final norm,
  each with a weight vector of ``hidden_size``; ``norm="layer"`` adds a bias
  vector, ``norm=None`` counts no norm parameters (the lesson's synthetic
  configs);
* the output head is a separate ``vocab_size x hidden_size`` matrix unless
  ``tied_embeddings``.

Sources: the Llama 2 / Llama 3 model cards and configs (presets), the lesson
"Scaling and distributed training" (section 3, the 7B-style and 70B-style worked examples).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import TypedDict

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_bool, check_choice, check_positive_int

__all__ = [
    "TransformerConfig",
    "param_tensors",
    "count_params",
    "component_counts",
    "PRESETS",
    "NORMS",
    "MAX_LISTED_LAYERS",
]

#: the most layers :func:`param_tensors` lists tensor by tensor (the counts work for any num_layers)
MAX_LISTED_LAYERS = 10**5

#: allowed values of TransformerConfig.norm
NORMS = ("rms", "layer", None)


@dataclass(frozen=True, kw_only=True)
class TransformerConfig:
    """Shape of a decoder-only transformer (all arguments keyword-only).

    Args:
        hidden_size: model width d (>= 1).
        num_layers: number of transformer layers L (>= 1).
        ffn_hidden_size: MLP width (>= 1); for SwiGLU the width of gate and up.
        num_heads: attention (query) heads (>= 1).
        vocab_size: vocabulary size V (>= 1).
        num_kv_heads: key/value heads; default ``num_heads`` (multi-head
            attention). ``num_heads`` must be divisible by it.
        head_dim: width of one head; default ``hidden_size // num_heads``, in
            which case ``num_heads`` must divide ``hidden_size``.
        swiglu: three MLP matrices (gate, up, down) if True, two if False.
        tied_embeddings: the output head shares the embedding matrix.
        norm: ``"rms"`` (weight only), ``"layer"`` (weight and bias) or None
            (no norm parameters).
        final_norm: a norm after the last layer (counted only if ``norm``).
        qkv_bias, mlp_bias, out_bias: bias vectors on q/k/v, on the MLP
            matrices, on the attention output projection.

    Raises:
        ConfigError: naming the field, e.g. ``num_heads=32 must be divisible by
        num_kv_heads=6``.
    """

    hidden_size: int
    num_layers: int
    ffn_hidden_size: int
    num_heads: int
    vocab_size: int
    num_kv_heads: int | None = None
    head_dim: int | None = None
    swiglu: bool = True
    tied_embeddings: bool = False
    norm: str | None = "rms"
    final_norm: bool = True
    qkv_bias: bool = False
    mlp_bias: bool = False
    out_bias: bool = False

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "ffn_hidden_size", "num_heads", "vocab_size"):
            object.__setattr__(self, name, check_positive_int(name, getattr(self, name)))
        kv = check_positive_int("num_kv_heads", self.num_heads if self.num_kv_heads is None else self.num_kv_heads)
        object.__setattr__(self, "num_kv_heads", kv)
        if self.num_heads % kv != 0:
            raise ConfigError(
                "num_heads", self.num_heads, f"must be divisible by num_kv_heads={kv}"
            )
        if self.head_dim is None:
            if self.hidden_size % self.num_heads != 0:
                raise ConfigError(
                    "hidden_size",
                    self.hidden_size,
                    f"must be divisible by num_heads={self.num_heads} when head_dim is not given",
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        object.__setattr__(self, "head_dim", check_positive_int("head_dim", self.head_dim))
        check_choice("norm", self.norm, NORMS)
        for name in ("swiglu", "tied_embeddings", "final_norm", "qkv_bias", "mlp_bias", "out_bias"):
            object.__setattr__(self, name, check_bool(name, getattr(self, name)))

    @property
    def q_width(self) -> int:
        """Output width of the q projection: num_heads * head_dim."""
        return self.num_heads * _resolved(self.head_dim)

    @property
    def kv_width(self) -> int:
        """Output width of each of k and v: num_kv_heads * head_dim."""
        return _resolved(self.num_kv_heads) * _resolved(self.head_dim)

    def closed_form_inputs(self) -> dict[str, int]:
        """The inputs of the closed form ``params.decoder_only`` for this config (flags as 0/1)."""
        return dict(
            hidden_size=self.hidden_size, num_layers=self.num_layers, ffn_hidden_size=self.ffn_hidden_size,
            num_heads=self.num_heads, num_kv_heads=_resolved(self.num_kv_heads), head_dim=_resolved(self.head_dim),
            vocab_size=self.vocab_size, swiglu=int(self.swiglu), tied=int(self.tied_embeddings),
            norm_weights=int(self.norm is not None), norm_biases=int(self.norm == "layer"),
            qkv_bias=int(self.qkv_bias), mlp_bias=int(self.mlp_bias), out_bias=int(self.out_bias),
            final_norm=int(self.final_norm),
        )


def _resolved(value: int | None) -> int:
    """``num_kv_heads`` or ``head_dim`` of a TransformerConfig: ``__post_init__`` always sets both."""
    assert value is not None, "TransformerConfig.__post_init__ sets num_kv_heads and head_dim"
    return value


#: parameter tensors as ``(name, shape)``
Tensors = list[tuple[str, tuple[int, ...]]]


def _norm_tensors(prefix: str, cfg: TransformerConfig) -> Tensors:
    if cfg.norm is None:
        return []
    out: Tensors = [(f"{prefix}.weight", (cfg.hidden_size,))]
    if cfg.norm == "layer":
        out.append((f"{prefix}.bias", (cfg.hidden_size,)))
    return out


def _linear(prefix: str, out_features: int, in_features: int, bias: bool) -> Tensors:
    # torch.nn.Linear stores weight as (out_features, in_features)
    out: Tensors = [(f"{prefix}.weight", (out_features, in_features))]
    if bias:
        out.append((f"{prefix}.bias", (out_features,)))
    return out


def _layer_tensors(i: int, cfg: TransformerConfig) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    d, f = cfg.hidden_size, cfg.ffn_hidden_size
    p = f"model.layers.{i}"
    attention = (
        _linear(f"{p}.self_attn.q_proj", cfg.q_width, d, cfg.qkv_bias)
        + _linear(f"{p}.self_attn.k_proj", cfg.kv_width, d, cfg.qkv_bias)
        + _linear(f"{p}.self_attn.v_proj", cfg.kv_width, d, cfg.qkv_bias)
        + _linear(f"{p}.self_attn.o_proj", d, cfg.q_width, cfg.out_bias)
    )
    mlp = []
    if cfg.swiglu:
        mlp += _linear(f"{p}.mlp.gate_proj", f, d, cfg.mlp_bias)
    mlp += _linear(f"{p}.mlp.up_proj", f, d, cfg.mlp_bias)
    mlp += _linear(f"{p}.mlp.down_proj", d, f, cfg.mlp_bias)
    norms = _norm_tensors(f"{p}.input_layernorm", cfg) + _norm_tensors(f"{p}.post_attention_layernorm", cfg)
    return {"attention": attention, "mlp": mlp, "norms": norms}


def _check_cfg(cfg: object) -> TransformerConfig:
    if not isinstance(cfg, TransformerConfig):
        raise ConfigError("cfg", cfg, "must be a TransformerConfig (see distcheck.parallel.params.PRESETS)")
    return cfg


def _numel(tensors: list[tuple[str, tuple[int, ...]]]) -> int:
    return sum(prod(shape) for _, shape in tensors)


def param_tensors(cfg: TransformerConfig) -> list[tuple[str, tuple[int, ...]]]:
    """Every parameter tensor of ``cfg`` as ``(name, shape)``, in state-dict order.

    Order: embedding, then per layer q/k/v/o (+ biases), gate/up/down (+ biases),
    the two layer norms, then the final norm and ``lm_head`` (absent when tied).
    Shapes follow ``torch.nn.Linear``: ``(out_features, in_features)``.

    Raises ConfigError when ``cfg`` is not a TransformerConfig, or has more than
    :data:`MAX_LISTED_LAYERS` layers (a list that long is never useful; the counts
    :func:`count_params` / :func:`component_counts` work for any ``num_layers``).
    """
    _check_cfg(cfg)
    if cfg.num_layers > MAX_LISTED_LAYERS:
        raise ConfigError("num_layers", cfg.num_layers, f"must be <= {MAX_LISTED_LAYERS} to list every tensor "
                                                          "(count_params and component_counts take any num_layers)")
    out: Tensors = [("model.embed_tokens.weight", (cfg.vocab_size, cfg.hidden_size))]
    for i in range(cfg.num_layers):
        layer = _layer_tensors(i, cfg)
        out += layer["attention"] + layer["mlp"] + layer["norms"]
    if cfg.final_norm:
        out += _norm_tensors("model.norm", cfg)
    if not cfg.tied_embeddings:
        out.append(("lm_head.weight", (cfg.vocab_size, cfg.hidden_size)))
    return out


def count_params(cfg: TransformerConfig) -> int:
    """Total parameters of ``cfg``: the sum of the element counts of :func:`param_tensors`.

    Every layer has the same tensors, so one layer's tensors are counted and
    multiplied by ``num_layers`` (the same number as summing the full list, for
    any ``num_layers``). Raises ConfigError when ``cfg`` is not a TransformerConfig.
    """
    return sum(component_counts(cfg).values())


def component_counts(cfg: TransformerConfig) -> dict[str, int]:
    """Parameters by component, summed over all layers.

    Keys: ``embedding`` (token embedding), ``attention`` (q, k, v, o and their
    biases), ``mlp``, ``norms`` (per-layer and final norms), ``lm_head`` (0 when
    tied). The values sum to :func:`count_params`.

    Raises ConfigError when ``cfg`` is not a TransformerConfig.
    """
    _check_cfg(cfg)
    layer = {k: _numel(v) for k, v in _layer_tensors(0, cfg).items()}
    final_norm = _numel(_norm_tensors("model.norm", cfg)) if cfg.final_norm else 0
    return {
        "embedding": cfg.vocab_size * cfg.hidden_size,
        "attention": cfg.num_layers * layer["attention"],
        "mlp": cfg.num_layers * layer["mlp"],
        "norms": cfg.num_layers * layer["norms"] + final_norm,
        "lm_head": 0 if cfg.tied_embeddings else cfg.vocab_size * cfg.hidden_size,
    }


class _Shape(TypedDict):
    """The required fields of a TransformerConfig."""

    hidden_size: int
    num_layers: int
    ffn_hidden_size: int
    num_heads: int
    vocab_size: int


_LLAMA2_7B: _Shape = {"hidden_size": 4096, "num_layers": 32, "ffn_hidden_size": 11008, "num_heads": 32,
                      "vocab_size": 32000}

#: Named configurations. Totals (checked exactly by the tests):
#: lesson-7b-style 6,738,149,376 (Llama-2-7B without norm weights; lesson section 3),
#: lesson-70b-style 68,975,329,280 (lesson section 3), llama-2-7b 6,738,415,616,
#: llama-3-8b 8,030,261,248, llama-3-70b 70,553,706,496, llama-3-405b 405,853,388,800,
#: llama-3.2-1b 1,235,814,400 (tied embeddings).
#: The lesson's 13B-style exercise uses a raw count of 13e9 parameters: no
#: config of this family gives exactly 13e9, so there is no preset for it.
PRESETS: dict[str, TransformerConfig] = {
    "lesson-7b-style": TransformerConfig(**_LLAMA2_7B, norm=None),
    "lesson-70b-style": TransformerConfig(
        hidden_size=8192, num_layers=80, ffn_hidden_size=28672, num_heads=64, num_kv_heads=8,
        vocab_size=32000, norm=None,
    ),
    "llama-2-7b": TransformerConfig(**_LLAMA2_7B),
    "llama-3-8b": TransformerConfig(
        hidden_size=4096, num_layers=32, ffn_hidden_size=14336, num_heads=32, num_kv_heads=8, vocab_size=128256,
    ),
    "llama-3-70b": TransformerConfig(
        hidden_size=8192, num_layers=80, ffn_hidden_size=28672, num_heads=64, num_kv_heads=8, vocab_size=128256,
    ),
    "llama-3-405b": TransformerConfig(
        hidden_size=16384, num_layers=126, ffn_hidden_size=53248, num_heads=128, num_kv_heads=8, vocab_size=128256,
    ),
    "llama-3.2-1b": TransformerConfig(
        hidden_size=2048, num_layers=16, ffn_hidden_size=8192, num_heads=32, num_kv_heads=8, vocab_size=128256,
        tied_embeddings=True,
    ),
}
