"""Proofs (sympy) of the pipeline's closed forms, for every value of the symbols:

- GPipe: 1 - busy/total, with total (m+p-1)(t_f+t_b) and busy m(t_f+t_b), simplifies to
  (p-1)/(m+p-1) (the lesson "Scaling and distributed training", "Pipeline bubble") and equals
  the catalogue form;
- the two bubble conventions: fraction = ratio / (1 + ratio) for every schedule (Narayanan et
  al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", §2.2: relative to total = x / (1 + x), x relative to ideal time);
- the interleaved bubble ratio is the 1F1B ratio divided by v (same paper, §2.2.2);
- every bubble fraction tends to 0 as m -> oo.
"""

from __future__ import annotations

import sympy as sp

from distcheck.core.vocab import Schedule
from distcheck.engine.catalogue import get
from distcheck.engine.proofs import proof, zero

__all__ = ["gpipe_bubble_from_schedule", "bubble_conventions", "interleaved_ratio_over_v", "bubble_vanishes"]


@proof("proof.pipeline.gpipe_bubble")
def gpipe_bubble_from_schedule():
    """1 - busy/total of the GPipe schedule == (p-1)/(m+p-1) == pipeline.bubble_fraction.gpipe."""
    p, m = sp.symbols("p m", integer=True, positive=True)
    t_f, t_b = sp.symbols("t_f t_b", integer=True, positive=True)  # ticks per forward / backward
    total = (m + p - 1) * t_f + (m + p - 1) * t_b  # forward phase, then backward phase (lesson)
    busy = m * (t_f + t_b)
    bubble = sp.simplify(1 - busy / total)
    ok = zero(bubble - (p - 1) / (m + p - 1))
    form = get("pipeline.bubble_fraction.gpipe")
    fp, fm = form.symbols["p"], form.symbols["m"]
    ok_form = zero(form.expr.subs({fp: p, fm: m}) - bubble)
    return ok and ok_form, f"1 - busy/total = {bubble}"


@proof("proof.pipeline.conventions")
def bubble_conventions():
    """fraction = ratio / (1 + ratio) for every schedule."""
    details = []
    ok = True
    for s in Schedule:
        frac, ratio = get(f"pipeline.bubble_fraction.{s}"), get(f"pipeline.bubble_ratio.{s}")
        subs = {ratio.symbols[k]: frac.symbols[k] for k in ratio.symbols if k in frac.symbols}
        x = ratio.expr.subs(subs)
        holds = zero(frac.expr - x / (1 + x))
        ok &= holds
        details.append(f"{s}: {'ok' if holds else 'DIFFERS'}")
    return ok, "; ".join(details)


@proof("proof.pipeline.interleaved_over_v")
def interleaved_ratio_over_v():
    """bubble_ratio.interleaved == bubble_ratio.1f1b / v."""
    inter = get(f"pipeline.bubble_ratio.{Schedule.INTERLEAVED}")
    plain = get(f"pipeline.bubble_ratio.{Schedule.ONE_F_ONE_B}")
    subs = {plain.symbols[k]: inter.symbols[k] for k in plain.symbols if k in inter.symbols}
    v = inter.symbols["v"]
    return zero(inter.expr - plain.expr.subs(subs) / v), f"{inter.expr} = ({plain.expr.subs(subs)}) / v"


@proof("proof.pipeline.bubble_vanishes")
def bubble_vanishes():
    """lim_{m -> oo} bubble_fraction = 0 for every schedule (taken as m = p + k, k -> oo: the
    regime m >= p where every schedule's forms hold)."""
    out = []
    k = sp.Symbol("k", integer=True, positive=True)
    for s in Schedule:
        f = get(f"pipeline.bubble_fraction.{s}")
        m, p = f.symbols["m"], f.symbols["p"]
        out.append((s, sp.limit(sp.simplify(f.expr.subs(m, p + k)), k, sp.oo)))
    return all(lim == 0 for _, lim in out), ", ".join(f"{s}: {lim}" for s, lim in out)
