"""The tiny Llama-style decoder distcheck ships for the ``training-step`` contract (torch, built lazily).

Module names follow torchtitan's Llama (``tok_embeddings``, ``layers.<i>.attention_norm``,
``layers.<i>.attention.{wq,wk,wv,wo}``, ``layers.<i>.ffn_norm``, ``layers.<i>.feed_forward.{w1,w2,w3}``,
``norm``, ``output``), so a torchtitan tensor-parallel plan applies to it unchanged:

* ``tok_embeddings``: ``nn.Embedding(vocab_size, dim)``;
* a pre-norm block, ``h = x + attention(attention_norm(x))``, ``out = h + feed_forward(ffn_norm(h))``;
* ``nn.RMSNorm(dim, eps=NORM_EPS)`` (Zhang and Sennrich 2019, "Root Mean Square Layer Normalization");
* causal grouped-query attention, no bias (Ainslie et al. 2023, "GQA"): ``n_heads`` query heads share
  ``n_kv_heads`` key/value heads; the heads are read off the projections' widths (``view(b, s, -1,
  head_dim)``), so a column-parallel ``wq``/``wk``/``wv`` leaves each rank its own heads;
* the SwiGLU MLP ``w2(silu(w1 x) * w3 x)`` (Shazeer 2020, "GLU Variants Improve Transformer");
* ``output``: ``nn.Linear(dim, vocab_size, bias=False)``, its weight tied to the embedding's when
  ``tied`` (Press and Wolf 2017, "Using the Output Embedding to Improve Language Models").

No positional encoding: the decoder is causal and the sequences are right-padded, so a padded
position changes no earlier token. Shapes: tokens ``(b, s)`` int64, logits ``(b, s, vocab_size)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["NORM_EPS", "TinyConfig", "build_model", "token_loss_sum", "IGNORE_INDEX", "pipeline_stage", "stage_of"]

#: RMSNorm's epsilon
NORM_EPS = 1e-6
#: labels equal to it are padding: no loss, no token counted (``F.cross_entropy``'s default)
IGNORE_INDEX = -100


@dataclass(frozen=True)
class TinyConfig:
    """Sizes of the tiny decoder: ``dim`` (hidden size), ``n_layers``, ``n_heads``, ``n_kv_heads``
    (dividing ``n_heads``), ``head_dim``, ``ffn_dim`` (SwiGLU width), ``vocab_size``, ``tied``."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    tied: bool


def _classes() -> tuple[type, Any]:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self, cfg: TinyConfig) -> None:
            super().__init__()
            self.head_dim, self.n_rep = cfg.head_dim, cfg.n_heads // cfg.n_kv_heads
            self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
            self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
            self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
            self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
            k = self.wk(x).view(b, s, -1, self.head_dim).repeat_interleave(self.n_rep, dim=2).transpose(1, 2)
            v = self.wv(x).view(b, s, -1, self.head_dim).repeat_interleave(self.n_rep, dim=2).transpose(1, 2)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.wo(out.transpose(1, 2).contiguous().view(b, s, -1))

    class FeedForward(nn.Module):
        def __init__(self, cfg: TinyConfig) -> None:
            super().__init__()
            self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
            self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)
            self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class TransformerBlock(nn.Module):
        def __init__(self, cfg: TinyConfig) -> None:
            super().__init__()
            self.attention_norm = nn.RMSNorm(cfg.dim, eps=NORM_EPS)
            self.attention = Attention(cfg)
            self.ffn_norm = nn.RMSNorm(cfg.dim, eps=NORM_EPS)
            self.feed_forward = FeedForward(cfg)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x + self.attention(self.attention_norm(x))
            return h + self.feed_forward(self.ffn_norm(h))

    class TinyLlama(nn.Module):
        def __init__(self, cfg: TinyConfig) -> None:
            super().__init__()
            self.config = cfg
            self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
            self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in range(cfg.n_layers)})
            self.norm = nn.RMSNorm(cfg.dim, eps=NORM_EPS)
            self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
            if cfg.tied:
                self.output.weight = self.tok_embeddings.weight

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            # a pipeline stage (pipeline_stage) lacks the embedding (it takes hidden states) or the head
            h = tokens if self.tok_embeddings is None else self.tok_embeddings(tokens)
            for layer in self.layers.values():
                h = layer(h)
            return h if self.output is None else self.output(self.norm(h))

    return TinyLlama, torch


_CACHE: dict = {}


def build_model(cfg: TinyConfig, weights: dict | None = None, *, device: Any = "cpu", dtype: str = "float64") -> Any:
    """The decoder of ``cfg`` on ``device`` with parameters of ``dtype`` (a torch dtype's name, default float64);
    ``weights`` (``name -> numpy array``, the names of ``named_parameters()``, tied weights once under
    ``tok_embeddings.weight``) are copied in when given (rounded to ``dtype``)."""
    if not _CACHE:
        _CACHE["cls"], _CACHE["torch"] = _classes()
    torch = _CACHE["torch"]
    model = _CACHE["cls"](cfg).to(dtype=getattr(torch, dtype), device=device)
    if weights is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(torch.from_numpy(weights[name]))
    return model


def token_loss_sum(logits: Any, labels: Any) -> Any:
    """The sum of the per-token cross-entropies over the non-ignored labels (``reduction="sum"``), in the logits'
    dtype, at least float32: bf16 logits are cast to float32 first (torchtitan's ``cross_entropy_loss``)."""
    import torch
    import torch.nn.functional as F

    if logits.dtype in (torch.bfloat16, torch.float16):
        logits = logits.float()
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")


def stage_of(name: str, n_layers: int, pp: int) -> int:
    """The pipeline stage holding parameter ``name`` when ``n_layers`` layers are split over ``pp`` stages in
    equal contiguous runs (torchtitan's ``pipeline_llama`` split): the embedding on the first, the final
    norm and the head on the last, layer i on ``i // (n_layers // pp)``."""
    if name.startswith("layers."):
        return int(name.split(".")[1]) // (n_layers // pp)
    return 0 if name.startswith("tok_embeddings.") else pp - 1


def pipeline_stage(model: Any, stage: int, pp: int) -> Any:
    """``model`` (a decoder of :func:`build_model`, untied) cut in place to pipeline stage ``stage`` of ``pp``:
    the layers of other stages deleted, the embedding set to None off the first stage, the final norm and
    the head off the last (torchtitan's ``pipeline_llama``: each stage's model is the whole model with what
    it does not run removed). Returns ``model``. Raises ConfigError for a tied head over several stages or a
    layer count that ``pp`` does not divide."""
    from distcheck.core.errors import ConfigError

    cfg = model.config
    if pp > 1 and cfg.tied:
        raise ConfigError("tied", True, "must be False under pipeline parallelism (the embedding and the head sit on "
                                        "different stages)")
    if cfg.n_layers % pp:
        raise ConfigError("n_layers", cfg.n_layers, f"must be a multiple of pp = {pp}")
    for key in list(model.layers.keys()):
        if stage_of(f"layers.{key}.", cfg.n_layers, pp) != stage:
            del model.layers[key]
    if stage != 0:
        model.tok_embeddings = None
    if stage != pp - 1:
        model.norm, model.output = None, None
    return model
