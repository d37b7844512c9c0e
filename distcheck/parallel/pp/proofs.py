"""Proofs (sympy) of the pipeline's closed forms, for every value of the symbols:

- GPipe: 1 - busy/total, with total (m+p-1)(t_f+t_b) and busy m(t_f+t_b), simplifies to
  (p-1)/(m+p-1) (the lesson "Scaling and distributed training", "Pipeline bubble") and equals
  the catalogue form;
- the two bubble conventions: fraction = ratio / (1 + ratio) for every schedule (Narayanan et
  al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", §2.2: relative to total = x / (1 + x), x relative to ideal time);
- the interleaved bubble ratio is the 1F1B ratio divided by v (same paper, §2.2.2);
- every bubble fraction tends to 0 as m -> oo;
- the two readings of B agree once the weight pass is counted: a bubble written with B the full
  backward (DeepSeek-V3 Table 2) at b = t_i + t_w is the one written with B the input-gradient
  pass (Qi et al. 2023, Table 2) at b = t_i, for 1F1B and ZB-H1; the 1F1B split bubble is
  ``pp.idle_ticks.1f1b`` at t_b = t_i + t_w; at equal costs ZB-H1 idles a third of 1F1B.
"""

from __future__ import annotations

import sympy as sp

from distcheck.core.vocab import Schedule
from distcheck.engine.catalogue import get
from distcheck.engine.proofs import proof, zero

__all__ = ["gpipe_bubble_from_schedule", "bubble_conventions", "interleaved_ratio_over_v", "bubble_vanishes",
           "b_readings"]


@proof("proof.pp.gpipe_bubble")
def gpipe_bubble_from_schedule() -> tuple[bool, str]:
    """1 - busy/total of the GPipe schedule == (p-1)/(m+p-1) == pp.bubble_fraction.gpipe."""
    p, m = sp.symbols("p m", integer=True, positive=True)
    t_f, t_b = sp.symbols("t_f t_b", integer=True, positive=True)  # ticks per forward / backward
    total = (m + p - 1) * t_f + (m + p - 1) * t_b  # forward phase, then backward phase (lesson)
    busy = m * (t_f + t_b)
    bubble = sp.simplify(1 - busy / total)
    ok = zero(bubble - (p - 1) / (m + p - 1))
    form = get("pp.bubble_fraction.gpipe")
    fp, fm = form.symbols["p"], form.symbols["m"]
    ok_form = zero(form.expr.subs({fp: p, fm: m}) - bubble)
    return ok and ok_form, f"1 - busy/total = {bubble}"


@proof("proof.pp.conventions")
def bubble_conventions() -> tuple[bool, str]:
    """fraction = ratio / (1 + ratio) for every schedule."""
    details = []
    ok = True
    for s in Schedule:
        frac, ratio = get(f"pp.bubble_fraction.{s}"), get(f"pp.bubble_ratio.{s}")
        subs = {ratio.symbols[k]: frac.symbols[k] for k in ratio.symbols if k in frac.symbols}
        x = ratio.expr.subs(subs)
        holds = zero(frac.expr - x / (1 + x))
        ok &= holds
        details.append(f"{s}: {'ok' if holds else 'DIFFERS'}")
    return ok, "; ".join(details)


@proof("proof.pp.interleaved_over_v")
def interleaved_ratio_over_v() -> tuple[bool, str]:
    """bubble_ratio.interleaved == bubble_ratio.1f1b / v."""
    inter = get(f"pp.bubble_ratio.{Schedule.INTERLEAVED}")
    plain = get(f"pp.bubble_ratio.{Schedule.ONE_F_ONE_B}")
    subs = {plain.symbols[k]: inter.symbols[k] for k in plain.symbols if k in inter.symbols}
    v = inter.symbols["v"]
    return zero(inter.expr - plain.expr.subs(subs) / v), f"{inter.expr} = ({plain.expr.subs(subs)}) / v"


@proof("proof.pp.bubble_vanishes")
def bubble_vanishes() -> tuple[bool, str]:
    """lim_{m -> oo} bubble_fraction = 0 for every schedule (taken as m = p + k, k -> oo: the
    regime m >= p where every schedule's forms hold)."""
    out = []
    k = sp.Symbol("k", integer=True, positive=True)
    for s in Schedule:
        f = get(f"pp.bubble_fraction.{s}")
        m, p = f.symbols["m"], f.symbols["p"]
        out.append((s, sp.limit(sp.simplify(f.expr.subs(m, p + k)), k, sp.oo)))
    return all(lim == 0 for _, lim in out), ", ".join(f"{s}: {lim}" for s, lim in out)


def _at(name: str, **values: sp.Expr) -> sp.Expr:
    """The form's expression with some inputs replaced by expressions in shared symbols."""
    f = get(name)
    return f.expr.subs({f.symbols[k]: v for k, v in values.items()})


@proof("proof.pp.b_readings")
def b_readings() -> tuple[bool, str]:
    """B full at b = t_i + t_w == B input at b = t_i (1F1B, ZB-H1); 1F1B split == idle_ticks.1f1b
    at t_b = t_i + t_w; ZB-H1 == 1F1B / 3 at t_f = t_i = t_w."""
    p, t_f, t_i, t_w, t = sp.symbols("p t_f t_i t_w t", integer=True, positive=True)
    checks = []
    for s in (Schedule.ONE_F_ONE_B, Schedule.ZB_H1):
        full = _at(f"pp.bubble_ticks.{s}.b_full", p=p, t_f=t_f, b=t_i + t_w, t_w=t_w)
        part = _at(f"pp.bubble_ticks.{s}.b_input", p=p, t_f=t_f, b=t_i, t_w=t_w)
        exact = _at(f"pp.bubble_ticks.{s}", p=p, t_f=t_f, t_i=t_i, t_w=t_w)
        checks.append((f"{s}: full = input = exact", zero(full - part) and zero(part - exact)))
    split = _at("pp.bubble_ticks.1f1b", p=p, t_f=t_f, t_i=t_i, t_w=t_w)
    whole = _at(f"pp.idle_ticks.{Schedule.ONE_F_ONE_B}", p=p, t_f=t_f, t_b=t_i + t_w)
    checks.append(("1f1b split = idle_ticks.1f1b", zero(split - whole)))
    h1 = _at("pp.bubble_ticks.zb_h1", p=p, t_f=t, t_i=t, t_w=t)
    checks.append(("zb_h1 = 1f1b / 3 at equal costs", zero(3 * h1 - split.subs({t_f: t, t_i: t, t_w: t}))))
    return all(ok for _, ok in checks), "; ".join(f"{what}: {'ok' if ok else 'DIFFERS'}" for what, ok in checks)
