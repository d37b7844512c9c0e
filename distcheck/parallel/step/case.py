"""One example of the ``training-step`` contract and the data it stands for (numpy only).

A :class:`StepCase` holds the composition (:class:`~distcheck.parallel.step.reference.StepLayout`), the tiny
decoder's sizes, the micro-batches, the non-ignored length of every sequence, the clipping threshold, the
learning rate, the number of steps and a seed; :func:`weights` and :func:`batch` turn it into the float64
weights and the token and label arrays every rank and the reference use. Its ``repr`` is the
counterexample a failing property prints: it names every mesh axis of the dense step, those at 1 included (cp
and ep, with ep's placement, when drawn above 1), the model (MoE, RoPE), whether clipping binds, and the
precision when it is not float64 (``precision=bf16-fsdp``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distcheck.parallel.step.model import IGNORE_INDEX, TinyConfig
from distcheck.parallel.step.reference import StepLayout

__all__ = ["StepCase", "weights", "batch", "BINDING_MAX_NORM", "FREE_MAX_NORM"]

#: a threshold below every drawn gradient norm (clipping binds; checked against the reference's norm)
BINDING_MAX_NORM = 2.0**-6
#: a threshold above every drawn gradient norm (clipping leaves the gradients alone)
FREE_MAX_NORM = 2.0**20


@dataclass(frozen=True)
class StepCase:
    """``layout``; ``config`` (the model's: a :class:`TinyConfig` drawn for the layout, or the config object a
    :class:`~distcheck.parallel.step.hooks.StepTarget` carries for its own model; token ids are drawn below its
    ``vocab_size``); ``microbatches`` (m per dp rank) of ``micro_batch_size``
    sequences of ``seq_len`` tokens; ``lengths[step][dp index][micro-batch][sequence]``, the non-ignored
    tokens of each (right-padded, labels -100 after them); ``max_norm``; ``lr``; ``seed`` (weights and token
    ids); ``schedule`` (the ``torch.distributed.pipelining`` schedule, a ``Schedule`` name, when pp > 1);
    ``target`` (the resolved ``StepTarget`` the case was drawn for, a picklable ``Target``, or None: the contract's
    check runs the reference with its model factory and its ``batch`` and ``loss`` hooks; not compared, not
    shown)."""

    layout: StepLayout
    config: TinyConfig | Any
    microbatches: int
    micro_batch_size: int
    seq_len: int
    lengths: tuple
    max_norm: float
    lr: float
    seed: int
    schedule: str = ""
    target: Any = field(default=None, compare=False, repr=False)

    @property
    def steps(self) -> int:
        return len(self.lengths)

    @property
    def clip_binds(self) -> bool:
        return self.max_norm == BINDING_MAX_NORM

    def tokens_per_step(self) -> list[int]:
        return [int(sum(sum(sum(mb) for mb in rank) for rank in step)) for step in self.lengths]

    @property
    def precision(self) -> str:
        """The precision the case is certified in (its layout's: ``float64``, ``float32``, ``bf16-fsdp``,
        ``bf16-autocast``)."""
        return self.layout.precision

    def composition(self) -> str:
        """``dp_replicate=1, dp_shard=2, tp=1, pp=1, m=2, clip binds``: every dense-step axis, those at 1 included,
        cp and ep (with ep's placement: ``ep=2 (torchtitan)``) when above 1, and the precision when it is not
        float64 (``..., clip binds, precision=bf16-fsdp``)."""
        pp = f", schedule={self.schedule}" if self.layout.pp > 1 else ""
        prec = "" if self.precision == "float64" else f", precision={self.precision}"
        return f"{self.layout}{pp}, m={self.microbatches}, clip {'binds' if self.clip_binds else 'free'}{prec}"

    def __repr__(self) -> str:
        c = self.config
        kept = [[[list(mb) for mb in rank] for rank in step] for step in self.lengths]
        if isinstance(c, TinyConfig):
            sizes = (f"dim={c.dim}, layers={c.n_layers}, heads={c.n_heads}/{c.n_kv_heads} (q/kv), "
                     f"head_dim={c.head_dim}, ffn={c.ffn_dim}, vocab={c.vocab_size}, "
                     f"{'tied' if c.tied else 'untied'} head{_moe(c)}{', rope' if c.rope else ''}")
        else:
            sizes = f"model config {c!r}"
        return (f"StepCase({self.composition()}; {self.steps} steps, lr={self.lr:g}, max_norm={self.max_norm:g}; "
                f"{self.microbatches} micro-batches of {self.micro_batch_size} x {self.seq_len} tokens per dp rank, "
                f"kept lengths [step][dp rank][micro-batch] {kept}; {sizes}; seed={self.seed})")


def _moe(c: TinyConfig) -> str:
    return (f", MoE of {c.n_experts} experts top-{c.top_k} + 1 shared, aux weight {c.aux_loss_weight:g}"
            if c.n_experts else "")


def weights(case: StepCase) -> dict[str, np.ndarray]:
    """The tiny decoder's float64 weights, by ``named_parameters()`` name (the tied head once, as the embedding):
    embeddings N(0, 1/2^2), linear weights (the router's and every expert's too) N(0, 1/fan_in), norm weights
    1 + N(0, 1/10^2)."""
    c = case.config
    rng = np.random.default_rng(case.seed)
    out: dict[str, np.ndarray] = {"tok_embeddings.weight": 0.5 * rng.standard_normal((c.vocab_size, c.dim))}

    def lin(name: str, out_f: int, in_f: int) -> None:
        out[name] = rng.standard_normal((out_f, in_f)) / np.sqrt(in_f)

    for i in range(c.n_layers):
        p = f"layers.{i}."
        out[p + "attention_norm.weight"] = 1 + 0.1 * rng.standard_normal(c.dim)
        lin(p + "attention.wq.weight", c.n_heads * c.head_dim, c.dim)
        lin(p + "attention.wk.weight", c.n_kv_heads * c.head_dim, c.dim)
        lin(p + "attention.wv.weight", c.n_kv_heads * c.head_dim, c.dim)
        lin(p + "attention.wo.weight", c.dim, c.n_heads * c.head_dim)
        out[p + "ffn_norm.weight"] = 1 + 0.1 * rng.standard_normal(c.dim)
        mlp = p + ("moe.shared_expert." if getattr(c, "n_experts", 0) else "feed_forward.")
        lin(mlp + "w1.weight", c.ffn_dim, c.dim)
        lin(mlp + "w2.weight", c.dim, c.ffn_dim)
        lin(mlp + "w3.weight", c.ffn_dim, c.dim)
        if getattr(c, "n_experts", 0):
            E = c.n_experts
            lin(p + "moe.router.gate.weight", E, c.dim)
            out[p + "moe.experts.w1"] = rng.standard_normal((E, c.ffn_dim, c.dim)) / np.sqrt(c.dim)
            out[p + "moe.experts.w2"] = rng.standard_normal((E, c.dim, c.ffn_dim)) / np.sqrt(c.ffn_dim)
            out[p + "moe.experts.w3"] = rng.standard_normal((E, c.ffn_dim, c.dim)) / np.sqrt(c.dim)
    out["norm.weight"] = 1 + 0.1 * rng.standard_normal(c.dim)
    if not c.tied:
        lin("output.weight", c.vocab_size, c.dim)
    return out


def batch(case: StepCase) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, labels)``, int64 arrays of shape ``(steps, dp, m, micro_batch_size, seq_len)``: token ids
    drawn from the seed below ``case.config.vocab_size``, labels the ids of the next draw with -100 after each
    sequence's length (a causal language model's batch: ``labels[..., i]`` is position i's target)."""
    rng = np.random.default_rng(case.seed + 1)
    shape = (case.steps, case.layout.dp, case.microbatches, case.micro_batch_size, case.seq_len)
    tokens = rng.integers(0, case.config.vocab_size, shape)
    labels = rng.integers(0, case.config.vocab_size, shape)
    lengths = np.array(case.lengths).reshape(shape[:-1])
    labels[np.arange(case.seq_len) >= lengths[..., None]] = IGNORE_INDEX
    return tokens, labels
