"""The tiny Llama-style decoder distcheck ships for the ``training-step`` contract (torch, built lazily).

Module names follow torchtitan's Llama (``tok_embeddings``, ``layers.<i>.attention_norm``,
``layers.<i>.attention.{wq,wk,wv,wo}``, ``layers.<i>.ffn_norm``, ``layers.<i>.feed_forward.{w1,w2,w3}``,
``norm``, ``output``), so a torchtitan tensor-parallel plan applies to it unchanged:

* ``tok_embeddings``: ``nn.Embedding(vocab_size, dim)``;
* a pre-norm block, ``h = x + attention(attention_norm(x))``, ``out = h + feed_forward(ffn_norm(h))``;
* ``nn.RMSNorm(dim, eps=NORM_EPS)`` (Zhang and Sennrich 2019, "Root Mean Square Layer Normalization");
* causal grouped-query attention, no bias (Ainslie et al. 2023, "GQA"): ``n_heads`` query heads share
  ``n_kv_heads`` key/value heads; the heads are read off the projections' widths (``view(b, s, -1,
  head_dim)``), so a column-parallel ``wq``/``wk``/``wv`` leaves each rank its own heads. The attention itself
  is the module's ``core(q, k, v) -> out`` (q, k, v ``(b, heads, s, head_dim)``, the kv heads already repeated;
  default :func:`causal_attention`, ``F.scaled_dot_product_attention(is_causal=True)``): a context-parallel
  composition replaces it by one over its cp ranks (a ring on this rank's head-tail chunks);
* the SwiGLU MLP ``w2(silu(w1 x) * w3 x)`` (Shazeer 2020, "GLU Variants Improve Transformer");
* ``output``: ``nn.Linear(dim, vocab_size, bias=False)``, its weight tied to the embedding's when
  ``tied`` (Press and Wolf 2017, "Using the Output Embedding to Improve Language Models").

Positions: with ``rope`` the queries and keys are rotated by their positions (RoPE, Su et al. 2021,
"RoFormer", §3.4.2, the rotate-half pairing of Hugging Face's Llama, theta 10000): ``forward(tokens,
positions=None)``, ``positions`` the global positions of the ``s`` tokens given (default ``0 .. s-1``; a
context-parallel rank passes those of its chunks). Without ``rope`` the decoder has no positional encoding:
it is causal and the sequences are right-padded, so a padded position changes no earlier token.

**Mixture of experts** (``n_experts > 0``): every block's MLP is a ``moe`` (:class:`MoE` below, torchtitan's
``MoE`` and DeepSeek-V3's, DeepSeek-AI 2024, arXiv:2412.19437, §2.1.2): dropless token-choice top-k routing
(``router.gate``, ``nn.Linear(dim, n_experts)``; the softmax over the experts, then the k largest, the gates
those probabilities: :data:`distcheck.core.vocab.Router` ``softmax_then_topk``), the routed experts as three
``(E, ...)`` weights (``experts.w1`` ``(E, ffn_dim, dim)``, ``w2`` ``(E, dim, ffn_dim)``, ``w3``; torchtitan's
``GroupedExperts``) run on the tokens sorted by expert, each expert's output times its gate, plus one shared
expert (``shared_expert``, a SwiGLU MLP of ``ffn_dim``) on every token. The experts module is called as
``experts(x_sorted, counts)`` (``counts[e]`` the tokens of expert e, ``x_sorted`` in expert order): an
expert-parallel composition wraps it, dispatching the rows to the ranks holding their experts and back (an
all-to-all with variable split sizes) and handing it its local experts' counts; weights that are DTensors
are read as their local experts (``to_local()``).

The load-balancing loss (Switch Transformers, Fedus et al. 2021, eq. 4-6, generalised to top-k as
:func:`distcheck.parallel.ep.reference.aux_loss`): ``E sum_e f_e P_e`` over the tokens of the global micro-batch
(every data-parallel and context-parallel rank's tokens of that micro-batch, padding included: the router
routes every position), ``f_e`` the share of the ``T k`` choices routed to e, ``P_e`` the mean probability of
e. Each MoE module keeps, after its forward, ``aux``: this rank's share, ``E sum_e f_e (sum of its tokens'
probabilities of e) / T`` with the counts and T summed over ``aux_group`` (a process group, None: this
device's tokens are the whole micro-batch), so the shares of the ranks add up to the loss; and ``routing``:
``(probs (T, E), experts (T, k))`` of its tokens. :func:`load_balance_loss` is the model's
``aux_loss_weight * sum of its MoE layers' aux``: the step adds it, divided by the micro-batches, to each
micro-batch's loss.

Shapes: tokens ``(b, s)`` int64, logits ``(b, s, vocab_size)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["NORM_EPS", "ROPE_THETA", "TinyConfig", "build_model", "token_loss_sum", "IGNORE_INDEX", "pipeline_stage",
           "stage_of", "stages_of", "TIED_NAMES", "causal_attention", "rotary", "load_balance_loss", "moe_layers"]

#: RMSNorm's epsilon
NORM_EPS = 1e-6
#: RoPE's base (Su et al. 2021; Llama's 10000)
ROPE_THETA = 10000.0
#: labels equal to it are padding: no loss, no token counted (``F.cross_entropy``'s default)
IGNORE_INDEX = -100


@dataclass(frozen=True)
class TinyConfig:
    """Sizes of the tiny decoder: ``dim`` (hidden size), ``n_layers``, ``n_heads``, ``n_kv_heads``
    (dividing ``n_heads``), ``head_dim`` (even under ``rope``), ``ffn_dim`` (SwiGLU width, of the dense MLP, of
    each expert and of the shared expert), ``vocab_size``, ``tied``; ``n_experts`` (0: dense MLPs; else every
    block's MLP is a mixture of that many routed experts and one shared expert), ``top_k`` (experts per token,
    at most ``n_experts``), ``aux_loss_weight`` (the load-balancing loss's coefficient; Switch Transformers'
    alpha = 0.01), ``rope`` (rotary position embeddings on the queries and keys)."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    tied: bool
    n_experts: int = 0
    top_k: int = 1
    aux_loss_weight: float = 0.01
    rope: bool = False


