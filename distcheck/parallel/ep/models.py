"""Parameters of mixture-of-experts decoders counted tensor by tensor, and their memory per GPU.

:func:`param_tensors` lists every weight of an MoE decoder by name and shape: the embedding (V, h) and,
unless tied, the head (h, V); per layer the attention's tensors (``attention_shapes``, given per model),
two norms (h,), then either a dense FFN of ``mlp_matrices`` matrices of h x dense_ffn or a router (h, E)
with E routed and S shared experts of ``mlp_matrices`` matrices of h x expert_ffn; the final norm (h,).
Active parameters (:func:`param_counts`) are the tensors a token reads: the same with k of the E routed
experts of each MoE layer.

Two published configurations (their ``config.json`` on the Hugging Face hub, and the papers):

* :data:`MIXTRAL_8X7B` (Jiang et al. 2024, "Mixtral of Experts", §2, Table 1: dim 4096, 32 layers, 32 heads
  of 128, 8 kv heads, hidden 14336, vocab 32000, 8 experts, top-2): 46,702,792,704 total, 12,879,925,248
  active ("47B", "13B" in §1; 46.7B / 12.9B).
* :data:`DEEPSEEK_V3` (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", §2.1, §4.2: 61 layers, the first 3
  dense (FFN 18432), hidden 7168, multi-head latent attention with 128 heads, q_lora_rank 1536, kv_lora_rank
  512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128; 256 routed experts and 1 shared of FFN
  2048, top-8; vocab 129280): 671,026,404,352 total and 37,552,282,624 active (the report's "671B total
  parameters, of which 37B are activated for each token"). Not counted: the multi-token-prediction module
  (§2.2; the hub's 685B includes its 14B) and the router's per-expert bias of the auxiliary-loss-free
  balancing (§2.1.2; 58 x 256 numbers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_positive_int

__all__ = ["MoEConfig", "MIXTRAL_8X7B", "DEEPSEEK_V3", "MODELS", "param_tensors", "param_counts", "params_per_gpu"]


@dataclass(frozen=True)
class MoEConfig:
    """An MoE decoder (module doc); ``attention_shapes`` the shapes of one layer's attention tensors.
    Raises ConfigError for a size < 1 (or < 0 for ``dense_layers``, ``dense_ffn``, ``shared_experts``),
    ``dense_layers > num_layers`` or ``k > num_experts``."""

    vocab_size: int
    h: int
    num_layers: int
    attention_shapes: tuple[tuple[int, ...], ...]
    num_experts: int
    k: int
    expert_ffn: int
    mlp_matrices: int = 3
    dense_layers: int = 0
    dense_ffn: int = 0
    shared_experts: int = 0
    tied: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "h", "num_layers", "num_experts", "k", "expert_ffn", "mlp_matrices"):
            check_positive_int(name, getattr(self, name))
        for name in ("dense_layers", "dense_ffn", "shared_experts"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ConfigError(name, getattr(self, name), "must be an integer >= 0")
        if self.dense_layers > self.num_layers:
            raise ConfigError("dense_layers", self.dense_layers, f"must be at most num_layers={self.num_layers}")
        if self.k > self.num_experts:
            raise ConfigError("k", self.k, f"must be at most num_experts={self.num_experts}")

    @property
    def attention_params(self) -> int:
        """Parameters of one layer's attention (the product of each shape, summed)."""
        total = 0
        for shape in self.attention_shapes:
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    def closed_form_inputs(self) -> dict[str, int]:
        """The inputs of ``ep.params.total`` (and, with k, ``ep.params.active``)."""
        return dict(vocab_size=self.vocab_size, h=self.h, num_layers=self.num_layers, dense_layers=self.dense_layers,
                    attention_params=self.attention_params, mlp_matrices=self.mlp_matrices,
                    expert_ffn=self.expert_ffn, dense_ffn=self.dense_ffn, num_experts=self.num_experts,
                    shared_experts=self.shared_experts, tied=int(self.tied))


_hm, _hkv = 4096, 8 * 128
#: Mixtral 8x7B (module doc)
MIXTRAL_8X7B = MoEConfig(vocab_size=32000, h=4096, num_layers=32, num_experts=8, k=2, expert_ffn=14336,
                         attention_shapes=((_hm, _hm), (_hm, _hkv), (_hm, _hkv), (_hm, _hm)))
