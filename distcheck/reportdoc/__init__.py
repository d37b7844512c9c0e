"""Reports for people: self-contained HTML and Markdown, written as one unit.

:func:`write_report` takes a title, result rows (:class:`distcheck.core.results.CheckResult`
or generic :class:`Table`) and figures, and writes ``DIR/report.html`` and
``DIR/report.md`` (with the Markdown's figures) as one set: staged beside ``DIR``, then
swapped in with one rename (:func:`distcheck.core.outputs.write_folder`). :func:`atomic_write`
writes one file whole (a temporary file, then a rename), for a single figure. Neither
imports matplotlib.
"""

from distcheck.reportdoc.atomic import atomic_write
from distcheck.reportdoc.commands import audit_tables, write_audit_report, write_check_report
from distcheck.reportdoc.document import (
    FigureImage,
    ReportFiles,
    Table,
    check_report_dir,
    figure_image,
    render_html,
    render_markdown,
    results_table,
    write_report,
)

__all__ = [
    "atomic_write", "FigureImage", "ReportFiles", "Table", "check_report_dir", "figure_image", "render_html",
    "render_markdown", "results_table", "write_report", "audit_tables", "write_audit_report", "write_check_report",
]
