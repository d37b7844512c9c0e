"""Proofs (sympy) of the collectives' volumes: a ring all-reduce sends exactly what a
reduce-scatter and an all-gather of the same tensor send (nccl-tests doc/PERFORMANCE.md)."""

from __future__ import annotations

import sympy as sp

from distcheck.core.closed_form import ClosedForm
from distcheck.core.vocab import Collective
from distcheck.engine.catalogue import get
from distcheck.engine.proofs import proof, zero

__all__ = ["all_reduce_is_rs_plus_ag"]


@proof("proof.comm.all_reduce")
def all_reduce_is_rs_plus_ag() -> tuple[bool, str]:
    """comm.bytes_per_rank.all_reduce == reduce_scatter + all_gather (ring)."""
    ar, rs, ag = (get(f"comm.bytes_per_rank.{c}")
                  for c in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER))

    def on(f: ClosedForm) -> sp.Expr:
        return f.expr.subs({f.symbols[k]: ar.symbols[k] for k in f.symbols})

    return zero(on(ar) - on(rs) - on(ag)), f"{ar.expr} = {on(rs)} + {on(ag)}"
