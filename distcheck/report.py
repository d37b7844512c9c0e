"""Check results and their table: the one record every part of ``distcheck check`` returns.

A :class:`CheckResult` is one row: what was checked, on which backend and world
size, how many examples were tried, the verdict, and the largest error seen.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Iterable

__all__ = ["CheckResult", "PASS", "FAIL", "SKIP", "FINDING", "render_table", "summary_line", "print_report", "to_json", "exit_code"]

PASS, FAIL, SKIP = "pass", "FAIL", "skip"
#: a documented discrepancy in an upstream library (e.g. a torch schedule table that
#: disagrees with what torch executes): printed with its evidence, not a failure of the run
FINDING = "finding"


@dataclass
class CheckResult:
    """One row of a check report.

    Attributes:
        check: name of the property or figure, e.g. ``"ddp.unequal_shards.weighted"``.
        backend: where it ran: ``"reference"``, ``"sympy"``, ``"golden"``, ``"gloo"``,
            ``"nccl"``, ``"threaded"``, ``"fake"``.
        world_size: ranks in the world (1 for pure references).
        examples: examples tried (Hypothesis examples, figures, or runs).
        verdict: ``"pass"``, ``"FAIL"``, ``"skip"`` or ``"finding"`` (a known upstream
            discrepancy, reproduced and reported; see distcheck.runners.findings).
        max_error: the largest absolute error seen (None where not numeric).
        bound: the bound the error was held to (None for exact checks).
        detail: one line: the counterexample, the reason for a skip, or the figure.
    """

    check: str
    backend: str
    verdict: str
    world_size: int = 1
    examples: int = 0
    max_error: float | None = None
    bound: float | None = None
    detail: str = ""
    extra: dict = field(default_factory=dict)


def _fmt_err(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


def render_table(results: Iterable[CheckResult], title: str = "distcheck check", console=None) -> None:
    """Print the results as a rich table (check / backend / world size / examples / verdict / max error / detail).

    The detail column is cut to one line; the full detail of every FAIL and
    finding row is printed after the table, so nothing that explains a verdict is lost.
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    results = list(results)
    console = console or Console()
    table = Table(title=title, show_lines=False)
    for col, kw in (
        ("check", {"no_wrap": True}), ("backend", {"no_wrap": True, "min_width": 7}), ("world size", {"justify": "right", "min_width": 5}),
        ("examples", {"justify": "right", "min_width": 5}), ("verdict", {"no_wrap": True, "min_width": 7}), ("max error", {"justify": "right", "no_wrap": True, "min_width": 9}),
        ("detail", {"no_wrap": True}),
    ):
        table.add_column(col, **kw)
    style = {PASS: "green", FAIL: "bold red", SKIP: "yellow", FINDING: "magenta"}
    name_w = max([len(r.check) for r in results] + [5])
    room = max(24, console.width - name_w - 76)  # what is left for the detail after the fixed columns

    def short(text: str) -> str:
        line = text.splitlines()[0] if text else ""
        return line if len(line) <= room else line[: room - 1] + "…"

    for r in results:
        table.add_row(
            escape(r.check), r.backend, str(r.world_size), str(r.examples),
            f"[{style.get(r.verdict, '')}]{r.verdict}[/]", _fmt_err(r.max_error), escape(short(r.detail)),
        )
    console.print(table)
    notable = [r for r in results if r.verdict in (FAIL, FINDING)]
    for r in notable:
        console.print(f"[{style[r.verdict]}]{r.verdict}[/] {escape(r.check)} ({r.backend}, world size {r.world_size}):",
                      highlight=False)
        console.print(f"  {r.detail}", highlight=False, markup=False)


def summary_line(results: Iterable[CheckResult], seconds: float | None = None) -> str:
    """``"N passed, N failed, N skipped, N findings in S s"``: the closing line of a report."""
    results = list(results)
    counts = {v: sum(r.verdict == v for r in results) for v in (PASS, FAIL, SKIP, FINDING)}
    line = f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped, {counts[FINDING]} findings"
    return line if seconds is None else f"{line} in {seconds:.1f}s"


def print_report(results: Iterable[CheckResult], *, title: str = "distcheck check", seconds: float | None = None,
                 fmt: str = "table", suffix: str = "") -> None:
    """Print ``results`` to stdout as a table and its summary line (``fmt="table"``) or as JSON.

    Off a terminal (a pipe, a CI log) the table is drawn 160 columns wide instead of 80.
    """
    results = list(results)
    if fmt == "json":
        print(to_json(results), flush=True)
        return
    from rich.console import Console

    out = Console()
    if not out.is_terminal:
        out = Console(width=160)
    render_table(results, title=title, console=out)
    out.print(summary_line(results, seconds) + suffix, highlight=False)


def to_json(results: Iterable[CheckResult]) -> str:
    return json.dumps([asdict(r) for r in results], indent=2, default=str)


def exit_code(results: Iterable[CheckResult]) -> int:
    """1 if any result failed, else 0."""
    return 1 if any(r.verdict == FAIL for r in results) else 0
