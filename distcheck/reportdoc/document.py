"""Self-contained HTML and Markdown reports: notes, figures and tables.

:func:`write_report` is the one writer every command uses (``check``,
``audit`` and ``plan`` with ``--report DIR``; a ``certify`` command can pass its
own rows). It writes the whole set as one unit (:func:`distcheck.core.outputs.write_folder`: staged
in a folder beside ``DIR``, then swapped in with one rename, so a reader finds the complete old
report or the complete new one):

* ``DIR/<stem>.html``: one file with everything inside it. Figures are PNG
  data URIs, the style sheet is inline, there is no script, and a
  Content-Security-Policy (``default-src 'none'``) forbids the page from
  loading anything else, so it opens offline and cannot leak a request;
* ``DIR/<stem>.md``: the same notes and tables in Markdown, figures as PNG
  files beside it (``DIR/<stem>-<figure name>.png``).

Order in both: the title, the notes (one bullet each), the figures, the check
results (with their summary line), then the other tables. Every text is
escaped (HTML entities; ``|`` in Markdown cells), so a detail line that holds
``<script>`` or a pipe shows as written, and a control character (``ESC [2J`` in a key's
title) shows as its escape ``\\x1b[2J`` (:func:`distcheck.core.text.clean`).

matplotlib is not imported here: figures arrive as :class:`FigureImage` (PNG
bytes), or as matplotlib figures that are already built (rendered with their
own ``savefig``).
"""

from __future__ import annotations

import base64
import html
import io
import os
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from distcheck.core.errors import ConfigError
from distcheck.core.outputs import write_folder
from distcheck.core.text import clean

__all__ = ["Table", "FigureImage", "ReportFiles", "write_report", "results_table", "figure_image",
           "render_html", "render_markdown", "check_report_dir"]


@dataclass(frozen=True)
class Table:
    """A table of text cells.

    Attributes:
        title: shown above the table (the HTML ``<caption>``, a Markdown heading).
        columns: the column headings.
        rows: one tuple of cells per row, each as long as ``columns``.
        note: one line shown under the table (empty for none).

    Raises ConfigError when a row's length differs from the columns'.
    """

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", tuple(str(c) for c in self.columns))
        rows = tuple(tuple("" if c is None else str(c) for c in r) for r in self.rows)
        for i, r in enumerate(rows):
            if len(r) != len(self.columns):
                raise ConfigError(f"rows[{i}]", len(r),
                                  f"cells must match the {len(self.columns)} columns of {self.title!r}")
        object.__setattr__(self, "rows", rows)


@dataclass(frozen=True)
class FigureImage:
    """A figure as PNG bytes, with its caption and a short file-name-safe ``name``."""

    caption: str
    name: str
    png: bytes

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) in pixels, read from the PNG header; ConfigError if the bytes are not a PNG."""
        if self.png[:8] != b"\x89PNG\r\n\x1a\n" or self.png[12:16] != b"IHDR":
            raise ConfigError("png", f"<{len(self.png)} bytes>", "must be a PNG image")
        return struct.unpack(">II", self.png[16:24])


@dataclass(frozen=True)
class ReportFiles:
    """What :func:`write_report` wrote."""

    html: Path
    markdown: Path
    figures: tuple[Path, ...]


def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:60] or "figure"


def figure_image(fig: Figure, caption: str, name: str | None = None, *, dpi: int = 110) -> FigureImage:
    """Render a matplotlib figure to a :class:`FigureImage` (PNG at ``dpi``)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return FigureImage(caption=caption, name=_slug(name or caption), png=buf.getvalue())


