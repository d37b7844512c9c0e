"""The table of check results and its summary line (rich), over the rows of
:mod:`distcheck.core.results`.

:class:`CheckResult`, :class:`Verdict` and the verdict constants live in
:mod:`distcheck.core.results` and are re-exported here, their public path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from distcheck.core.results import (
    FAIL,
    FINDING,
    PASS,
    SKIP,
    CheckResult,
    to_json,
)
from distcheck.core.text import clean

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "print_report",
    "print_rank_warnings",
    "render_table",
    "summary_line",
]


def _fmt_err(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


#: widest the check column gets; longer names are cut in the middle ("golden/chapter:…bubble")
CHECK_WIDTH = 46


def _cut_middle(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def render_table(results: Iterable[CheckResult], title: str = "distcheck check",
                 console: Console | None = None) -> None:
    """Print the results as a rich table (check / backend / world size / examples / verdict / max error / detail).

    Each row takes one line. Off a terminal (a pipe, a CI log: ``console.is_terminal`` false) a
    check name is never cut, since it is what a reader greps for: the check column is as wide as
    the longest name and the detail is cut to the room left (rows print one plain line each when
    even the names do not fit). On a terminal, long names are cut in the middle to
    :data:`CHECK_WIDTH` columns. The detail column is dropped below about 100 columns.
    The full detail of every FAIL and finding row is printed after the table, so nothing
    that explains a verdict is lost; ``--format json`` has everything.
    """
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    results = list(results)
    console = console or Console()
    style: dict[str, str] = {PASS: "green", FAIL: "bold red", SKIP: "yellow", FINDING: "magenta"}
    backend_w = max([len(r.backend) for r in results] + [7])
    others = sum(w + 3 for w in (backend_w, 5, 8, 7, 9)) + 4  # each column: width, padding, separator
    longest = max([len(clean(r.check)) for r in results] + [5])
    cut_names = console.is_terminal
    if cut_names:  # the check column gives way (down to 24) so that the detail keeps at least 30 columns
        check_w = max(min(24, longest), min(CHECK_WIDTH, longest, console.width - others - 3 - 30))
    else:  # a log: whole names, the detail takes what is left
        check_w = longest
    room = console.width - others - (check_w + 3)
    if console.width < 100 or room < 0:  # too narrow for columns: one plain line per row
        if title:
            console.print(title, style="bold", highlight=False)
        for r in results:
            console.print(f"[{style.get(r.verdict, '')}]{r.verdict:<7}[/] {escape(clean(r.check))}  "
                          f"({r.backend}, world size {r.world_size}, {r.examples} examples, "
                          f"max error {_fmt_err(r.max_error)})", highlight=False)
        _print_notable(results, console, style)
        return
    show_detail = room >= 16

    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=False)
    table.add_column("check", no_wrap=True, min_width=check_w)
    table.add_column("backend", no_wrap=True, min_width=backend_w)
    table.add_column("world size", justify="right", min_width=5)
    table.add_column("examples", justify="right", min_width=8)
    table.add_column("verdict", no_wrap=True, min_width=7)
    table.add_column("max error", justify="right", no_wrap=True, min_width=9)
    if show_detail:
        table.add_column("detail", no_wrap=True)

    def short(text: str) -> str:
        line = text.splitlines()[0] if text else ""
        return line if len(line) <= room else line[: room - 1] + "…"

    first = _crash_firsts(results)
    for r in results:
        cells = [
            escape(_cut_middle(clean(r.check), check_w)), r.backend, str(r.world_size), str(r.examples),
            f"[{style.get(r.verdict, '')}]{r.verdict}[/]", _fmt_err(r.max_error),
        ]
        if show_detail:
            lead = first.get(id(r), r)
            detail = r.detail if lead is r else f"taken down by the crash of {lead.check} (below)"
            cells.append(escape(short(clean(detail))))
        table.add_row(*cells)
    console.print(table)
    _print_notable(results, console, style)


def _crash_firsts(results: list[CheckResult]) -> dict[int, CheckResult]:
    """For every FAIL row of a crash that took down several properties (``extra["took_down"]``, the checks
    it failed, :meth:`distcheck.certify.certificate.Certification.rows`), the first row of that crash, by ``id``."""
    firsts: dict[tuple, CheckResult] = {}
    out: dict[int, CheckResult] = {}
    for r in results:
        took = r.extra.get("took_down")
        if r.verdict == FAIL and took:
            key = (str(r.extra.get("target")), r.backend, r.world_size, tuple(took))
            out[id(r)] = firsts.setdefault(key, r)
    return out


def _print_notable(results: list[CheckResult], console: Console, style: dict) -> None:
    """Below the table: the full detail of every FAIL and finding row, with how to reproduce it
    (the seed and the replay call of a property or mutant; the command and the upstream reference
    of a finding), and every recorded finding that no longer reproduces. A crash that took down
    several properties is shown once, under its first row, with the checks it failed in one line."""
    from rich.markup import escape

    first = _crash_firsts(results)
    for r in results:
        stale = r.extra.get("finding_no_longer_reproduces")
        if r.verdict not in (FAIL, FINDING) and not stale or first.get(id(r), r) is not r:
            continue
        head = f"[{style[r.verdict]}]{r.verdict}[/]" if r.verdict in (FAIL, FINDING) else "note"
        console.print(f"{head} {escape(clean(r.check))} ({r.backend}, world size {r.world_size}):", highlight=False)
        if id(r) in first:
            took = [clean(str(c)) for c in r.extra["took_down"]]
            console.print(f"  one crash took down {len(took)} checks: {', '.join(took)}", highlight=False,
                          markup=False)
        console.print(f"  {clean(r.detail)}", highlight=False, markup=False)
        for label, text in _reproduce_lines(r):
            console.print(f"  {label}: {clean(text)}", highlight=False, markup=False)


def _reproduce_lines(r: CheckResult) -> list[tuple[str, str]]:
    """(label, text) lines saying how to see ``r`` again."""
    lines = []
    finding = r.extra.get("finding")
    if r.verdict == FINDING and isinstance(finding, dict):
        lines += [("reproduce", str(finding.get("reproduce", ""))), ("reported", str(finding.get("reported", "")))]
    if r.verdict == FAIL:
        flat = " ".join((r.detail or "").split())
        for key in ("error", "counterexample"):  # whole, where the one-line detail had to cut them
            text = " ".join(str(r.extra.get(key) or "").split())
            if text and text not in flat:
                lines.append((key, str(r.extra[key])))
        if "seed" in r.extra:
            lines.append(("seed", f"{r.extra['seed']} (profile {r.extra.get('profile', '?')})"))
        again = " ".join(str(r.extra.get("reproduce") or "").split())
        if again and again not in flat:  # a certify failure's detail already ends with its command
            lines.append(("reproduce", str(r.extra["reproduce"])))
        if r.extra.get("replay"):
            lines.append(("replay", str(r.extra["replay"])))
    return lines


def summary_line(results: Iterable[CheckResult], seconds: float | None = None) -> str:
    """``"N passed, N failed, N skipped, N findings in S s"``: the closing line of a report.

    Then, when present: the mutant kill count (the ``mutants`` row), the seed of the
    properties stage (``seed N (profile P)``, from the rows' ``extra["seed"]``; ``distcheck
    check --seed N`` replays it), and the recorded findings that no longer reproduce.
    """
    results = list(results)
    counts = {v: sum(r.verdict == v for r in results) for v in (PASS, FAIL, SKIP, FINDING)}
    line = f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped, {counts[FINDING]} findings"
    line = line if seconds is None else f"{line} in {seconds:.1f}s"
    mutants = [r for r in results if r.check == "mutants"]  # the properties stage's kill count
    line += "".join(f"; {r.detail}" for r in mutants)
    seeds = sorted({(str(r.extra["seed"]), str(r.extra.get("profile", "?"))) for r in results
                    if r.backend == "reference" and "seed" in r.extra})
    line += "".join(f"; seed {seed} (profile {profile})" for seed, profile in seeds)
    stale = sorted({str(r.extra["finding_no_longer_reproduces"]) for r in results
                    if r.extra.get("finding_no_longer_reproduces")})
    if stale:
        line += f"; recorded findings no longer reproducing: {', '.join(stale)}"
    return line


def print_report(results: Iterable[CheckResult], *, title: str = "distcheck check", seconds: float | None = None,
                 fmt: str = "table", suffix: str = "") -> None:
    """Print ``results`` to stdout as a table and its summary line (``fmt="table"``) or as JSON.

    Off a terminal (a pipe, a CI log) the table is drawn 200 columns wide instead of 80.
    Then, on stderr, the warnings the ranks raised during the run, once each with its count
    (:func:`print_rank_warnings`).
    """
    results = list(results)
    if fmt == "json":
        print(to_json(results), flush=True)
        print_rank_warnings()
        return
    from rich.console import Console

    out = Console()
    if not out.is_terminal:
        out = Console(width=200)
    render_table(results, title=title, console=out)
    out.print(summary_line(results, seconds) + suffix, highlight=False)
    print_rank_warnings()


def print_rank_warnings() -> None:
    """Write to stderr the warnings the ranks of this process's pools raised since the last call, once
    each with its count (``torch warned 4 times on the ranks (ranks 0, 1):``, then a line per distinct
    warning; :mod:`distcheck.runners.warned`); nothing when there is none."""
    import sys

    from distcheck.runners.warned import summary_lines, take

    lines = summary_lines(take())
    if lines:
        sys.stdout.flush()
        sys.stderr.write("\n".join(clean(line) for line in lines) + "\n")
        sys.stderr.flush()
