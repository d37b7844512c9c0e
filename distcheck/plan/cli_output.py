"""Shared output helpers of ``distcheck plan``: the console, exact JSON numbers, and checks of
``--figure`` / ``--report`` before any work."""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

    from matplotlib.figure import Figure
    from rich.console import Console

    from distcheck.core.results import CheckResult
    from distcheck.reportdoc import Table

__all__ = ["EXIT_OK", "EXIT_FAIL"]

EXIT_OK, EXIT_FAIL = 0, 1

def _console() -> Console:
    from rich.console import Console

    out = Console()
    return out if out.is_terminal else Console(width=200)


def _exact(x: Any) -> Any:
    """JSON for an exact number: an int as is, a Fraction as {"exact": "p/q", "approx": float}."""
    if x is None or isinstance(x, (int, str)):
        return x
    q = Fraction(x)
    return int(q) if q.denominator == 1 else {"exact": f"{q.numerator}/{q.denominator}", "approx": float(q)}


def _frac(q: int | Fraction) -> str:
    q = Fraction(q)
    return str(q.numerator) if q.denominator == 1 else f"{q.numerator}/{q.denominator}"


def _gbv(x: int | Fraction | None) -> str:
    """Bytes as a GB number without the unit (table cells)."""
    return "-" if x is None else f"{float(Fraction(x)) / 1e9:,.2f}"


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse a bad --figure or --report before any work."""
    from distcheck.core.errors import ConfigError

    if getattr(args, "figure", None) is not None:
        fig = args.figure
        if fig.suffix.lower() not in (".png", ".svg"):
            raise ConfigError("--figure", str(fig), "must end in .png or .svg")
        if not fig.parent.is_dir():
            raise ConfigError("--figure", str(fig), f"folder {fig.parent} does not exist")
        from distcheck.core.outputs import check_output_target

        check_output_target("--figure", fig)  # a folder, pipe, link or read-only file: refused first
    if getattr(args, "report", None) is not None:
        from distcheck.reportdoc import check_report_dir

        check_report_dir(args.report)
    if getattr(args, "figure", None) is not None or getattr(args, "report", None) is not None:
        from distcheck.viz import require_matplotlib

        require_matplotlib()


def _write_outputs(args: argparse.Namespace, figs: list[tuple[Figure, str, str]], title: str, notes: list[str],
                   tables: list[Table], results: list[CheckResult] | None = None, summary: str | None = None) -> None:
    from distcheck import viz
    from distcheck.reportdoc import figure_image, write_report

    if args.figure is not None and figs:
        viz.save_figure(figs[0][0], args.figure)
    if args.report is not None:
        images = [figure_image(f, caption, name) for f, caption, name in figs]
        write_report(args.report, title, results=results, tables=tables, figures=images, notes=notes, summary=summary)


