"""Cross-claim consistency: ``[[check]]`` tables (sum, product, equal) and the automatic
check that claims naming the same quantity with the same inputs agree.

Each printed figure becomes a :class:`~distcheck.audit.figures.Figure` in the unscaled
unit of its family (bytes, fraction, the count noun, ...), and the relation is decided
by :mod:`distcheck.audit.figures`: consistent when, for one tie-breaking rule applied
to every figure, exact values the figures stand for satisfy it (whole numbers for
counts). The explanation names the figures, what the parts combine to, and the tie
rule when the figures meet only at a tie.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

from distcheck.audit import figures as fig
from distcheck.audit import quantities as qmod
from distcheck.audit.claim_units import base_unit
from distcheck.audit.counts import FRACTIONAL_COUNT_NOUNS, is_whole_unit
from distcheck.audit.keys import AnswerKey, Check, Claim
from distcheck.audit.numbers import format_exact
from distcheck.audit.relations import relation_checks
from distcheck.core.errors import AnswerKeyError, ConfigError
from distcheck.core.validate import check_type

__all__ = ["CheckVerdict", "check_key", "figure_of"]

CONSISTENT, CONTRADICTION = "consistent", "contradiction"


@dataclass
class CheckVerdict:
    """The verdict on one consistency check (explicit ``[[check]]`` or automatic)."""

    id: str
    kind: str
    verdict: str
    claims: tuple[str, ...]
    explanation: str
    expect: str | None = None
    automatic: bool = False
    section: str = ""
    line: int | None = None


def figure_of(c: Claim) -> fig.Figure:
    """Claim ``c``'s printed figure in the unscaled unit of its family; whole when both the
    claim's unit and its quantity's unit count whole things (a claim in ``count`` of a
    quantity in ``elements`` is not). ConfigError when ``c`` is not a Claim."""
    check_type("c", c, Claim, "must be a Claim")
    f = qmod.unit_factor(base_unit(c.unit), c.unit)
    q_unit = qmod.get_quantity(c.quantity).unit
    whole = is_whole_unit(c.unit) and q_unit not in FRACTIONAL_COUNT_NOUNS
    return fig.Figure(c.claimed * f, c.step * f, whole)


def _printed(c: Claim) -> str:
    return f"{c.claimed_text} {c.unit}"


def _range(span: fig.Span, factor: Fraction, unit: str) -> str:
    lo, hi = span.lo / factor, span.hi / factor
    if lo == hi:
        return f"= {format_exact(lo, 9)} {unit}"
    return f"lies in [{format_exact(lo, 9)}, {format_exact(hi, 9)}] {unit}"


def _tie_note(out: fig.Outcome) -> str:
    if out.needs_tie_rule:
        return f" (they meet at a tie: consistent when ties are rounded {' or '.join(out.rules)})"
    return ""


def _no_common_tie(out: fig.Outcome) -> bool:
    return not out.consistent and out.meets


def _empty_note(names: Sequence[str], out: fig.Outcome) -> str:
    return "; ".join(f"{names[i]} stands for no whole number" for i in out.empty)


def _verdict(out: fig.Outcome) -> str:
    return CONSISTENT if out.consistent else CONTRADICTION


def _claim(key: AnswerKey, k: Check, cid: str) -> Claim:
    c = key.claim(cid)
    if isinstance(c.claimed, tuple):
        raise AnswerKeyError(f"check {k.id!r}: claim {cid!r} is a vector", path=key.path, line=k.line,
                             field=f"check ({k.id}).parts")
    return c


def _equal_text(labels: Sequence[str], out: fig.Outcome, agree: str, disagree: str) -> str:
    figures = ", ".join(labels)
    if out.empty:
        return f"{figures} {disagree}: {_empty_note(labels, out)}"
    if out.consistent:
        return f"{figures} {agree} within their rounding{_tie_note(out)}"
    if _no_common_tie(out):
        return (f"{figures} {disagree}: their ranges meet only at a tie that no one rounding rule "
                f"({', '.join(fig.TIE_RULES)}) prints as every figure")
    return f"{figures} {disagree}"


def _check_equal(k: Check, key: AnswerKey) -> CheckVerdict:
    figures, labels, families = [], [], set()
    for p in k.parts:
        if isinstance(p, str):
            c = _claim(key, k, p)
            families.add(qmod.unit_family(c.unit))
            figures.append(figure_of(c))
            labels.append(p)
        else:
            figures.append(fig.Figure(p))
            labels.append(format_exact(p))
    if len(families) > 1:
        raise AnswerKeyError(f"check {k.id!r}: parts are in different units ({', '.join(sorted(map(str, families)))})",
                             path=key.path, line=k.line, field=f"check ({k.id}).parts")
    out = fig.check_equal(figures)
    ids = tuple(p for p in k.parts if isinstance(p, str))
    return CheckVerdict(k.id, k.kind, _verdict(out), ids, _equal_text(labels, out, "agree", "disagree"), k.expect,
                        section=k.section, line=k.line)


def _check_total(k: Check, key: AnswerKey) -> CheckVerdict:
    if k.total is None:  # keys.validate_data gives every sum and product check a total
        raise AnswerKeyError(f"check {k.id!r}: a {k.kind} check needs a total", path=key.path, line=k.line,
                             field=f"check ({k.id}).total")
    total = _claim(key, k, k.total)
    t_fig = figure_of(total)
    t_factor = qmod.unit_factor(base_unit(total.unit), total.unit)
    parts, terms = [], []
    for p in k.parts:
        if isinstance(p, str):
            c = _claim(key, k, p)
            if k.kind == "sum" and qmod.unit_family(c.unit) != qmod.unit_family(total.unit):
                raise AnswerKeyError(f"check {k.id!r}: part {p!r} is in {c.unit}, the total in {total.unit}",
                                     path=key.path, line=k.line, field=f"check ({k.id}).parts")
            if k.kind == "product" and c.claimed < 0:
                raise AnswerKeyError(f"check {k.id!r}: part {p!r} is negative ({c.claimed_text}); a product check "
                                     "multiplies figures >= 0", path=key.path, line=k.line,
                                     field=f"check ({k.id}).parts")
            parts.append(figure_of(c))
            terms.append(_printed(c))
        else:
            # a literal part of a sum is in the total's unit (a count if the total is one); of a product, a factor
            if k.kind == "product" and p < 0:
                raise AnswerKeyError(f"check {k.id!r}: part {format_exact(p)} is negative; a product check "
                                     "multiplies figures >= 0", path=key.path, line=k.line,
                                     field=f"check ({k.id}).parts")
            parts.append(fig.Figure(p * t_factor, whole=t_fig.whole) if k.kind == "sum" else fig.Figure(p))
            terms.append(format_exact(p))
    if k.kind == "product" and total.claimed < 0:
        raise AnswerKeyError(f"check {k.id!r}: the total {total.claimed_text} is negative; a product check "
                             "multiplies figures >= 0", path=key.path, line=k.line, field=f"check ({k.id}).total")
    try:
        out = fig.check_sum(t_fig, parts) if k.kind == "sum" else fig.check_product(t_fig, parts)
    except ConfigError as exc:
        raise AnswerKeyError(f"check {k.id!r}: {exc}", path=key.path, line=k.line, field=f"check ({k.id}).parts") \
            from None
    op = " + " if k.kind == "sum" else " x "
    names = [f"the total {_printed(total)}", *terms]
    shown = f"{op.join(terms)}"
    if out.empty:
        why = f"{shown}: {_empty_note(names, out)}"
    else:
        whole = " (whole numbers)" if t_fig.whole else ""
        combined = f" {_range(out.combined, t_factor, total.unit)}{whole}" if out.combined is not None else ""
        if out.consistent:
            tail = f"the total {_printed(total)} is within it{_tie_note(out)}"
        elif _no_common_tie(out):
            tail = (f"the total {_printed(total)} meets it only at a tie that no one rounding rule "
                    f"({', '.join(fig.TIE_RULES)}) prints as every figure")
        else:
            tail = f"the total {_printed(total)} is not"
        why = f"{shown}{combined}; {tail}"
    ids = tuple(p for p in k.parts if isinstance(p, str)) + (k.total,)
    return CheckVerdict(k.id, k.kind, _verdict(out), ids, why, k.expect, section=k.section, line=k.line)


def _defaults(quantity: str) -> dict[str, str]:
    q = qmod.get_quantity(quantity)
    out = {i.name: str(Fraction(str(i.default))) for i in q.inputs if i.default is not None}
    if quantity.startswith("layout."):
        from distcheck.audit.layout_order import DEFAULT

        out["order"] = DEFAULT  # the order a claim that states none is read under
    return out


def _automatic(key: AnswerKey, recomputed: Sequence[tuple[Claim, dict[str, str]]]) -> list[CheckVerdict]:
    """Claims naming the same quantity with the same resolved inputs must agree."""
    covered = {frozenset(p for p in k.parts if isinstance(p, str)) for k in key.checks if k.kind == "equal"}
    groups: dict[tuple, list[Claim]] = {}
    for c, inputs in recomputed:
        if isinstance(c.claimed, tuple):
            continue
        # a figure in bytes of a quantity in elements (a declared unit bridge) is compared with figures in bytes
        sig = (c.quantity, qmod.unit_family(c.unit), tuple(sorted({**_defaults(c.quantity), **inputs}.items())))
        groups.setdefault(sig, []).append(c)
    out = []
    for (qname, _, _), cs in groups.items():
        ids = tuple(c.id for c in cs)
        if len(cs) < 2 or frozenset(ids) in covered:
            continue
        result = fig.check_equal([figure_of(c) for c in cs])
        labels = [f"{c.id} = {_printed(c)}" for c in cs]
        why = f"same quantity {qname} and inputs: " + _equal_text(labels, result, "agree", "contradict each other")
        out.append(CheckVerdict("auto:" + "=".join(ids), "equal", _verdict(result), ids, why, automatic=True))
    return out


def check_key(key: AnswerKey, recomputed: Sequence[tuple[Claim, dict[str, str]]]) -> list[CheckVerdict]:
    """One CheckVerdict per ``[[check]]`` of ``key``, then one per automatic group among
    ``recomputed``: the claims whose value was recomputed, each with its resolved inputs
    (``{name: exact value as text}``), grouped by quantity and inputs with defaults filled.
    Raises AnswerKeyError for a check the figures cannot enter (a vector, mixed units in a
    sum or equal check, a negative factor), ConfigError for arguments of the wrong type."""
    check_type("key", key, AnswerKey, "must be an AnswerKey")
    explicit = [_check_equal(k, key) if k.kind == "equal" else _check_total(k, key) for k in key.checks]
    related = [replace(_check_equal(k, key) if k.kind == "equal" else _check_total(k, key), automatic=True)
               for k in relation_checks(key, recomputed)]
    return explicit + _automatic(key, recomputed) + related
