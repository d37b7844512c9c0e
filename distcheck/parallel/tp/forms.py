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
* Attention is split by heads (Shoeybi et al. 2019, section 3): each of ``tp`` ranks holds
  ``num_heads/tp`` query heads and, with grouped-query attention, ``num_kv_heads/tp`` KV
  heads (``attention.*``). Both require ``tp`` to divide the count.
"""

from __future__ import annotations

import sympy as sp

from distcheck.core.closed_form import ClosedForm, Input, register

__all__ = [
    "OUTPUT_COLS_PER_SHARD",
    "INPUT_ROWS_PER_SHARD",
    "ROW_ALLREDUCE_COUNT",
    "MLP_ALLREDUCE_PER_FORWARD",
    "ATTENTION_ALLREDUCE_PER_FORWARD",
    "COMM_ELEMENTS_PER_LAYER",
    "COMM_BYTES_PER_LAYER",
    "HEADS_PER_RANK",
    "KV_HEADS_PER_RANK",
]

_tp = Input("tp", "tensor-parallel ranks", unit="GPUs")
_rank = Input("rank", "tensor-parallel rank, 0-based", unit="", kind="nonnegative_integer", default=0)


def _array_split_form(name: str, size: Input, what: str, layer: str) -> ClosedForm:
    """Rank ``rank``'s share of ``size`` under ``np.array_split``: floor((size + tp - 1 - rank)/tp)."""
    n = size.symbol
    return register(
        ClosedForm(
            name=name,
            expr=sp.floor((n + _tp.symbol - 1 - _rank.symbol) / _tp.symbol),
            inputs=(size, _tp, _rank),
            unit="count",
            source=f"numpy.array_split convention (the first {size.name} % tp ranks get one extra); "
                   f"lesson 'Scaling and distributed training', {layer}",
            description=f"{what} on rank `rank` of a {layer.replace('_', '-')} linear: "
            f"floor(({size.name} + tp - 1 - rank)/tp), = {size.name}/tp when tp divides it",
            constraints=(f"0 <= rank < tp <= {size.name}",),
        )
    )


OUTPUT_COLS_PER_SHARD = _array_split_form(
    "tp.column.output_cols_per_shard",
    Input("output_cols", "output columns of the weight being column-split", unit="elements"),
    "output columns", "column_parallel",
)
INPUT_ROWS_PER_SHARD = _array_split_form(
    "tp.row.input_rows_per_shard",
    Input("input_rows", "input rows (d_in) of the weight being row-split", unit="elements"),
    "input rows (and matching input features)", "row_parallel",
)

ROW_ALLREDUCE_COUNT = register(
    ClosedForm(
        name="tp.row.allreduce_count",
        expr=sp.Integer(1),
        inputs=(),
        unit="count",
        source="lesson 'Scaling and distributed training', 'Tensor parallelism: columns and rows'; "
               "Shoeybi et al. 2019, section 3",
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
        source="Shoeybi et al. 2019 (Megatron-LM), section 3, Fig. 3a; lesson 'Scaling and distributed training'",
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
        source="Shoeybi et al. 2019 (Megatron-LM), section 3, Fig. 3b; lesson 'Scaling and distributed training'",
        description="all-reduces in the forward pass of tensor-parallel attention split by heads "
                    "(row-parallel output projection)",
        constraints=("tp >= 2", "tp divides num_heads and num_kv_heads"),
    )
)

_s = Input("s", "sequence length", unit="tokens")
_b = Input("b", "micro-batch size", unit="sequences")
_h = Input("h", "hidden size", unit="elements")
_t = Input("t", "tensor-parallel size", unit="GPUs")
_bpe = Input("bytes_per_element", "bytes per activation element (2 for fp16/bf16)", unit="bytes", kind="positive",
             default=2)

_elements = 8 * _b.symbol * _s.symbol * _h.symbol * (_t.symbol - 1) / _t.symbol

COMM_ELEMENTS_PER_LAYER = register(
    ClosedForm(
        name="tp.comm_elements_per_layer",
        expr=_elements,
        inputs=(_s, _b, _h, _t),
        unit="elements",
        source="Narayanan et al. 2021 (SC'21, Megatron-LM), section 3.2: 8bsh(t-1)/t",
        description="elements each device sends for tensor parallelism per transformer layer per micro-batch, "
                    "forward + backward (4 ring all-reduces of b*s*h elements)",
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
        description="bytes each device sends for tensor parallelism per layer per micro-batch, forward + backward: "
                    "bytes_per_element * 8bsh(t-1)/t (default 2 bytes: fp16/bf16)",
        constraints=("ring all-reduce cost 2(t-1)/t per element", "no sequence parallelism"),
    )
)


# ----------------------------------------------------------------------------- attention split by heads

_heads = Input("num_heads", "query heads", unit="count")
_kv = Input("num_kv_heads", "key/value heads (GQA; = num_heads for MHA)", unit="count")

HEADS_PER_RANK = register(
    ClosedForm(
        name="attention.heads_per_rank",
        expr=_heads.symbol / _tp.symbol,
        inputs=(_heads, _tp),
        unit="count",
        source="Shoeybi et al. 2019 (Megatron-LM), section 3; "
               "lesson 'Scaling and distributed training', 'Tensor parallelism'",
        description="query heads held by each tensor-parallel rank: num_heads/tp",
        constraints=("tp divides num_heads",),
    )
)

KV_HEADS_PER_RANK = register(
    ClosedForm(
        name="attention.kv_heads_per_rank",
        expr=_kv.symbol / _tp.symbol,
        inputs=(_kv, _tp),
        unit="count",
        source="Shoeybi et al. 2019 (Megatron-LM), section 3, with GQA (Ainslie et al. 2023)",
        description="key/value heads held by each tensor-parallel rank: num_kv_heads/tp (no KV replication)",
        constraints=("tp divides num_kv_heads", "num_kv_heads divides num_heads"),
    )
)
