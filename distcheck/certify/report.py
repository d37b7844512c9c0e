"""The report of ``distcheck certify --report DIR``: ``DIR/report.html`` and ``DIR/report.md``.

Written by :func:`distcheck.reportdoc.write_report` (the writer of ``check``, ``audit`` and
``plan`` reports; the whole folder swapped in as one unit), from a :class:`~distcheck.certify.certificate.Certificate`.
In order:

1. **Targets**: one row per certification: verdict, row counts, the failing properties, seed,
   profile, torch version, the distribution and the code certified (sha256, git commit);
2. **Failures**, one row per failing property of a target, not one per dtype and world size: where
   it failed, the first failure's reason and case, and its replay command, once; a crash that took
   down several properties at once is one row naming them all;
3. **Stacks** of the stuck ranks of a property that hung, one line of the stack per row;
4. **Compositions drawn**, for a contract that names its examples' compositions (the
   ``training-step`` contract's layout, schedule, micro-batches, steps and clipping): one row per
   composition of a target, world size and dtype, with each property's verdict on it;
5. **Rows**, one table per target (``Rows: TARGET under CONTRACT``): every verdict, property by
   property; a failure's detail points at its row of *Failures* (its own reason when it differs from
   the first's), and a detail shared with the row above is shown once ("as above").
"""

from __future__ import annotations

from pathlib import Path

from distcheck.certify.certificate import Certificate, Certification, PropertyVerdict
from distcheck.report import FAIL, PASS, SKIP
from distcheck.reportdoc import ReportFiles, Table, write_report

__all__ = ["report_tables", "write_certify_report"]


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


def _counts(c: Certification) -> str:
    n = {v: sum(x.verdict == v for x in c.verdicts) for v in (PASS, FAIL, SKIP)}
    return f"{n[PASS]} passed, {n[FAIL]} failed, {n[SKIP]} skipped"


def _failing(c: Certification) -> list[str]:
    return list(dict.fromkeys(v.property for v in c.failures))


def _failure_key(v: PropertyVerdict) -> tuple[str, ...]:
    """The failures a verdict is grouped with: the properties its crash took down, else its property."""
    return tuple(v.took_down) or (v.property,)


def _code(c: Certification) -> str:
    code = c.code
    if code is None or code.sha256 is None:
        return "unknown"
    text = f"sha256 {code.sha256[:16]} of {'the RECORD of ' if code.hashed == 'RECORD' else ''}{code.hashed_file}"
    if code.git_commit is not None:
        text += f"; git {code.git_commit[:12]}" + (" (dirty)" if code.git_dirty else "")
    return text


def _where(group: list[PropertyVerdict]) -> str:
    """``float64, float32 at world size 2; float64 at world size 4``."""
    by_ws: dict[int, list[str]] = {}
    for v in group:
        by_ws.setdefault(v.world_size, []).append(v.dtype)
    return "; ".join(f"{', '.join(dts)} at world size {ws}" for ws, dts in by_ws.items())