def causal_attention(q: Any, k: Any, v: Any) -> Any:
    """The default attention ``core``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` on
    ``(b, heads, s, head_dim)`` tensors (scale ``1/sqrt(head_dim)``)."""
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def rotary(x: Any, positions: Any) -> Any:
    """RoPE on ``x`` ``(b, s, heads, head_dim)`` at ``positions`` ``(s,)`` (module doc): the pairs ``(x_i,
    x_{i + head_dim/2})`` rotated by ``position * ROPE_THETA^(-2i/head_dim)``."""
    import torch

    half = x.shape[-1] // 2
    freqs = ROPE_THETA ** (-torch.arange(half, dtype=x.dtype, device=x.device) / half)
    angle = positions.to(device=x.device, dtype=x.dtype)[:, None] * freqs[None, :]
    cos, sin = angle.cos()[None, :, None, :], angle.sin()[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def _moe_class(FeedForward: type) -> type:
    """The MoE module (module doc), its shared expert a ``FeedForward``."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    class Router(nn.Module):
        def __init__(self, cfg: TinyConfig) -> None:
            super().__init__()
            self.gate = nn.Linear(cfg.dim, cfg.n_experts, bias=False)

    class GroupedExperts(nn.Module):
        def __init__(self, cfg: TinyConfig) -> None:
            super().__init__()
            E, f, d = cfg.n_experts, cfg.ffn_dim, cfg.dim
            # nn.Linear's default scale, fan_in^-1/2 (the step loads its own weights: case.weights)
            self.w1 = nn.Parameter(torch.randn(E, f, d) / d**0.5)
            self.w2 = nn.Parameter(torch.randn(E, d, f) / f**0.5)
            self.w3 = nn.Parameter(torch.randn(E, f, d) / d**0.5)

        def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
            # the local experts: all of them, or this rank's E/ep under expert parallelism (DTensor Shard(0))
            w1, w2, w3 = (w.to_local() if hasattr(w, "to_local") else w for w in (self.w1, self.w2, self.w3))
            outs = [(F.silu(xe @ w1[e].T) * (xe @ w3[e].T)) @ w2[e].T
                    for e, xe in enumerate(torch.split(x, [int(c) for c in counts]))]
            return torch.cat(outs)

    class MoE(nn.Module):
        def __init__(self, cfg: TinyConfig) -> None:
            super().__init__()
            self.n_experts, self.top_k, self.aux_weight = cfg.n_experts, cfg.top_k, cfg.aux_loss_weight
            self.router = Router(cfg)
            self.experts = GroupedExperts(cfg)
            self.shared_expert = FeedForward(cfg)
            self.aux_group: Any = None
            self.aux: torch.Tensor | None = None
            self.routing: tuple | None = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, d = x.shape
            flat = x.reshape(-1, d)
            probs = F.softmax(self.router.gate(flat), dim=-1)                 # (T, E)
            gates, chosen = torch.topk(probs, self.top_k, dim=-1)             # (T, k), largest first
            self.routing = (probs, chosen)
            self.aux = self._aux(probs, chosen)
            order = torch.argsort(chosen.reshape(-1), stable=True)            # the T k choices in expert order
            counts = torch.bincount(chosen.reshape(-1), minlength=self.n_experts)
            token = order // self.top_k
            routed = self.experts(flat[token], counts) * gates.reshape(-1)[order, None]
            return self.shared_expert(flat).index_add(0, token, routed).reshape(b, s, d)

        def _aux(self, probs: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
            E = self.n_experts
            stats = torch.cat([torch.bincount(chosen.reshape(-1), minlength=E).to(probs.dtype),
                               probs.new_tensor([probs.shape[0]])])
            if self.aux_group is not None:
                dist.all_reduce(stats, group=self.aux_group)
            f = stats[:E] / (stats[E] * self.top_k)
            return E * torch.sum(f * probs.sum(dim=0) / stats[E])

    return MoE


def _classes() -> tuple[type, Any]:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self, cfg: TinyConfig) -> None:
            super().__init__()
            self.head_dim, self.n_rep, self.rope = cfg.head_dim, cfg.n_heads // cfg.n_kv_heads, cfg.rope
            self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
            self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
            self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
            self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
            self.core = causal_attention

        def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
            b, s, _ = x.shape
            q = self.wq(x).view(b, s, -1, self.head_dim)
            k = self.wk(x).view(b, s, -1, self.head_dim)
            if self.rope:
                pos = torch.arange(s, device=x.device) if positions is None else positions
                q, k = rotary(q, pos), rotary(k, pos)
            q = q.transpose(1, 2)
            k = k.repeat_interleave(self.n_rep, dim=2).transpose(1, 2)
            v = self.wv(x).view(b, s, -1, self.head_dim).repeat_interleave(self.n_rep, dim=2).transpose(1, 2)
            out = self.core(q, k, v)
            return self.wo(out.transpose(1, 2).contiguous().view(b, s, -1))

    class FeedForward(nn.Module):
        def __init__(self, cfg: TinyConfig) -> None:
            super().__init__()
            self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
            self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)
            self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    MoE = _moe_class(FeedForward)

    class TransformerBlock(nn.Module):
        def __init__(self, cfg: TinyConfig) -> None:
            super().__init__()
            self.attention_norm = nn.RMSNorm(cfg.dim, eps=NORM_EPS)
            self.attention = Attention(cfg)
            self.ffn_norm = nn.RMSNorm(cfg.dim, eps=NORM_EPS)
            if cfg.n_experts:
                self.moe = MoE(cfg)
            else:
                self.feed_forward = FeedForward(cfg)

        def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
            h = x + self.attention(self.attention_norm(x), positions=positions)
            mlp = self.moe if hasattr(self, "moe") else self.feed_forward
            return h + mlp(self.ffn_norm(h))

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

        def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
            # a pipeline stage (pipeline_stage) lacks the embedding (it takes hidden states) or the head
            h = tokens if self.tok_embeddings is None else self.tok_embeddings(tokens)
            for layer in self.layers.values():
                h = layer(h, positions=positions)
            return h if self.output is None else self.output(self.norm(h))

    return TinyLlama, torch


def moe_layers(model: Any) -> list:
    """The MoE modules of ``model`` (those with a ``router`` and ``experts``), in module order."""
    return [m for m in model.modules() if hasattr(m, "router") and hasattr(m, "experts") and hasattr(m, "aux")]


def load_balance_loss(model: Any) -> Any:
    """``sum over the MoE layers of aux_weight * aux`` of the last forward (this rank's share: module doc); 0.0
    for a model without MoE layers."""
    total: Any = 0.0
    for m in moe_layers(model):
        if m.aux is not None:
            total = total + m.aux_weight * m.aux
    return total


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


#: a tied head's two names: the embedding's (the reference's, ``named_parameters()`` listing a tied weight once)
#: and the head's (the name of the copy the last pipeline stage holds under pp > 1)
TIED_NAMES = ("tok_embeddings.weight", "output.weight")


def stages_of(name: str, cfg: TinyConfig, pp: int) -> set[int]:
    """The pipeline stages holding a copy of parameter ``name`` (:func:`stage_of`), the last stage too for the
    embedding of a tied head under pp > 1 (its copy on the last stage, :func:`pipeline_stage`)."""
    tied = cfg.tied and pp > 1 and name == TIED_NAMES[0]
    return {stage_of(name, cfg.n_layers, pp)} | ({pp - 1} if tied else set())


def pipeline_stage(model: Any, stage: int, pp: int) -> Any:
    """``model`` (a decoder of :func:`build_model`) cut in place to pipeline stage ``stage`` of ``pp``: the layers
    of other stages deleted, the embedding set to None off the first stage, the final norm and the head off the
    last (torchtitan's ``pipeline_llama``: each stage's model is the whole model with what it does not run
    removed). A tied head under pp > 1 becomes two copies of one weight, the embedding's on the first stage and
    the head's on the last (Megatron-LM's shared embedding: each stage builds its own copy, equal at the start),
    whose gradients the target must sum over the first and last stage every step (Megatron's embedding group;
    :func:`~distcheck.parallel.step.hooks.tied_embedding_clip`). Returns ``model``. Raises ConfigError for a layer
    count that ``pp`` does not divide."""
    from distcheck.core.errors import ConfigError

    cfg = model.config
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
