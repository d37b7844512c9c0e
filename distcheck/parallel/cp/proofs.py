"""Proofs (sympy) between context parallelism's closed forms and those of the collectives: the ring's
forward sends what the all-gather of K and V sends, and the head-tail split gives every rank the mean
of the contiguous split's causal work."""

from __future__ import annotations

import sympy as sp

from distcheck.core.vocab import Collective
from distcheck.engine.catalogue import get
from distcheck.engine.proofs import proof, zero

__all__ = ["ring_forward_equals_all_gather", "balanced_work_is_the_mean"]


@proof("proof.cp.ring_forward_equals_all_gather")
def ring_forward_equals_all_gather() -> tuple[bool, str]:
    """cp.ring.bytes_per_rank.forward == cp.all_gather.bytes_per_rank.forward == two ring all-gathers of one
    K (V) tensor, comm.bytes_per_rank.all_gather at S = s b Hkv e B, n = cp."""
    ring, ag = get("cp.ring.bytes_per_rank.forward"), get("cp.all_gather.bytes_per_rank.forward")
    comm = get(f"comm.bytes_per_rank.{Collective.ALL_GATHER}")
    y = ring.symbols
    size = y["s"] * y["b"] * y["num_kv_heads"] * y["head_dim"] * y["bytes_per_element"]
    two = 2 * comm.expr.subs({comm.symbols["size_bytes"]: size, comm.symbols["n"]: y["cp"]})
    on = ag.expr.subs({ag.symbols[k]: y[k] for k in ag.symbols})
    ok = zero(ring.expr - on) and zero(ring.expr - two)
    return ok, f"{ring.expr} = {on} = {two}"


@proof("proof.cp.balanced_work_is_the_mean")
def balanced_work_is_the_mean() -> tuple[bool, str]:
    """sum over r of cp.causal_work.contiguous, over cp, == cp.causal_work.balanced: the head-tail split
    gives every rank the mean (and the contiguous split's total is the s (s + 1) / 2 causal pairs)."""
    contiguous, balanced = get("cp.causal_work.contiguous"), get("cp.causal_work.balanced")
    y = contiguous.symbols
    total = sp.summation(contiguous.expr, (y["rank"], 0, y["cp"] - 1))
    on = balanced.expr.subs({balanced.symbols[k]: y[k] for k in balanced.symbols})
    ok = zero(total / y["cp"] - on) and zero(total - y["s"] * (y["s"] + 1) / 2)
    return ok, f"sum_r ({contiguous.expr}) / cp = {sp.simplify(total / y['cp'])} = {on}"
