"""Check results and their table: the one record every part of ``distcheck check`` returns.

A :class:`CheckResult` is one row: what was checked, on which backend and world
size, how many examples were tried, the verdict, and the largest error seen.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Iterable

__all__ = ["CheckResult", "PASS", "FAIL", "SKIP", "render_table", "to_json", "exit_code"]

PASS, FAIL, SKIP = "pass", "FAIL", "skip"


@dataclass
class CheckResult:
    """One row of a check report.

    Attributes:
        check: name of the property or figure, e.g. ``"ddp.unequal_shards.weighted"``.
        backend: where it ran: ``"reference"``, ``"sympy"``, ``"golden"``, ``"gloo"``,
            ``"nccl"``, ``"threaded"``, ``"fake"``.
        world_size: ranks in the world (1 for pure references).
        examples: examples tried (Hypothesis examples, figures, or runs).
        verdict: ``"pass"``, ``"FAIL"`` or ``"skip"``.
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
    """Print the results as a rich table (check / backend / world size / examples / verdict / max error)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=title, show_lines=False)
    for col, kw in (
        ("check", {}), ("backend", {}), ("world size", {"justify": "right"}), ("examples", {"justify": "right"}),
        ("verdict", {}), ("max error", {"justify": "right"}), ("detail", {"overflow": "fold"}),
    ):
        table.add_column(col, **kw)
    style = {PASS: "green", FAIL: "bold red", SKIP: "yellow"}
    for r in results:
        table.add_row(
            r.check, r.backend, str(r.world_size), str(r.examples),
            f"[{style.get(r.verdict, '')}]{r.verdict}[/]", _fmt_err(r.max_error), r.detail,
        )
    console.print(table)


def to_json(results: Iterable[CheckResult]) -> str:
    return json.dumps([asdict(r) for r in results], indent=2, default=str)


def exit_code(results: Iterable[CheckResult]) -> int:
    """1 if any result failed, else 0."""
    return 1 if any(r.verdict == FAIL for r in results) else 0
