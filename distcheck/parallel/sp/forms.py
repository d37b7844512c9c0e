"""Closed forms of sequence parallelism (sympy only).

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198), §4.2.2 and Figure 5: in a transformer layer under tensor + sequence
parallelism each block's forward has one all-gather (g, before the column-parallel linear) and one
reduce-scatter (g-bar, after the row-parallel linear) where tensor parallelism had one all-reduce;
the backward has the conjugates. A ring reduce-scatter and a ring all-gather of the same S bytes
send what a ring all-reduce sends (nccl-tests doc/PERFORMANCE.md), so sequence parallelism costs no
extra bandwidth (``proof.sp.bytes_equal_all_reduce``). What it saves is memory: the layer norms' and
dropouts' activations, 10 s b h bytes per layer in 16-bit training (Table 2), are split over the t
ranks (``proof.sp.activations``).
"""

from __future__ import annotations

import sympy as sp

from distcheck.core.closed_form import ClosedForm, Input, register

__all__ = ["ALL_GATHERS_PER_FORWARD", "REDUCE_SCATTERS_PER_FORWARD", "BYTES_PER_RANK", "ACTIVATION_BYTES_SAVED"]

_FIG5 = "Korthikanti et al. 2022 (arXiv:2205.05198) §4.2.2, Figure 5 (operators g and g-bar)"

ALL_GATHERS_PER_FORWARD = register(ClosedForm(
    name="sp.block.all_gathers_per_forward",
    expr=sp.Integer(1),
    inputs=(),
    unit="collectives",
    source=_FIG5,
    description="all-gathers of the sequence shards per MLP or attention block forward (g, before the "
                "column-parallel linear); the backward has one reduce-scatter in its place",
))

REDUCE_SCATTERS_PER_FORWARD = register(ClosedForm(
    name="sp.block.reduce_scatters_per_forward",
    expr=sp.Integer(1),
    inputs=(),
    unit="collectives",
    source=_FIG5,
    description="reduce-scatters to the sequence shards per MLP or attention block forward (g-bar, after "
                "the row-parallel linear, in place of tensor parallelism's all-reduce); the backward has one "
                "all-gather in its place",
))

_S = Input("size_bytes", "S, the block's full output (s b h elements times their bytes)", "bytes",
           kind="nonnegative_integer")
_t = Input("t", "tensor-parallel size (the sequence is split over the same ranks)", "GPUs")
S, t = _S.symbol, _t.symbol

BYTES_PER_RANK = register(ClosedForm(
    name="sp.block.bytes_per_rank",
    expr=(t - 1) / t * S + (t - 1) / t * S,
    inputs=(_S, _t),
    unit="bytes",
    source=f"{_FIG5}; nccl-tests doc/PERFORMANCE.md (ring reduce-scatter and all-gather)",
    description="bytes each rank sends per block forward: a ring reduce-scatter plus a ring all-gather of the "
                "S-byte output, (t-1)/t S each",
))

_s = Input("s", "sequence length", "tokens")
_b = Input("b", "micro-batch size", "sequences")
_h = Input("h", "hidden size", "elements")
s, b, h = _s.symbol, _b.symbol, _h.symbol

ACTIVATION_BYTES_SAVED = register(ClosedForm(
    name="sp.activations.bytes_saved_per_layer",
    expr=10 * s * b * h * (1 - 1 / t),
    inputs=(_s, _b, _h, _t),
    unit="bytes",
    source="Korthikanti et al. 2022 (arXiv:2205.05198) §4.2.2 and Table 2",
    description="activation bytes per layer per GPU that sequence parallelism saves over tensor parallelism "
                "alone: the layer norms' inputs (2 x 2sbh) and the dropouts' masks and outputs (2 x 3sbh), "
                "10 s b h, split over t ranks",
))