_hd, _heads = 7168, 128
#: DeepSeek-V3 (module doc): MLA's q_a, q_a_norm, q_b, kv_a (with the rope key), kv_a_norm, kv_b, o
DEEPSEEK_V3 = MoEConfig(vocab_size=129280, h=_hd, num_layers=61, dense_layers=3, dense_ffn=18432, num_experts=256,
                        shared_experts=1, k=8, expert_ffn=2048,
                        attention_shapes=((_hd, 1536), (1536,), (1536, _heads * (128 + 64)), (_hd, 512 + 64), (512,),
                                          (512, _heads * (128 + 128)), (_heads * 128, _hd)))

#: the published configurations by name (``distcheck plan memory --model``)
MODELS = {"mixtral-8x7b": MIXTRAL_8X7B, "deepseek-v3": DEEPSEEK_V3}


def _ffn(prefix: str, h: int, f: int, m: int) -> dict[str, tuple[int, ...]]:
    names = ("gate", "up", "down")[:m] if m <= 3 else tuple(f"w{i}" for i in range(m))
    return {f"{prefix}.{n}": ((f, h) if n == "down" else (h, f)) for n in names}


def param_tensors(cfg: MoEConfig, *, active: bool = False) -> dict[str, tuple[int, ...]]:
    """Every weight's name and shape (module doc); ``active``: only k routed experts per MoE layer."""
    if not isinstance(cfg, MoEConfig):
        raise ConfigError("cfg", type(cfg).__name__, "must be a MoEConfig")
    out: dict[str, tuple[int, ...]] = {"embed": (cfg.vocab_size, cfg.h)}
    routed = cfg.k if active else cfg.num_experts
    for layer in range(cfg.num_layers):
        p = f"layers.{layer}"
        out.update({f"{p}.attn.{i}": s for i, s in enumerate(cfg.attention_shapes)})
        out[f"{p}.norm1"], out[f"{p}.norm2"] = (cfg.h,), (cfg.h,)
        if layer < cfg.dense_layers:
            out.update(_ffn(f"{p}.mlp", cfg.h, cfg.dense_ffn, cfg.mlp_matrices))
            continue
        out[f"{p}.router"] = (cfg.h, cfg.num_experts)
        for e in range(routed):
            out.update(_ffn(f"{p}.experts.{e}", cfg.h, cfg.expert_ffn, cfg.mlp_matrices))
        for e in range(cfg.shared_experts):
            out.update(_ffn(f"{p}.shared.{e}", cfg.h, cfg.expert_ffn, cfg.mlp_matrices))
    out["norm"] = (cfg.h,)
    if not cfg.tied:
        out["head"] = (cfg.h, cfg.vocab_size)
    return out


def param_counts(cfg: MoEConfig) -> tuple[int, int]:
    """``(total, active)`` parameters: the sums of :func:`param_tensors`' shapes."""
    def count(tensors: Any) -> Any:
        total = 0
        for shape in tensors.values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    return count(param_tensors(cfg)), count(param_tensors(cfg, active=True))


def params_per_gpu(cfg: MoEConfig, *, tp: int = 1, ep: int = 1) -> tuple[int, int]:
    """``(dense, expert)`` parameters one GPU holds under ep x dp x tp (Megatron-core's placement, expert tp =
    tp; dp replicates): 1/tp of every tensor, split along its last dimension, and the routed experts
    dealt E/ep to a rank (rank 0 of the ep group counted). Norms and routers are counted split too, as
    ``ep.memory.bytes_per_gpu`` states; Megatron-core keeps them whole, (2 L + 1) h + (L - dense_layers) h E
    more per GPU. ConfigError unless tp divides every tensor's last dimension and ep
    divides num_experts."""
    tp, ep = check_positive_int("tp", tp), check_positive_int("ep", ep)
    if cfg.num_experts % ep:
        raise ConfigError("ep", ep, f"must divide num_experts={cfg.num_experts}")
    dense = expert = 0
    mine = set(range(cfg.num_experts // ep))                   # rank 0 of the ep group: experts 0 .. E/ep - 1
    for name, shape in param_tensors(cfg).items():
        if shape[-1] % tp:
            raise ConfigError("tp", tp, f"must divide the last dimension of {name} {shape}")
        n = 1
        for d in shape[:-1]:
            n *= d
        n *= shape[-1] // tp
        parts = name.split(".")
        if len(parts) > 3 and parts[2] == "experts":
            expert += n if int(parts[3]) in mine else 0
        else:
            dense += n
    return dense, expert
