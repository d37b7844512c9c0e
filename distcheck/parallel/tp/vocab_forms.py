"""Closed forms for the vocab-parallel embedding and cross-entropy (sympy): the collectives of one
forward, their size in elements, and the bytes each rank sends.

* **Embedding** (Shoeybi et al. 2019, "Megatron-LM", §3: the embedding table is split along the
  vocabulary and the partial lookups are summed): one all-reduce of the ``b s h`` output in the
  forward, none in the backward (the ids have no gradient, the table's gradient is local).
* **Cross-entropy** (the same section: the output GEMM is fused with the cross-entropy, so ranks
  exchange ``b s`` scalars instead of ``b s v`` logits; Megatron-LM's and fairscale's
  ``vocab_parallel_cross_entropy``): three all-reduces of ``b s`` values in the forward (the max, the
  target logit, the sum of exponentials), none in the backward.
* Bytes per rank: a ring all-reduce of S bytes over t ranks sends ``2 (t-1)/t S`` from each rank
  (``comm.bytes_per_rank.all_reduce``; nccl-tests doc/PERFORMANCE.md, ring algorithms).
"""

from __future__ import annotations

import sympy as sp

from distcheck.core.closed_form import ClosedForm, Input, register

__all__ = [
    "EMBEDDING_ALLREDUCE_PER_FORWARD",
    "EMBEDDING_ALLREDUCE_ELEMENTS",
    "EMBEDDING_BYTES_PER_RANK",
    "CROSS_ENTROPY_ALLREDUCE_PER_FORWARD",
    "CROSS_ENTROPY_ALLREDUCE_ELEMENTS",
    "CROSS_ENTROPY_BYTES_PER_RANK",
]

_PAPER = "Shoeybi et al. 2019 (Megatron-LM), section 3"
_CE_SOURCE = (f"{_PAPER} (output GEMM fused with the cross-entropy: b x s values exchanged); Megatron-LM's and "
              "fairscale's vocab_parallel_cross_entropy (max, target logit and sum of exponentials all-reduced)")
_RING = "ring all-reduce 2 (t-1)/t S per rank (nccl-tests doc/PERFORMANCE.md, as comm.bytes_per_rank.all_reduce)"

_s = Input("s", "sequence length", unit="tokens")
_b = Input("b", "micro-batch size", unit="sequences")
_h = Input("h", "embedding dim (hidden size)", unit="elements")
_t = Input("t", "tensor-parallel size", unit="GPUs")
_bpe = Input("bytes_per_element", "bytes per element (2 for bf16)", unit="bytes", kind="positive", default=2)

EMBEDDING_ALLREDUCE_PER_FORWARD = register(ClosedForm(
    name="tp.vocab_embedding.allreduce_per_forward",
    expr=sp.Integer(1),
    inputs=(),
    unit="count",
    source=f"{_PAPER} (embedding split along the vocabulary, partial lookups summed)",
    description="all-reduces in the forward of a vocab-parallel embedding (the masked partial lookups summed); "
                "none in the backward",
    constraints=("t >= 2",),
))

EMBEDDING_ALLREDUCE_ELEMENTS = register(ClosedForm(
    name="tp.vocab_embedding.allreduce_elements",
    expr=_b.symbol * _s.symbol * _h.symbol,
    inputs=(_b, _s, _h),
    unit="elements",
    source=f"{_PAPER}",
    description="elements of the tensor the vocab-parallel embedding all-reduces: its whole output, b s h",
))

EMBEDDING_BYTES_PER_RANK = register(ClosedForm(
    name="tp.vocab_embedding.bytes_per_rank",
    expr=2 * (_t.symbol - 1) / _t.symbol * _b.symbol * _s.symbol * _h.symbol * _bpe.symbol,
    inputs=(_b, _s, _h, _t, _bpe),
    unit="bytes",
    source=f"{_PAPER}; {_RING}",
    description="bytes each rank sends in the forward of a vocab-parallel embedding: one ring all-reduce of "
                "b s h elements, 2 (t-1)/t b s h bytes_per_element",
    constraints=("t >= 1",),
))

CROSS_ENTROPY_ALLREDUCE_PER_FORWARD = register(ClosedForm(
    name="tp.vocab_cross_entropy.allreduce_per_forward",
    expr=sp.Integer(3),
    inputs=(),
    unit="count",
    source=_CE_SOURCE,
    description="all-reduces in the forward of a vocab-parallel cross-entropy: the max (MAX), the target logit "
                "(SUM) and the sum of exponentials (SUM); none in the backward",
    constraints=("t >= 2",),
))

CROSS_ENTROPY_ALLREDUCE_ELEMENTS = register(ClosedForm(
    name="tp.vocab_cross_entropy.allreduce_elements",
    expr=_b.symbol * _s.symbol,
    inputs=(_b, _s),
    unit="elements",
    source=_CE_SOURCE,
    description="elements of each all-reduce of a vocab-parallel cross-entropy: one value per token, b s",
))

CROSS_ENTROPY_BYTES_PER_RANK = register(ClosedForm(
    name="tp.vocab_cross_entropy.bytes_per_rank",
    expr=3 * 2 * (_t.symbol - 1) / _t.symbol * _b.symbol * _s.symbol * _bpe.symbol,
    inputs=(_b, _s, _t, _bpe),
    unit="bytes",
    source=f"{_CE_SOURCE}; {_RING}",
    description="bytes each rank sends in the forward of a vocab-parallel cross-entropy: three ring all-reduces "
                "of b s elements, 6 (t-1)/t b s bytes_per_element (instead of the b s v logits)",
    constraints=("t >= 1",),
))
