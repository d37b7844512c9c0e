"""A user's own GPT-2-style decoder (learned positions, LayerNorm, GELU MLP, tied head) with its own
parallelize function, certified by the ``training-step`` contract against the same model on one device::

    distcheck certify examples.my_gpt:TARGET --contract training-step --world-sizes 2,4

The file has three parts: the model (written as a user would, nothing of distcheck in it), the plan (tensor
parallelism with ``parallelize_module`` on ``mesh["tp"]``, sequence parallel LayerNorms, the head re-tied to
the embedding, then FSDP2's ``fully_shard`` over ``mesh["dp_replicate", "dp_shard"]``), and the glue distcheck
needs: 3 lines (the part after ``# --- glue``; tests/test_step_own_model.py counts them).

The plan, as torchtitan's Llama plan adapted to GPT-2: the token embedding row-parallel, its output the
sequence shard; the position embedding row-parallel too (its rows are the positions), its output sharded the
same way on the sequence (dim 0 of the ``(s, n_embd)`` lookup); every LayerNorm ``SequenceParallel`` (its
weight and bias replicated DTensors, their gradients summed over the tp ranks' sequence shards); q, k, v and
``c_fc`` column-parallel (their biases sharded with their rows), ``c_proj`` row-parallel (its bias added once,
after the reduction) reduce-scattering to the sequence shard; the head column-parallel from the sequence shard
to replicated logits. ``parallelize_module`` gives the head and the embedding each a DTensor of its own, so the
tie is made again (both ``Shard(0)`` over the vocabulary). It gives no ``pipeline`` hook, so pp is not drawn
(docs/CERTIFY.md, "Your pipeline split", shows one).
FSDP2 takes the mixed-precision policy of the precision certified (``layout.precision``: bf16 compute with fp32
reductions under ``bf16-fsdp``), so the same target certifies in float32 and bf16 mixed precision::

    distcheck certify examples.my_gpt:TARGET --contract training-step --world-sizes 2,4 --dtypes float32,bfloat16
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

# --- the model -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 32
    block_size: int = 16
    n_embd: int = 16
    n_head: int = 4
    n_layer: int = 2


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.head_dim = cfg.n_embd // cfg.n_head
        self.q = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.k = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.v = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied head
        for name, p in self.named_parameters():  # GPT-2's initialisation
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))
            elif p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# --- the plan --------------------------------------------------------------------------------------------------


def apply_tp(model: GPT, tp_mesh, *, norms: bool = True, retie: bool = True) -> None:
    """Tensor and sequence parallelism on ``tp_mesh``; ``norms=False`` leaves the LayerNorms off the plan and
    ``retie=False`` leaves the head untied (examples/gpt_mutants.py)."""
    sp = SequenceParallel() if norms else None
    gathered = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    parallelize_module(model, tp_mesh, {
        "wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "wpe": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0)),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        **({"ln_f": sp} if sp else {}),
    })
    for block in model.h:
        parallelize_module(block, tp_mesh, {
            **({"ln_1": sp, "ln_2": sp} if sp else {}),
            "attn": gathered, "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.c_proj": RowwiseParallel(output_layouts=Shard(1)),
            "mlp": gathered, "mlp.c_fc": ColwiseParallel(), "mlp.c_proj": RowwiseParallel(output_layouts=Shard(1)),
        })
    if retie:  # parallelize_module gave the head and the embedding a DTensor each: tie them again
        model.lm_head.weight = model.wte.weight


def mp_policy(layout) -> MixedPrecisionPolicy:
    """bf16 compute with fp32 master weights and fp32 gradient reductions when the layout's precision is
    ``bf16-fsdp``; no casting otherwise."""
    if layout.precision == "bf16-fsdp":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def apply_fsdp(model: GPT, dp_mesh, mp: MixedPrecisionPolicy | None = None) -> GPT:
    """FSDP2 on every block, then on the root, with the mixed-precision policy ``mp`` (default: none)."""
    mp = mp or MixedPrecisionPolicy()
    for block in model.h:
        fully_shard(block, mesh=dp_mesh, mp_policy=mp)
    return fully_shard(model, mesh=dp_mesh, mp_policy=mp)


def parallelize(model: GPT, mesh, layout) -> GPT:
    """``parallelize(model, mesh, layout) -> model``: tp on ``mesh["tp"]``, FSDP2 on the dp sub-mesh with the
    layout's mixed-precision policy."""
    if layout.tp > 1:
        apply_tp(model, mesh["tp"])
    return apply_fsdp(model, mesh["dp_replicate", "dp_shard"], mp_policy(layout))


# --- glue: what distcheck needs (3 lines) ------------------------------------------------------------------------

from distcheck.parallel.step import StepTarget  # noqa: E402

CONFIG = GPTConfig()
TARGET = StepTarget(parallelize, model=GPT, config=CONFIG)
