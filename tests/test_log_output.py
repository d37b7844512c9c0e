"""Output that reads in a CI log (off a terminal): whole check names, one crash reported once, reproduce
lines that name their own row's world size and backend, the ranks' warnings summarised once."""

from __future__ import annotations

import io

from rich.console import Console

from distcheck.core.results import FAIL, PASS, CheckResult
from distcheck.report import render_table

LONG = "row-parallel-linear.collectives.forward_and_backward_of_a_long_name[float64]"


def _log(width: int = 200) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=width, color_system=None), out


def test_off_a_terminal_the_table_never_cuts_a_check_name():
    rows = [CheckResult(LONG, "gloo", PASS, 2, 10, detail="outputs match " + "x" * 300),
            CheckResult("tp.short", "gloo", FAIL, 4, 3, detail="bad " + "y" * 300)]
    for width in (200, 120, 90):  # the table, a narrower one, the one-line form
        console, out = _log(width)
        render_table(rows, console=console)
        lines = out.getvalue().splitlines()
        assert any(LONG in line for line in lines), (width, out.getvalue())
        assert all(len(line) <= width for line in lines), width
    # on a terminal the name gives way to the detail, cut in the middle
    out = io.StringIO()
    render_table(rows, console=Console(file=out, force_terminal=True, width=120, color_system=None))
    assert LONG not in out.getvalue() and "…" in out.getvalue()
