"""Closed forms for tensor parallelism (sympy).

* Column shards follow ``np.array_split``: rank ``r`` of ``tp`` gets
  ``floor((n + tp - 1 - r) / tp)`` of ``n`` output columns (``n/tp`` when ``tp | n``).
* Collective counts in the forward pass (Shoeybi et al. 2019, section 3, Fig. 3;
  lesson): a row-parallel linear ends in one all-reduce; the Megatron MLP
  (column-split up, row-split down) and attention (split by heads) need one each.
* Communication volume (Narayanan et al. 2021, "Efficient Large-Scale Language
  Model Training on GPU Clusters Using Megatron-LM", SC'21, section 3.2): per
  transformer layer, per micro-batch, per device, tensor parallelism all-reduces
  tensors of ``b*s*h`` elements twice in the forward and twice in the backward
  pass; a ring all-reduce of S elements sends ``2 (t-1)/t * S`` per device, so
  the total is ``8 b s h (t-1)/t`` ELEMENTS (the paper's count is in elements,
  not bytes). Bytes = elements times ``bytes_per_element``.
"""

from __future__ import annotations

import sympy as sp

from distcheck.closed_form import ClosedForm, Input, register

__all__ = [
    "OUTPUT_COLS_PER_SHARD",
    "ROW_ALLREDUCE_COUNT",
    "MLP_ALLREDUCE_PER_FORWARD",
    "ATTENTION_ALLREDUCE_PER_FORWARD",
    "COMM_ELEMENTS_PER_LAYER",
    "COMM_BYTES_PER_LAYER",
]

_n = Input("output_cols", "output columns of the weight being column-split", unit="elements")
_tp = Input("tp", "tensor-parallel ranks", unit="GPUs")
_rank = Input("rank", "tensor-parallel rank, 0-based", unit="", kind="nonnegative_integer", default=0)

OUTPUT_COLS_PER_SHARD = register(
    ClosedForm(
        name="tp.column.output_cols_per_shard",
        expr=sp.floor((_n.symbol + _tp.symbol - 1 - _rank.symbol) / _tp.symbol),
        inputs=(_n, _tp, _rank),
        unit="count",
        source="numpy.array_split convention; lesson (seed 000), column_parallel",
        description="output columns on rank `rank` of a column-parallel linear: floor((output_cols + tp - 1 - rank)/tp), = output_cols/tp when tp divides it",
        constraints=("0 <= rank < tp <= output_cols",),
    )
)

ROW_ALLREDUCE_COUNT = register(
    ClosedForm(
        name="tp.row.allreduce_count",
        expr=sp.Integer(1),
        inputs=(),
        unit="count",
        source="lesson (seed 000), 'Tensor parallelism: columns and rows'; Shoeybi et al. 2019, section 3",
        description="all-reduces in the forward pass of one row-parallel linear (sum of partial products)",
        constraints=("tp >= 2 (with tp = 1 the all-reduce is a no-op)",),
    )
)

MLP_ALLREDUCE_PER_FORWARD = register(
    ClosedForm(
        name="tp.mlp.allreduce_per_forward",
        expr=sp.Integer(1),
        inputs=(),
        unit="count",
        source="Shoeybi et al. 2019 (Megatron-LM), section 3, Fig. 3a; lesson (seed 000)",
        description="all-reduces in the forward pass of a tensor-parallel MLP (column-split up, row-split down)",
        constraints=("tp >= 2", "activation is elementwise"),
    )
)

ATTENTION_ALLREDUCE_PER_FORWARD = register(
    ClosedForm(
        name="tp.attention.allreduce_per_forward",
        expr=sp.Integer(1),
        inputs=(),
        unit="count",
        source="Shoeybi et al. 2019 (Megatron-LM), section 3, Fig. 3b; lesson (seed 000)",
        description="all-reduces in the forward pass of tensor-parallel attention split by heads (row-parallel output projection)",
        constraints=("tp >= 2", "tp divides num_heads and num_kv_heads"),
    )
)

_s = Input("s", "sequence length", unit="tokens")
_b = Input("b", "micro-batch size", unit="sequences")
_h = Input("h", "hidden size", unit="elements")
_t = Input("t", "tensor-parallel size", unit="GPUs")
_bpe = Input("bytes_per_element", "bytes per activation element (2 for fp16/bf16)", unit="bytes", kind="positive", default=2)

_elements = 8 * _b.symbol * _s.symbol * _h.symbol * (_t.symbol - 1) / _t.symbol

COMM_ELEMENTS_PER_LAYER = register(
    ClosedForm(
        name="tp.comm_elements_per_layer",
        expr=_elements,
        inputs=(_s, _b, _h, _t),
        unit="elements",
        source="Narayanan et al. 2021 (SC'21, Megatron-LM), section 3.2: 8bsh(t-1)/t",
        description="elements each device sends for tensor parallelism per transformer layer per micro-batch, forward + backward (4 ring all-reduces of b*s*h elements)",
        constraints=("ring all-reduce cost 2(t-1)/t per element", "no sequence parallelism"),
    )
)

COMM_BYTES_PER_LAYER = register(
    ClosedForm(
        name="tp.comm_bytes_per_layer",
        expr=_bpe.symbol * _elements,
        inputs=(_s, _b, _h, _t, _bpe),
        unit="bytes",
        source="Narayanan et al. 2021 (SC'21, Megatron-LM), section 3.2 (8bsh(t-1)/t elements) times bytes_per_element",
        description="bytes each device sends for tensor parallelism per layer per micro-batch, forward + backward: bytes_per_element * 8bsh(t-1)/t (default 2 bytes: fp16/bf16)",
        constraints=("ring all-reduce cost 2(t-1)/t per element", "no sequence parallelism"),
    )
)
