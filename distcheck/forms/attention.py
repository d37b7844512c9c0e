"""Closed forms for attention under tensor parallelism (sympy).

Megatron-LM splits attention by heads (Shoeybi et al. 2019, section 3): each of
``tp`` ranks holds ``num_heads/tp`` query heads and, with grouped-query
attention, ``num_kv_heads/tp`` KV heads. Both require ``tp`` to divide the count.
"""

from __future__ import annotations

from distcheck.core.closed_form import ClosedForm, Input, register

__all__ = ["HEADS_PER_RANK", "KV_HEADS_PER_RANK"]

_tp = Input("tp", "tensor-parallel ranks", unit="GPUs")
_heads = Input("num_heads", "query heads", unit="count")
_kv = Input("num_kv_heads", "key/value heads (GQA; = num_heads for MHA)", unit="count")

HEADS_PER_RANK = register(
    ClosedForm(
        name="attention.heads_per_rank",
        expr=_heads.symbol / _tp.symbol,
        inputs=(_heads, _tp),
        unit="count",
        source="Shoeybi et al. 2019 (Megatron-LM), section 3; lesson 'Scaling and distributed training', 'Tensor parallelism'",
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
