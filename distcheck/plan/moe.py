"""Mixture-of-experts memory per GPU under ep x dp x tp, from the closed forms of :mod:`distcheck.parallel.ep`.

A model is a :class:`distcheck.parallel.ep.MoEConfig`: a published one by name (:data:`distcheck.parallel.ep.MODELS`:
``deepseek-v3``, ``mixtral-8x7b``), or explicit sizes (a GQA attention of ``num_heads`` query heads and
``num_kv_heads`` key/value heads of ``hidden_size / num_heads``, SwiGLU experts). Its parameters are
``ep.params.total`` and ``ep.params.active`` (the k routed experts a token reads instead of all E); the
routed experts' share is the tensor-by-tensor count of :func:`distcheck.parallel.ep.params_per_gpu`.

Memory per GPU is ``ep.memory.bytes_per_gpu`` (model states: weights, gradients, optimizer state), under the
conventions of :data:`CONVENTIONS`:

* Megatron-core's placement: ``gpus = tp x dp``, the expert-parallel groups inside data parallelism (ep
  divides dp and the number of experts), expert tensor parallelism equal to tp; every rank holds 1/tp of the
  dense parameters and 1/(ep tp) of the routed experts', dp replicates both (no ZeRO, no pipeline);
* norms and routers counted split by tp, as the form states (Megatron-core keeps them whole: at most
  ((2 L + 1) h + (L - dense_layers) h E) parameters more per GPU);
* bytes per parameter from the named convention (``mixed_adamw``: 16, Rajbhandari et al. 2020, ZeRO §3);
  activations not counted.

Units: bytes (GB = 1e9). Sources: Megatron-core ``parallel_state`` (expert model parallel groups);
DeepSeek-AI 2024, "DeepSeek-V3 Technical Report" (arXiv:2412.19437) §2.1, §3.2; Jiang et al. 2024,
"Mixtral of Experts" (arXiv:2401.04088) §2.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_positive_int

if TYPE_CHECKING:
    from distcheck.parallel.ep.models import MoEConfig
    from distcheck.plan.inputs import Hardware

__all__ = ["CONVENTIONS", "MoEEstimate", "resolve_moe", "moe_estimate", "moe_plan"]

#: the conventions every MoE estimate is made under (module doc)
CONVENTIONS = (
    "placement: Megatron-core's, gpus = tp x dp with the ep groups inside dp (ep divides dp and the experts), "
    "expert tp = tp; dp replicates (no ZeRO, no pipeline)",
    "per GPU: 1/tp of the dense parameters, 1/(ep tp) of the routed experts' (ep.memory.bytes_per_gpu); norms and "
    "routers counted split by tp",
    "parameters: ep.params.total (every expert) and ep.params.active (k routed experts per MoE layer); DeepSeek-V3's "
    "multi-token-prediction module not counted",
    "memory: model states only (weights, gradients, optimizer state); activations not counted",
)


@dataclass(frozen=True)
class MoEEstimate:
    """One layout's figures: ``tp``, ``ep``, ``dp``; the model's ``total_params`` and ``active_params``, its
    ``dense_params`` (outside the routed experts) and ``expert_params``; ``params_per_gpu`` and
    ``bytes_per_gpu`` (exact), ``bytes_per_param`` of the convention, and ``fits`` the GPU's usable bytes."""

    tp: int
    ep: int
    dp: int
    total_params: int
    active_params: int
    dense_params: int
    expert_params: int
    params_per_gpu: Fraction
    bytes_per_param: int
    bytes_per_gpu: int | Fraction
    fits: bool

    @property
    def label(self) -> str:
        return f"TP {self.tp} x EP {self.ep} x DP {self.dp}"