def report_tables(certificate: Certificate) -> list[Table]:
    """The tables of the report, in order (see the module docstring)."""
    torch = str(certificate.environment.get("torch"))
    targets = Table("Targets", ("target", "contract", "verdict", "rows", "failing properties", "seed", "profile",
                                "torch", "distribution", "code"),
                    tuple((c.target, c.contract, "certified" if c.ok else "FAILED", _counts(c),
                           ", ".join(_failing(c)) or "none", str(c.seed), c.profile, torch,
                           f"{c.distribution} {c.version}" if c.distribution else "-", _code(c))
                          for c in certificate.certifications))
    failures: list[tuple[str, ...]] = []
    stacks: list[tuple[str, ...]] = []
    per_target: list[Table] = []
    first_of: dict[tuple[int, tuple[str, ...]], tuple[int, PropertyVerdict]] = {}
    for i, c in enumerate(certificate.certifications):
        for key in dict.fromkeys(_failure_key(v) for v in c.failures):
            group = [v for v in c.failures if _failure_key(v) == key]
            first = group[0]
            number = len(failures) + 1
            first_of[(i, key)] = (number, first)
            case = f"{first.counterexample} (it hung)" if first.hung else str(first.counterexample)
            what = ", ".join(f"{c.contract}.{p}" for p in key)
            reason = (f"one crash took down {len(key)} properties: " if len(key) > 1 else "") + str(first.failure)
            failures.append((str(number), c.target, what, _where([v for v in group if v.property == first.property]),
                             reason, case, str(first.reproduce)))
            for v in group:
                for rank, text in sorted(v.stacks.items()):
                    stacks += [(str(number), f"{v.dtype}, world size {v.world_size}", str(rank), line.strip())
                               for line in text.strip().splitlines()]
        order = {p: n for n, p in enumerate(dict.fromkeys(v.property for v in c.verdicts))}
        rows: list[tuple[str, ...]] = []
        above = None
        for v in sorted(c.verdicts, key=lambda v: order[v.property]):  # stable: world sizes, dtypes in run order
            if v.verdict == FAIL:
                number, first = first_of[(i, _failure_key(v))]
                detail = f"failure {number} (above)" + ("" if v.failure == first.failure else f": {v.failure}")
            elif v.verdict == SKIP:
                detail = f"skip: {v.failure}"
            else:
                detail = f"{v.statement} ({v.regime})" + (f": {v.note}" if v.note else "")
            shown, above = ("as above" if detail == above else detail), detail
            rows.append((f"{c.contract}.{v.property}[{v.dtype}]", v.backend, str(v.world_size),
                         str(v.examples), v.verdict, _num(v.max_error), _num(v.bound), shown))
        per_target.append(Table(f"Rows: {c.target} under {c.contract}", ("check", "backend", "world size", "examples",
                                                                         "verdict", "max error", "bound", "detail"),
                                tuple(rows)))
    tables = [targets]
    if failures:
        tables.append(Table("Failures, one row per property", ("failure", "target", "property", "failed at",
                                                               "reason (the first failure)", "case", "replay"),
                            tuple(failures), note="Each replay command runs the first failure of its property "
                                                  "again: the same case, the same verdict."))
    if stacks:
        tables.append(Table("Stacks of the stuck ranks", ("failure", "where", "rank", "stack"), tuple(stacks),
                            note="As each rank dumped it (faulthandler: most recent call first; a threaded rank: "
                                 "a traceback, most recent call last)."))
    drawn = [c for c in certificate.certifications if c.compositions]
    for c in drawn:
        head, body = c.composition_table()
        tables.append(Table("Compositions drawn" + (f": {c.target}" if len(drawn) > 1 else ""), tuple(head),
                            tuple(tuple(r) for r in body),
                            note=f"{c.target} under {c.contract}: each property's verdict on the examples of each "
                                 "composition (shrinking replays included)."))
    return tables + per_target


def write_certify_report(directory: str | Path, certificate: Certificate, *,
                         title: str = "distcheck certify") -> ReportFiles:
    """Write ``DIR/report.html`` and ``DIR/report.md`` for ``certificate``; return the paths.

    Raises ConfigError when ``directory`` cannot be a report folder (a file, a link, read-only, a missing
    parent: :func:`distcheck.reportdoc.check_report_dir`), OSError when a write fails (the old report
    stays whole: :func:`distcheck.reportdoc.write_report`).
    """
    from distcheck.report import summary_line

    env = certificate.environment
    rows = [r for c in certificate.certifications for r in c.rows()]
    notes = [f"verdict: {'certified' if certificate.ok else 'FAILED'}; "
             f"{summary_line(rows, sum(c.seconds for c in certificate.certifications))}",
             f"reproduce the whole run: {certificate.command}",
             f"created {certificate.created} with Python {env.get('python')}, distcheck {env.get('distcheck')}, "
             f"torch {env.get('torch')}, Hypothesis {env.get('hypothesis')}, numpy {env.get('numpy')}"]
    return write_report(directory, title, tables=report_tables(certificate), notes=notes)
