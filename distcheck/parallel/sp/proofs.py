"""Proofs (sympy) of sequence parallelism's closed forms against those of other packages: it sends
what tensor parallelism's all-reduce sends, and it saves Table 2's difference of rows."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distcheck.core.closed_form import ClosedForm
from distcheck.core.vocab import Collective
from distcheck.engine.catalogue import get
from distcheck.engine.proofs import proof, zero

if TYPE_CHECKING:
    import sympy

__all__ = ["bytes_equal_all_reduce", "activations_saved"]


@proof("proof.sp.bytes_equal_all_reduce")
def bytes_equal_all_reduce() -> tuple[bool, str]:
    """sp.block.bytes_per_rank == comm.bytes_per_rank.all_reduce, n = t: no extra bandwidth."""
    sp_bytes, ar = get("sp.block.bytes_per_rank"), get(f"comm.bytes_per_rank.{Collective.ALL_REDUCE}")
    on = ar.expr.subs({ar.symbols["n"]: sp_bytes.symbols["t"],
                       ar.symbols["size_bytes"]: sp_bytes.symbols["size_bytes"]})
    return zero(sp_bytes.expr - on), f"{sp_bytes.expr} = {on}"


@proof("proof.sp.activations")
def activations_saved() -> tuple[bool, str]:
    """activations.bytes_per_layer.tp - activations.bytes_per_layer.tp_sp == sp.activations.bytes_saved_per_layer
    (Table 2: sequence parallelism splits the 10 s b h of layer norms and dropouts over t ranks)."""
    tp_row, sp_row = get("activations.bytes_per_layer.tp"), get("activations.bytes_per_layer.tp_sp")
    saved = get("sp.activations.bytes_saved_per_layer")

    def on(f: ClosedForm) -> sympy.Expr:
        return f.expr.subs({f.symbols[k]: tp_row.symbols[k] for k in f.symbols})

    return zero(on(tp_row) - on(sp_row) - on(saved)), f"{on(tp_row)} - ({on(sp_row)}) = {on(saved)}"