def _squash(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def resolve_moe(model: str | None = None, *, hidden_size: int | None = None, num_layers: int | None = None,
                vocab_size: int | None = None, num_heads: int | None = None, num_kv_heads: int | None = None,
                num_experts: int | None = None, experts_per_token: int | None = None, expert_ffn: int | None = None,
                dense_layers: int = 0, dense_ffn: int = 0, shared_experts: int = 0) -> tuple[str, MoEConfig] | None:
    """``(name, MoEConfig)`` for a published MoE by name (case and punctuation ignored: ``DeepSeek-V3``) or
    for explicit sizes (``num_experts`` given: every other size but ``num_kv_heads`` (default ``num_heads``)
    and the dense/shared ones required); None when ``model`` names no MoE and ``num_experts`` is None.

    Raises ConfigError naming a missing or invalid size (``num_heads`` must divide ``hidden_size``)."""
    from distcheck.parallel.ep import models

    if num_experts is None:
        if model is None:
            return None
        hits = [k for k in models.MODELS if _squash(k) == _squash(str(model))]
        return (hits[0], models.MODELS[hits[0]]) if hits else None
    if model is not None:
        raise ConfigError("model", model, "give a preset or explicit MoE sizes (--num-experts ...), not both")
    sizes = dict(hidden_size=hidden_size, num_layers=num_layers, vocab_size=vocab_size, num_heads=num_heads,
                 experts_per_token=experts_per_token, expert_ffn=expert_ffn)
    for field, value in sizes.items():
        if value is None:
            raise ConfigError(field, None, "is needed with num_experts (explicit MoE sizes)")
        check_positive_int(field, value)
    h, heads = int(hidden_size or 0), int(num_heads or 0)
    kv = heads if num_kv_heads is None else check_positive_int("num_kv_heads", num_kv_heads)
    if h % heads:
        raise ConfigError("num_heads", heads, f"must divide hidden_size={h}")
    hd = h // heads
    if dense_layers and not dense_ffn:  # a dense layer needs its FFN's size (0 is the default of no dense layer)
        raise ConfigError("dense_ffn", dense_ffn, f"must be >= 1 with dense_layers={dense_layers}")
    cfg = models.MoEConfig(vocab_size=int(vocab_size or 0), h=h, num_layers=int(num_layers or 0),
                           attention_shapes=((h, h), (h, kv * hd), (h, kv * hd), (h, h)),
                           num_experts=check_positive_int("num_experts", num_experts), k=int(experts_per_token or 0),
                           expert_ffn=int(expert_ffn or 0), dense_layers=dense_layers, dense_ffn=dense_ffn,
                           shared_experts=shared_experts)
    return f"MoE ({num_experts} experts, top-{experts_per_token})", cfg


def _bytes_per_param(convention: str) -> int:
    from distcheck.parallel.memory.reference import bytes_per_param

    c = bytes_per_param(convention)
    return c.weights + c.grads + c.master + c.momentum + c.variance


def moe_estimate(cfg: MoEConfig, hardware: Hardware, bytes_per_param: str = "mixed_adamw", *, tp: int = 1,
                 ep: int = 1) -> MoEEstimate:
    """The figures of ``cfg`` (a MoEConfig) on ``hardware`` (a :class:`distcheck.plan.Hardware`) under TP ``tp``
    x EP ``ep`` x DP ``hardware.gpus / tp`` (module doc).

    Raises ConfigError unless tp divides the GPUs, ep divides dp and the experts, and tp divides every
    tensor's last dimension (named)."""
    from distcheck.parallel.ep import models
    from distcheck.plan.estimate import form

    if not isinstance(cfg, models.MoEConfig):
        raise ConfigError("cfg", type(cfg).__name__, "must be a MoEConfig")
    tp, ep = check_positive_int("tp", tp), check_positive_int("ep", ep)
    gpus = int(hardware.gpus)
    if gpus % tp:
        raise ConfigError("tp", tp, f"must divide gpus={gpus} (dp = gpus / tp)")
    dp = gpus // tp
    if dp % ep:
        raise ConfigError("ep", ep, f"must divide dp={dp} (the ep groups lie inside data parallelism)")
    models.params_per_gpu(cfg, tp=tp, ep=ep)  # tp divides every tensor, ep the experts (raises naming which)
    dense, expert = models.params_per_gpu(cfg)
    inputs = cfg.closed_form_inputs()
    total, active = form("ep.params.total", **inputs), form("ep.params.active", k=cfg.k, **inputs)
    bpp = _bytes_per_param(bytes_per_param)
    per_gpu = form("ep.memory.bytes_per_gpu", dense_params=dense, expert_params=expert, tp=tp, ep=ep,
                   bytes_per_parameter=bpp)
    usable = hardware.usable_bytes
    return MoEEstimate(tp, ep, dp, int(total), int(active), dense, expert, Fraction(per_gpu) / bpp, bpp, per_gpu,
                       per_gpu <= usable)


def moe_plan(cfg: MoEConfig, hardware: Hardware, bytes_per_param: str = "mixed_adamw") -> list[MoEEstimate]:
    """Every valid layout (tp a divisor of the GPUs per node that divides the GPUs and every tensor, ep a
    divisor of the experts that divides dp), smallest memory per GPU first (then fewer tp, fewer ep)."""
    out = []
    gpus, per_node = int(hardware.gpus), int(hardware.gpus_per_node)
    experts = int(cfg.num_experts)
    for tp in (t for t in range(1, per_node + 1) if per_node % t == 0 and gpus % t == 0):
        for ep in (e for e in range(1, experts + 1) if experts % e == 0 and (gpus // tp) % e == 0):
            try:
                out.append(moe_estimate(cfg, hardware, bytes_per_param, tp=tp, ep=ep))
            except ConfigError:
                continue  # tp does not divide a tensor: not a layout
    return sorted(out, key=lambda e: (e.bytes_per_gpu, e.tp, e.ep))
