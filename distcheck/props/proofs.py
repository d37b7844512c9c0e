"""Symbolic proofs (sympy) of identities between closed forms, for every value of the symbols.

Symbols are declared positive integers (p, m, v, t_f, t_b, N_d, Psi, n, sizes; the
catalogue's forms declare theirs the same way, flags as integers) so simplification
may use that; ``properties/test_proofs.py`` checks the assumptions. Each proof is a function returning ``(holds, detail)``; :func:`prove_all` returns
one :class:`distcheck.report.CheckResult` row per proof (backend ``"sympy"``).

Proved:

- GPipe: ``1 - busy/total`` with total ``(m+p-1)(t_f+t_b)`` and busy ``m(t_f+t_b)``
  simplifies to ``(p-1)/(m+p-1)`` (lesson), and equals the catalogue form;
- the two bubble conventions: fraction = ratio / (1 + ratio) for gpipe, 1f1b and
  interleaved (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM", §2.2: relative to total = x / (1 + x), x relative to ideal time);
- the interleaved bubble ratio is the 1F1B ratio divided by v (Narayanan et al. 2021 §2.2.2);
- every bubble fraction tends to 0 as m -> oo;
- ZeRO: each stage reduces to the DDP baseline at N_d = 1, and stages are
  non-increasing (differences are nonnegative multiples of 1 - 1/N_d);
- ZeRO-3 communication = 1.5 x DDP (section 7);
"""

from __future__ import annotations

import sympy as sp

from distcheck.engine.proofs import PROOFS, proof, prove, prove_all

__all__ = ["PROOFS", "prove", "prove_all"]


def _get(name: str):
    from distcheck.closed_form import get

    return get(name)


def _sym(form, name: str) -> sp.Symbol:
    return form.symbols[name]


def _zero(expr) -> bool:
    return sp.simplify(expr) == 0


def gpipe_bubble_from_schedule():
    """1 - busy/total of the GPipe schedule == (p-1)/(m+p-1) == pipeline.bubble_fraction.gpipe."""
    p, m = sp.symbols("p m", integer=True, positive=True)
    t_f, t_b = sp.symbols("t_f t_b", integer=True, positive=True)  # ticks per forward / backward
    total = (m + p - 1) * t_f + (m + p - 1) * t_b  # forward phase, then backward phase (lesson)
    busy = m * (t_f + t_b)
    bubble = sp.simplify(1 - busy / total)
    ok = _zero(bubble - (p - 1) / (m + p - 1))
    form = _get("pipeline.bubble_fraction.gpipe")
    fp, fm = _sym(form, "p"), _sym(form, "m")
    ok_form = _zero(form.expr.subs({fp: p, fm: m}) - bubble)
    return ok and ok_form, f"1 - busy/total = {bubble}"


def bubble_conventions():
    """fraction = ratio / (1 + ratio) for every schedule."""
    details = []
    ok = True
    for s in ("gpipe", "1f1b", "interleaved"):
        frac, ratio = _get(f"pipeline.bubble_fraction.{s}"), _get(f"pipeline.bubble_ratio.{s}")
        subs = {ratio.symbols[k]: frac.symbols[k] for k in ratio.symbols if k in frac.symbols}
        x = ratio.expr.subs(subs)
        holds = _zero(frac.expr - x / (1 + x))
        ok &= holds
        details.append(f"{s}: {'ok' if holds else 'DIFFERS'}")
    return ok, "; ".join(details)


def interleaved_ratio_over_v():
    """bubble_ratio.interleaved == bubble_ratio.1f1b / v."""
    inter, plain = _get("pipeline.bubble_ratio.interleaved"), _get("pipeline.bubble_ratio.1f1b")
    subs = {plain.symbols[k]: inter.symbols[k] for k in plain.symbols if k in inter.symbols}
    v = inter.symbols["v"]
    return _zero(inter.expr - plain.expr.subs(subs) / v), f"{inter.expr} = ({plain.expr.subs(subs)}) / v"


def bubble_vanishes():
    """lim_{m -> oo} bubble_fraction = 0 for every schedule."""
    out = []
    for s in ("gpipe", "1f1b", "interleaved"):
        f = _get(f"pipeline.bubble_fraction.{s}")
        out.append((s, sp.limit(f.expr, f.symbols["m"], sp.oo)))
    return all(lim == 0 for _, lim in out), ", ".join(f"{s}: {lim}" for s, lim in out)


for _name, _fn in {
    "proof.pipeline.gpipe_bubble": gpipe_bubble_from_schedule,
    "proof.pipeline.conventions": bubble_conventions,
    "proof.pipeline.interleaved_over_v": interleaved_ratio_over_v,
    "proof.pipeline.bubble_vanishes": bubble_vanishes,
}.items():
    proof(_name)(_fn)
