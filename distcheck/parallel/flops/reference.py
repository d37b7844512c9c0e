"""FLOPs of one training token, counted matmul by matmul from a model's shape (exact integers).

A matmul of an (m x k) by a (k x n) matrix is 2 m k n FLOPs (one multiply and one add per term).
Per token and per layer, the forward of a decoder runs

* the projections: q (d x H e), k and v (d x G e each), o (H e x d): 2 d H e + 2 d G e, twice
  (2 FLOPs per weight);
* the MLP: (2 + swiglu) matrices of d x f: 2 (2 + swiglu) d f;
* the attention scores q k^T: for each of the H query heads, a dot of width e with each of the s
  keys: 2 s H e; and the attention over the values: 2 s H e (the full s x s square: PaLM's
  Appendix B counts it so, and a kernel that skips the masked half does half of this term);

and once per token the output head (V x d): 2 V d, whether or not it is tied to the embedding (the
head's matmul runs either way; the embedding itself is a lookup). Norms, activation functions,
the softmax and the residual additions are left out (a few FLOPs per element against thousands
per weight). So the forward is 2 P + 4 L s H e with P the parameters that multiply a token
(:func:`matmul_params`), and with the backward, twice the forward (the gradients with respect to
the inputs and to the weights), a training token costs 6 P + 12 L s H e: PaLM's 6N + 12LHQT
(Chowdhery et al. 2022, Appendix B) with N the matmul parameters.

Recomputation runs part of the forward again in the backward (Korthikanti et al. 2022, §5):

* ``full``: every layer's forward, from the stored layer input: 2 P_layers + 4 L s H e (the head
  is not recomputed: its output is the loss's input, kept);
* ``selective``: only the attention core, the scores, softmax and attention over the values:
  4 L s H e (the "all terms with s^2" that Korthikanti et al. recompute);
* ``none``: nothing.

Model FLOPs (MFU's numerator) leave recomputation out; hardware FLOPs (HFU's) count it (PaLM,
Appendix B). Mixture-of-experts layers (:func:`moe_forward_flops_per_token`) run the router (d x E)
and only the k routed and the shared experts for each token.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_choice, check_positive_int
from distcheck.parallel.ep.models import DEEPSEEK_V3, MIXTRAL_8X7B, MoEConfig, param_tensors
from distcheck.parallel.params.reference import TransformerConfig

__all__ = [
    "RECOMPUTE", "MOE_ATTENTION", "TrainingFlops", "forward_flops_per_token", "moe_forward_flops_per_token",
    "matmul_params", "moe_matmul_params", "training_flops_per_token", "moe_training_flops_per_token",
    "mfu", "hfu",
]

#: the recomputation modes (Korthikanti et al. 2022): nothing, the attention core, every layer's forward
RECOMPUTE = ("none", "selective", "full")

#: attention of the published MoE configurations, which :class:`MoEConfig` holds only as weight shapes:
#: (query heads, width of a query/key head, width of a value head). Mixtral 8x7B: 32 heads of 128
#: (its config.json); DeepSeek-V3: 128 heads, keys of 128 + 64 (the decoupled RoPE part) and values of 128
#: (DeepSeek-V3 Technical Report, §4.2, and its config.json).
MOE_ATTENTION: dict[MoEConfig, tuple[int, int, int]] = {
    MIXTRAL_8X7B: (32, 128, 128),
    DEEPSEEK_V3: (128, 192, 128),
}


def _check_cfg(cfg: Any) -> TransformerConfig:
    if not isinstance(cfg, TransformerConfig):
        raise ConfigError("cfg", type(cfg).__name__, "must be a TransformerConfig")
    return cfg


def forward_flops_per_token(cfg: TransformerConfig, seq_len: int) -> dict[str, int]:
    """The forward FLOPs of one token of a sequence of ``seq_len``, by part, summed over the layers.

    Keys: ``q``, ``k``, ``v``, ``o`` (projections), ``mlp``, ``scores`` (q k^T), ``context``
    (attention over the values), ``head`` (the output head, once). Module doc for the conventions.
    Raises ConfigError for a ``cfg`` that is not a TransformerConfig or ``seq_len`` < 1.
    """
    cfg = _check_cfg(cfg)
    s = check_positive_int("seq_len", seq_len)
    d, h_, e, f, L = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.ffn_hidden_size, cfg.num_layers
    g = cfg.num_kv_heads
    assert e is not None and g is not None, "TransformerConfig.__post_init__ sets head_dim and num_kv_heads"
    return {
        "q": L * 2 * d * h_ * e, "k": L * 2 * d * g * e, "v": L * 2 * d * g * e, "o": L * 2 * h_ * e * d,
        "mlp": L * 2 * (3 if cfg.swiglu else 2) * d * f,
        "scores": L * 2 * s * h_ * e, "context": L * 2 * s * h_ * e,
        "head": 2 * cfg.vocab_size * d,
    }


def matmul_params(cfg: TransformerConfig) -> tuple[int, int]:
    """``(layer_params, head_params)``: the weights that multiply a token, in the layers (projections and
    MLP matrices: no norms, no biases) and in the output head (V d, tied or not). Their sum is the P of
    ``flops.model_per_token``. Raises ConfigError for a ``cfg`` that is not a TransformerConfig."""
    cfg = _check_cfg(cfg)
    fwd = forward_flops_per_token(cfg, 1)
    layers = sum(fwd[k] for k in ("q", "k", "v", "o", "mlp")) // 2
    return layers, fwd["head"] // 2


def _moe_attention(cfg: MoEConfig, attention: tuple[int, int, int] | None) -> tuple[int, int, int]:
    if attention is None:
        attention = MOE_ATTENTION.get(cfg)
    if attention is None:
        raise ConfigError("attention", None, "is required for an MoE model not in distcheck.parallel.ep.MODELS: "
                                             "(query heads, query/key head width, value head width)")
    if not (isinstance(attention, tuple) and len(attention) == 3):
        raise ConfigError("attention", attention, "must be (query heads, query/key head width, value head width)")
    for name, v in zip(("heads", "qk_head_dim", "v_head_dim"), attention, strict=True):
        check_positive_int(name, v)
    return attention


def moe_matmul_params(cfg: MoEConfig) -> tuple[int, int]:
    """``(layer_params, head_params)`` of an MoE decoder for one token: the 2-D weights of
    :func:`distcheck.parallel.ep.param_tensors` with ``active=True`` (attention, dense FFNs, routers, the k
    routed and the shared experts), less the embedding; the head ``V h`` (tied or not)."""
    if not isinstance(cfg, MoEConfig):
        raise ConfigError("cfg", type(cfg).__name__, "must be a MoEConfig")
    layers = 0
    for name, shape in param_tensors(cfg, active=True).items():
        if len(shape) == 2 and name not in ("embed", "head"):
            layers += shape[0] * shape[1]
    return layers, cfg.vocab_size * cfg.h


def moe_forward_flops_per_token(cfg: MoEConfig, seq_len: int,
                                attention: tuple[int, int, int] | None = None) -> dict[str, int]:
    """The forward FLOPs of one token of an MoE decoder, by part: ``weights`` (2 x the layers' matmul
    weights a token uses, :func:`moe_matmul_params`), ``scores`` (2 s H d_qk per layer), ``context``
    (2 s H d_v per layer), ``head`` (2 V h). ``attention`` = (H, d_qk, d_v), taken from
    :data:`MOE_ATTENTION` for the published configurations. Raises ConfigError for bad input."""
    layers, head = moe_matmul_params(cfg)
    s = check_positive_int("seq_len", seq_len)
    heads, qk, v = _moe_attention(cfg, attention)
    return {"weights": 2 * layers, "scores": cfg.num_layers * 2 * s * heads * qk,
            "context": cfg.num_layers * 2 * s * heads * v, "head": 2 * head}


@dataclass(frozen=True)
class TrainingFlops:
    """FLOPs of one training token: ``model`` (forward + backward, 3 x the forward: MFU's numerator),
    ``recompute`` (the forward run again) and ``hardware`` (``model + recompute``: HFU's numerator)."""

    model: int
    recompute: int

    @property
    def hardware(self) -> int:
        return self.model + self.recompute


def _training(fwd: dict[str, int], recompute: str) -> TrainingFlops:
    check_choice("recompute", recompute, RECOMPUTE)
    core = fwd["scores"] + fwd["context"]
    extra = {"none": 0, "selective": core, "full": sum(fwd.values()) - fwd["head"]}[recompute]
    return TrainingFlops(model=3 * sum(fwd.values()), recompute=extra)


def training_flops_per_token(cfg: TransformerConfig, seq_len: int, recompute: str = "none") -> TrainingFlops:
    """Model and hardware FLOPs of one training token (module doc). Raises ConfigError for bad input."""
    return _training(forward_flops_per_token(cfg, seq_len), recompute)


def moe_training_flops_per_token(cfg: MoEConfig, seq_len: int, recompute: str = "none",
                                 attention: tuple[int, int, int] | None = None) -> TrainingFlops:
    """As :func:`training_flops_per_token` for an MoE decoder (:func:`moe_forward_flops_per_token`)."""
    return _training(moe_forward_flops_per_token(cfg, seq_len, attention), recompute)


def _positive(field: str, value: Any) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, Fraction)):
        raise ConfigError(field, value, "must be an int or a Fraction (exact)")
    if value <= 0:
        raise ConfigError(field, value, "must be > 0")
    return Fraction(value)


def mfu(flops_per_token: int | Fraction, tokens_per_second: int | Fraction, gpus: int,
        peak_flops: int | Fraction) -> Fraction:
    """Model FLOPs utilization (PaLM, Appendix B): the model FLOPs the run achieves per second,
    ``flops_per_token x tokens_per_second``, over the peak of its ``gpus`` GPUs,
    ``gpus x peak_flops`` (FLOP/s each). A fraction (0.462 is 46.2%). Raises ConfigError for a value
    that is not a positive exact number, or ``gpus`` not an integer >= 1."""
    g = check_positive_int("gpus", gpus)
    return (_positive("flops_per_token", flops_per_token) * _positive("tokens_per_second", tokens_per_second)
            / (g * _positive("peak_flops", peak_flops)))


def hfu(hardware_flops_per_token: int | Fraction, tokens_per_second: int | Fraction, gpus: int,
        peak_flops: int | Fraction) -> Fraction:
    """Hardware FLOPs utilization (PaLM, Appendix B): as :func:`mfu` with the FLOPs the hardware runs,
    recomputation included (:attr:`TrainingFlops.hardware`)."""
    return mfu(hardware_flops_per_token, tokens_per_second, gpus, peak_flops)
