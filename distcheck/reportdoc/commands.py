"""The reports of ``distcheck check --report DIR`` and ``distcheck audit --report DIR``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from distcheck.reportdoc.document import ReportFiles, Table, write_report

if TYPE_CHECKING:
    from distcheck.audit.report import AuditResult

__all__ = ["write_check_report", "write_audit_report", "audit_tables"]


def write_check_report(directory: str | Path, results: Sequence, *, seconds: float | None = None,
                       notes: Sequence[str] = (), title: str = "distcheck check") -> ReportFiles:
    """The check results as one table, its summary line under it (:func:`distcheck.report.summary_line`)."""
    from distcheck.report import summary_line

    summary = summary_line(results, seconds)
    return write_report(directory, title, results=results, notes=[summary, *notes], summary=summary)


def _number(value: object, unit: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return "[" + ", ".join(_number(v, "") for v in value) + "]" + (f" {unit}" if unit else "")
    approx = value["approx"] if isinstance(value, dict) else value
    text = f"{approx:.9g}" if isinstance(approx, float) else str(approx)
    return f"{text} {unit}".strip()


def audit_tables(results: AuditResult | Sequence[AuditResult]) -> list[Table]:
    """One claims table per answer key, and its consistency checks when it has any.

    Built from ``distcheck.audit.to_json`` (the audit's public JSON), so the
    report shows what ``--format json`` shows.
    """
    from distcheck import audit

    tables = []
    for key in json.loads(audit.to_json(results)):
        counts = ", ".join(f"{n} {k}" for k, n in sorted(key["summary"].items())) or "no claims"
        rows = tuple((c["id"], c["quantity"], f"{c['claimed']} {c['unit']}", _number(c["computed_in_unit"], c["unit"]),
                      c["verdict"], c["explanation"]) for c in key["claims"])
        tables.append(Table(f"{key['title']} ({key['path']})",
                            ("claim", "quantity", "printed", "recomputed", "verdict", "explanation"), rows,
                            note=f"Source: {key['source']}. Summary: {counts}."))
        if key["checks"]:
            tables.append(Table(f"Consistency ({key['path']})", ("check", "kind", "claims", "verdict", "explanation"),
                                tuple((c["id"], c["kind"], ", ".join(c["claims"]), c["verdict"], c["explanation"])
                                      for c in key["checks"])))
    return tables


def write_audit_report(directory: str | Path, results: AuditResult | Sequence[AuditResult], *,
                       title: str = "distcheck audit") -> ReportFiles:
    """Every audited key's claims and checks (:func:`audit_tables`)."""
    from distcheck import audit

    listed = [results] if isinstance(results, audit.AuditResult) else list(results)
    notes = [f"{r.path}: {', '.join(f'{n} {k}' for k, n in sorted(r.counts().items())) or 'no claims'}" for r in listed]
    return write_report(directory, title, tables=audit_tables(listed), notes=notes)
