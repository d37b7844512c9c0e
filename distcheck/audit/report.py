"""Audit reports: a rich terminal table, Markdown and JSON, for one or several AuditResults.

Every function takes an :class:`~distcheck.audit.verdict.AuditResult` or a list of
them and returns text (``render_table`` prints when given a console).
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from distcheck.audit.numbers import format_exact
from distcheck.audit.rounded_inputs import RoundingReading
from distcheck.audit.verdict import AuditResult, ClaimVerdict
from distcheck.core.validate import check_choice, check_type

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["render_table", "to_markdown", "to_json", "to_dict", "render", "render_quantity_list"]

_STYLE = {
    "holds": "green", "holds-through-input-rounding": "yellow", "wrong": "bold red",
    "holds-under-another-convention": "cyan", "ambiguous": "yellow",
    "not-checkable": "dim", "consistent": "green", "contradiction": "bold red",
}


#: the report formats of :func:`render`
FORMATS = ("table", "markdown", "json")


def _list(results: AuditResult | Sequence[AuditResult]) -> list[AuditResult]:
    """``results`` as a list of AuditResults; ConfigError for anything else."""
    if isinstance(results, AuditResult):
        return [results]
    check_type("results", results, (list, tuple), "must be an AuditResult or a list of them")
    for i, r in enumerate(results):
        check_type(f"results[{i}]", r, AuditResult, "must be an AuditResult (see audit_file)")
    return list(results)


def _value(v: ClaimVerdict) -> str:
    """The recomputed value in the claim's unit, with the unit (``"141.107413 GB"``)."""
    x = v.computed_in_unit
    if x is None:
        return "-"
    if isinstance(x, tuple):
        return "[" + ", ".join(format_exact(a, 6) for a in x) + f"] {v.claim.unit}"
    return f"{format_exact(x, 9)} {v.claim.unit}"


def _summary(r: AuditResult) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(r.counts().items())) or "no claims"


def render_table(results: AuditResult | Sequence[AuditResult], console: Console | None = None) -> str:
    """Print one rich table per key (claim, quantity, printed, recomputed, verdict, explanation)
    and its consistency checks; return the text printed."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    own = console is None
    buf = io.StringIO()
    console = console or Console(file=buf, width=200, force_terminal=False, color_system=None)
    for r in _list(results):
        table = Table(title=escape(f"{r.title} ({r.path})"), show_lines=False)
        columns: tuple[tuple[str, dict[str, Any]], ...] = (
            ("claim", {}), ("quantity", {}), ("printed", {"justify": "right"}), ("recomputed", {"justify": "right"}),
            ("verdict", {}), ("explanation", {"overflow": "fold"}))
        for col, kw in columns:
            table.add_column(col, **kw)
        for v in r.claims:
            st = _STYLE.get(v.verdict, "")
            table.add_row(escape(v.claim.id), v.claim.quantity, escape(f"{v.claim.claimed_text} {v.claim.unit}"),
                          escape(_value(v)), f"[{st}]{v.verdict}[/]", escape(_explanation(v)))
        console.print(table)
        if r.checks:
            ct = Table(title=f"consistency ({r.path})")
            for col in ("check", "kind", "claims", "verdict", "explanation"):
                ct.add_column(col, overflow="fold")
            for c in r.checks:
                st = _STYLE.get(c.verdict, "")
                ct.add_row(escape(c.id), c.kind, escape(", ".join(c.claims)), f"[{st}]{c.verdict}[/]",
                           escape(c.explanation))
            console.print(ct)
        console.print(escape(f"{r.path}: {_summary(r)}"))
    return buf.getvalue() if own else ""


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(results: AuditResult | Sequence[AuditResult]) -> str:
    """A Markdown report: one section per key, a claims table and a consistency table."""
    out: list[str] = []
    for r in _list(results):
        out.append(f"## {_md_escape(r.title)}")
        out.append("")
        out.append(f"Source: {_md_escape(r.source)}  ")
        out.append(f"Key: `{r.path}`  ")
        out.append(f"Summary: {_summary(r)}")
        out.append("")
        out.append("| claim | quantity | printed | recomputed | verdict | explanation |")
        out.append("|---|---|---:|---:|---|---|")
        for v in r.claims:
            out.append("| " + " | ".join(_md_escape(x) for x in (
                f"`{v.claim.id}`", f"`{v.claim.quantity}`", f"{v.claim.claimed_text} {v.claim.unit}", _value(v),
                f"**{v.verdict}**", _explanation(v))) + " |")
        if r.checks:
            out.append("")
            out.append("| check | kind | claims | verdict | explanation |")
            out.append("|---|---|---|---|---|")
            for c in r.checks:
                out.append("| " + " | ".join(_md_escape(x) for x in (
                    f"`{c.id}`", c.kind, ", ".join(c.claims), f"**{c.verdict}**", c.explanation)) + " |")
        out.append("")
    return "\n".join(out)


def _explanation(v: ClaimVerdict) -> str:
    """A claim's explanation, with the note on an old quantity name the key used (Claim.alias_note)."""
    return f"{v.explanation}; {v.claim.alias_note}" if v.claim.alias else v.explanation


def _exact(x: Any) -> Any:
    if x is None:
        return None
    if isinstance(x, tuple):
        return [_exact(a) for a in x]
    q = Fraction(x)
    return {"exact": str(q.numerator) if q.denominator == 1 else f"{q.numerator}/{q.denominator}",
            "approx": float(q)}


