"""Proofs (sympy) of ZeRO's closed forms (Rajbhandari et al. 2020, "ZeRO: Memory
Optimizations Toward Training Trillion Parameter Models", Figure 1 and §7), for every value
of the symbols:

- every stage reduces to the DDP baseline (2 + 2 + K) Psi at N_d = 1;
- stages do not increase: stage s - stage s+1 = c Psi (1 - 1/N_d) with c >= 0;
- ZeRO-3 communicates 3/2 of DDP's elements.
"""

from __future__ import annotations

import sympy as sp

from distcheck.engine.catalogue import get
from distcheck.engine.proofs import proof, zero

__all__ = ["zero_baseline_at_one", "zero_stages_non_increasing", "zero3_comm_one_and_a_half"]


@proof("proof.zero.baseline_at_one")
def zero_baseline_at_one() -> tuple[bool, str]:
    """zero.bytes_per_gpu.stage<s> at N_d = 1 == stage0 (the DDP baseline (2+2+K) Psi)."""
    base = get("zero.bytes_per_gpu.stage0")
    N = base.symbols["dp"]
    ok = True
    for s in range(4):
        f = get(f"zero.bytes_per_gpu.stage{s}")
        ok &= zero(f.expr.subs(f.symbols["dp"], 1) - base.expr.subs(N, 1))
    return ok, f"all stages reduce to {sp.simplify(base.expr.subs(N, 1))} at dp = 1"


@proof("proof.zero.non_increasing")
def zero_stages_non_increasing() -> tuple[bool, str]:
    """stage s - stage s+1 = c * Psi * (1 - 1/N_d) with c >= 0 (so >= 0 for N_d >= 1)."""
    forms = [get(f"zero.bytes_per_gpu.stage{s}") for s in range(4)]
    P, N, K = (forms[0].symbols[k] for k in ("params", "dp", "k"))
    ok, parts = True, []
    for s in range(3):
        a = forms[s].expr.subs({forms[s].symbols[k]: v for k, v in (("params", P), ("dp", N), ("k", K))})
        b = forms[s + 1].expr.subs({forms[s + 1].symbols[k]: v for k, v in (("params", P), ("dp", N), ("k", K))})
        c = sp.simplify((a - b) / (P * (1 - 1 / N)))
        holds = c.free_symbols <= {K} and (c.is_nonnegative is True)
        ok &= bool(holds)
        parts.append(f"stage{s}-stage{s + 1} = {c} Psi (1 - 1/dp)")
    return ok, "; ".join(parts)


@proof("proof.zero.comm_stage3")
def zero3_comm_one_and_a_half() -> tuple[bool, str]:
    """zero.comm_elements_per_rank.stage3 == 3/2 * zero.comm_elements_per_rank.ddp."""
    z3, ddp = get("zero.comm_elements_per_rank.stage3"), get("zero.comm_elements_per_rank.ddp")
    ratio = sp.simplify(z3.expr / ddp.expr.subs(ddp.symbols["params"], z3.symbols["params"]))
    return ratio == sp.Rational(3, 2), f"stage3 / ddp = {ratio}"
