"""Proofs (sympy) between expert parallelism's closed forms and those of the collectives: each of the MoE
layer's four all-to-alls sends what nccl-tests' all-to-all sends for one rank's (E, C, h) buffer, and at a
capacity factor of 1 and k = E the buffer holds exactly the k T choices of the rank."""

from __future__ import annotations

from typing import Any

from distcheck.core.vocab import Collective
from distcheck.engine.catalogue import get
from distcheck.engine.proofs import proof, zero

__all__ = ["all_to_alls_are_comm_all_to_all"]


@proof("proof.ep.all_to_alls_are_comm_all_to_all")
def all_to_alls_are_comm_all_to_all() -> Any:
    """ep.{dispatch,combine}.bytes_per_rank.{forward,backward} == comm.bytes_per_rank.all_to_all at
    S = E C h B, n = ep; and E ep.capacity == k T at capacity_factor = 1 and k = E (no slot padded)."""
    comm = get(f"comm.bytes_per_rank.{Collective.ALL_TO_ALL}")
    first = get("ep.dispatch.bytes_per_rank.forward")
    y = first.symbols
    size = y["num_experts"] * y["capacity"] * y["h"] * y["bytes_per_element"]
    want = comm.expr.subs({comm.symbols["size_bytes"]: size, comm.symbols["n"]: y["ep"]})
    ok = True
    for name in ("dispatch.bytes_per_rank.forward", "combine.bytes_per_rank.forward",
                 "combine.bytes_per_rank.backward", "dispatch.bytes_per_rank.backward"):
        form = get(f"ep.{name}")
        ok = ok and zero(form.expr.subs({form.symbols[s]: y[s] for s in form.symbols}) - want)
    cap = get("ep.capacity")
    c = cap.symbols
    m = c["num_experts"] * c["tokens"]                      # k T = E m: divisible by E
    even = cap.expr.subs({c["capacity_factor"]: 1, c["tokens"]: m, c["k"]: c["num_experts"]})
    ok = ok and zero(c["num_experts"] * even - c["num_experts"] * m)
    return ok, f"{first.expr} = {want}; E ceil(k T / E) = k T at k = E"