def _rounding(r: RoundingReading | None) -> dict | None:
    """How a verdict depends on the rounding of the inputs printed with precision, JSON-ready (None without)."""
    if r is None:
        return None
    return {
        "holds_at_printed_inputs": r.at_printed,
        "inputs": [{"input": i.name, "unit": i.unit, "printed": _exact(i.printed), "half_step": _exact(i.half_step),
                    "holds_for": None if i.holds_for is None else [_exact(x) for x in i.holds_for],
                    "nearest": _exact(i.nearest), "relative": _exact(i.relative)} for i in r.inputs],
        "joint": {n: _exact(x) for n, x in r.joint} or None,
    }


def to_dict(result: AuditResult) -> dict:
    """A JSON-ready dict of one result (exact values as strings ``"p/q"`` plus a float).

    Each claim's ``input_rounding`` says how its verdict depends on its inputs printed with precision (null
    when it has none): ``holds_at_printed_inputs``, and per input its ``printed`` value, ``half_step``,
    ``holds_for`` (the values of it alone that make the figure hold, or null), the ``nearest`` of them and its
    ``relative`` distance from the printed value; ``joint`` a point where it holds when no input alone does.
    ``contradicts`` lists the contradicting checks that made a claim that held ambiguous (docs/AUDIT.md)."""
    check_type("result", result, AuditResult, "must be an AuditResult (see audit_file)")
    return {
        "path": result.path,
        "title": result.title,
        "source": result.source,
        "summary": result.counts(),
        "claims": [
            {
                "id": v.claim.id, "quantity": v.claim.quantity, "section": v.claim.section, "line": v.claim.line,
                "inputs": v.inputs, "claimed": v.claim.claimed_text, "unit": v.claim.unit,
                "rounding": _exact(v.claim.step)["exact"], "rounding_inferred": v.claim.step_inferred,
                "quantity_unit": v.quantity_unit, "computed": _exact(v.computed),
                "computed_in_unit": _exact(v.computed_in_unit), "verdict": v.verdict, "convention": v.convention,
                "alternatives": [{"convention": a["convention"], "value": _exact(a["value"]),
                                  "unit": a.get("unit", v.claim.unit), "input_rounding": _rounding(a.get("rounding"))}
                                 for a in v.alternatives],
                "input_rounding": _rounding(v.rounding),
                "contradicts": [{"check": x["check"], "claims": list(x["claims"]), "was": x["was"]}
                                for x in v.contradicts],
                "explanation": _explanation(v), "expect": v.claim.expect, "note": v.claim.note,
                "alias": v.claim.alias or None,
            }
            for v in result.claims
        ],
        "checks": [
            {"id": c.id, "kind": c.kind, "claims": list(c.claims), "verdict": c.verdict, "explanation": c.explanation,
             "automatic": c.automatic, "expect": c.expect, "line": c.line}
            for c in result.checks
        ],
    }


def to_json(results: AuditResult | Sequence[AuditResult]) -> str:
    """JSON text: a list with one object per key (see :func:`to_dict`)."""
    return json.dumps([to_dict(r) for r in _list(results)], indent=2)


def render(results: AuditResult | Sequence[AuditResult], fmt: str = "table") -> str:
    """The report as text in ``fmt``: "table", "markdown" or "json". Raises ConfigError for
    another ``fmt`` or ``results`` that are not AuditResults."""
    check_choice("fmt", fmt, FORMATS)
    if fmt == "json":
        return to_json(results)
    if fmt == "markdown":
        return to_markdown(results)
    return render_table(results)


def render_quantity_list(fmt: str = "table") -> str:
    """The quantity catalogue (name, inputs with units and defaults, unit, source) as text in
    ``fmt`` ("table", "markdown" or "json"; ConfigError for another)."""
    check_choice("fmt", fmt, FORMATS)
    from distcheck.audit.conventions import describe_conventions
    from distcheck.audit.quantities import list_quantities

    items = list_quantities()
    if fmt == "json":
        return json.dumps({"quantities": items, "conventions": describe_conventions()}, indent=2)

    def listed(items: Sequence[dict[str, Any]]) -> str:
        parts = []
        for i in items:
            d = "" if i["default"] is None else f"={i['default']}"
            u = f" [{i['unit']}]" if i["unit"] else ""
            parts.append(f"{i['name']}{d}{u}")
        return ", ".join(parts)

    def inputs(q: dict[str, Any]) -> str:
        # inputs only the conventions read (Quantity.convention_inputs) after the formula's own
        extra = listed(q["convention_inputs"])
        return (listed(q["inputs"]) or "-") + (f"; for conventions: {extra}" if extra else "")

    if fmt == "markdown":
        rows = ["| quantity | inputs | unit | source | defined at |", "|---|---|---|---|---|"]
        for q in items:
            rows.append(f"| `{q['name']}` | {_md_escape(inputs(q))} | {q['unit']} | {_md_escape(q['source'])} | "
                        f"{q['where'] or '-'} |")
        return "\n".join(rows) + "\n"
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    buf = io.StringIO()
    console = Console(file=buf, width=200, force_terminal=False, color_system=None)
    t = Table(title="auditable quantities (distcheck audit --list)")
    for col in ("quantity", "inputs", "unit", "source", "defined at"):
        t.add_column(col, overflow="fold")
    for q in items:
        t.add_row(q["name"], escape(inputs(q)), q["unit"], escape(q["source"]), q["where"] or "-")
    console.print(t)
    return buf.getvalue()