def _fmt_err(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


def results_table(results: Iterable, title: str = "Results") -> Table:
    """A :class:`Table` of :class:`distcheck.core.results.CheckResult` rows, detail in full."""
    rows = tuple((r.check, r.backend, str(r.world_size), str(r.examples), r.verdict, _fmt_err(r.max_error),
                  _fmt_err(r.bound), r.detail) for r in results)
    return Table(title, ("check", "backend", "world size", "examples", "verdict", "max error", "bound", "detail"), rows)


def check_report_dir(directory: str | Path, flag: str = "--report") -> Path:
    """Refuse a report folder that cannot be one, before any work: ConfigError naming ``flag``
    (:func:`distcheck.core.outputs.check_output_target` with ``folder=True``: a file, a link, a pipe,
    a read-only folder, a missing or read-only parent, the current folder, a folder holding a
    sub-folder). The folder itself is made when the report is written."""
    from distcheck.core.outputs import check_output_target

    path = Path(directory)
    if not path.exists() and not os.path.lexists(path) and not path.parent.is_dir():
        raise ConfigError(flag, str(path), f"cannot be created: folder {path.parent} does not exist")
    return check_output_target(flag, path, folder=True)


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2rem auto;max-width:78rem;
padding:0 1rem;color:#1b1f24;line-height:1.45}
h1{font-size:1.6rem;margin-bottom:.2rem}
.generated{color:#57606a;margin-top:0}
ul.notes li{margin:.15rem 0}
figure{margin:1.5rem 0}
figure img{max-width:100%;height:auto;border:1px solid #d0d7de}
figcaption{color:#57606a;font-size:.9rem}
table{border-collapse:collapse;margin:1.5rem 0;font-size:.85rem;display:block;overflow-x:auto}
caption{text-align:left;font-weight:600;font-size:1rem;padding:.3rem 0}
th,td{border:1px solid #d0d7de;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f6f8fa}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.v-pass,.v-holds,.v-yes,.v-consistent{color:#1a7f37;font-weight:600}
.v-FAIL,.v-wrong,.v-no,.v-contradiction{color:#cf222e;font-weight:600}
.v-skip,.v-ambiguous,.v-holds-through-input-rounding{color:#9a6700}
.v-finding{color:#8250df;font-weight:600}
p.note{color:#57606a;font-size:.85rem;margin-top:-1rem}
"""

_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
_NUMERIC = re.compile(r"^[-+]?[0-9][0-9,._]*(\.[0-9]+)?( ?(%|GB|GiB|B|s|ticks))?$")


def _cell(text: str) -> str:
    classes = []
    if _NUMERIC.match(text):
        classes.append("num")
    if re.fullmatch(r"[A-Za-z-]+", text) and text in {
            "pass", "FAIL", "skip", "finding", "holds", "holds-through-input-rounding", "wrong", "ambiguous", "yes",
            "no", "consistent", "contradiction"}:
        classes.append(f"v-{text}")
    attr = f' class="{" ".join(classes)}"' if classes else ""
    return f"<td{attr}>{html.escape(text)}</td>"


def render_html(title: str, *, notes: Sequence[str] = (), figures: Sequence[FigureImage] = (),
                tables: Sequence[Table] = (), generator: str = "") -> str:
    """The HTML document as text (see the module docstring)."""
    esc = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{esc(title)}</title>", f"<style>{_CSS}</style>", "</head>", "<body>", "<main>",
           f"<h1>{esc(title)}</h1>"]
    if generator:
        out.append(f'<p class="generated">{esc(generator)}</p>')
    if notes:
        out.append('<ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    for i, f in enumerate(figures, 1):
        w, h = f.size
        data = base64.b64encode(f.png).decode("ascii")
        out.append(f'<figure id="figure-{i}"><img src="data:image/png;base64,{data}" width="{w}" height="{h}" '
                   f'alt="{esc(f.caption)}"><figcaption>Figure {i}. {esc(f.caption)}</figcaption></figure>')
    for i, t in enumerate(tables, 1):
        head = "".join(f"<th>{esc(c)}</th>" for c in t.columns)
        body = "".join("<tr>" + "".join(_cell(c) for c in r) + "</tr>" for r in t.rows)
        out.append(f'<table id="table-{i}"><caption>{esc(t.title)}</caption><thead><tr>{head}</tr></thead>'
                   f"<tbody>{body}</tbody></table>")
        if t.note:
            out.append(f'<p class="note">{esc(t.note)}</p>')
    out += ["</main>", "</body>", "</html>", ""]
    return clean("\n".join(out))  # a control character from an input shows as its escape (\x1b)


def _md(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def render_markdown(title: str, *, notes: Sequence[str] = (), figures: Sequence[tuple[FigureImage, str]] = (),
                    tables: Sequence[Table] = (), generator: str = "") -> str:
    """The Markdown document as text; ``figures`` pairs each image with its file name."""
    out = [f"# {title}", ""]
    if generator:
        out += [f"_{generator}_", ""]
    if notes:
        out += [f"- {n}" for n in notes] + [""]
    for i, (f, file_name) in enumerate(figures, 1):
        out += [f"![Figure {i}. {_md(f.caption)}]({file_name})", "", f"Figure {i}. {f.caption}", ""]
    for t in tables:
        out += [f"## {t.title}", "", "| " + " | ".join(_md(c) for c in t.columns) + " |",
                "|" + "|".join("---" for _ in t.columns) + "|"]
        out += ["| " + " | ".join(_md(c) for c in r) + " |" for r in t.rows]
        out.append("")
        if t.note:
            out += [t.note, ""]
    return clean("\n".join(out))


def write_report(directory: str | Path, title: str, *, results: Iterable | None = None,
                 tables: Sequence[Table] = (), figures: Sequence = (), notes: Sequence[str] = (),
                 summary: str | None = None, stem: str = "report") -> ReportFiles:
    """Write ``DIR/<stem>.html`` and ``DIR/<stem>.md`` (and the Markdown's PNG figures) as one unit.

    Args:
        directory: the report folder; made (with no parents) when missing, else replaced whole
            (its regular files that are not this report's are carried over).
        title: the report's title.
        results: :class:`distcheck.core.results.CheckResult` rows, shown as one table
            (:func:`results_table`) titled "Results" with ``summary`` as its note.
        tables: further :class:`Table` objects.
        figures: :class:`FigureImage` objects, or built matplotlib figures
            (converted with :func:`figure_image`; caption: the figure's
            suptitle, else "Figure N").
        notes: lines shown first, one bullet each.
        summary: a line under the results table (e.g. ``distcheck.report.summary_line``).
        stem: the files' base name (default ``"report"``).

    Returns:
        :class:`ReportFiles` with the paths written.

    Raises:
        ConfigError: the folder is a file or cannot be created (see :func:`check_report_dir`).
        OSError: a write fails (no half-written file is left).
    """
    from distcheck import __version__

    path = check_report_dir(directory)
    images: list[FigureImage] = []
    for i, f in enumerate(figures, 1):
        if isinstance(f, FigureImage):
            images.append(f)
        else:
            suptitle = f.get_suptitle() if hasattr(f, "get_suptitle") else ""
            images.append(figure_image(f, suptitle or f"Figure {i}", f"figure-{i}"))
    all_tables = list(tables)
    if results is not None:
        all_tables.insert(0, Table(**{**results_table(results).__dict__, "note": summary or ""}))
    generator = f"distcheck {__version__}"
    names, used = [], set()
    for i, img in enumerate(images, 1):
        name = f"{stem}-{img.name}.png"
        if name in used:
            name = f"{stem}-{i}-{img.name}.png"
        used.add(name)
        names.append(name)
    files = {n: img.png for n, img in zip(names, images, strict=True)}
    files[f"{stem}.md"] = render_markdown(title, notes=notes, figures=list(zip(images, names, strict=True)),
                                          tables=all_tables, generator=generator).encode("utf-8")
    files[f"{stem}.html"] = render_html(title, notes=notes, figures=images, tables=all_tables,
                                        generator=generator).encode("utf-8")
    write_folder(path, files, ours=lambda n: n in (f"{stem}.md", f"{stem}.html")
                 or (n.startswith(f"{stem}-") and n.endswith(".png")))
    return ReportFiles(html=path / f"{stem}.html", markdown=path / f"{stem}.md",
                       figures=tuple(path / n for n in names))
