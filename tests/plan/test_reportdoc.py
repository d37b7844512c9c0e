"""Reports: every table and figure in the HTML and the Markdown, escaping, atomic writes."""

from __future__ import annotations

import base64
import io
import os
from html.parser import HTMLParser

import pytest

from distcheck.report import FAIL, PASS, CheckResult
from distcheck.reportdoc import FigureImage, Table, atomic_write, write_report

mpl_image = pytest.importorskip("matplotlib.image")


class _Doc(HTMLParser):
    """Collects the tables (caption, header, rows) and the images of an HTML document."""

    def __init__(self):
        super().__init__()
        self.tables, self.images, self.scripts, self.links = [], [], 0, []
        self._cell = None
        self._caption = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self.tables.append({"caption": "", "head": [], "rows": []})
        elif tag == "caption":
            self._caption = ""
        elif tag == "tr":
            self.tables[-1]["rows"].append([])
        elif tag in ("td", "th"):
            self._cell = ""
        elif tag == "img":
            self.images.append(a)
        elif tag == "script":
            self.scripts += 1
        elif tag == "link" or (tag in ("iframe", "object", "embed")):
            self.links.append(a)

    def handle_endtag(self, tag):
        if tag == "caption":
            self.tables[-1]["caption"], self._caption = self._caption, None
        elif tag in ("td", "th"):
            self.tables[-1]["rows"][-1].append(self._cell)
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data
        if self._caption is not None:
            self._caption += data


def _figure(name: str) -> FigureImage:
    from distcheck.parallel import pp as pipeline
    from distcheck.reportdoc import figure_image
    from distcheck.viz import pipeline_gantt

    return figure_image(pipeline_gantt(pipeline.simulate("gpipe", 2, 2)), f"Gantt {name}", name)


def _rows():
    return [CheckResult("pp.bubble", "reference", PASS, examples=3, detail="3/7 = 3/7"),
            CheckResult("x<script>alert(1)</script>", "golden", FAIL, max_error=0.5, detail="a | b & <c>")]


def test_html_holds_every_table_and_every_image_decodes(tmp_path):
    extra = Table("Layouts", ("tp", "pp", "GB"), (("8", "2", "68.98"), ("4", "4", "68.98")), note="GB = 1e9 bytes")
    files = write_report(tmp_path / "r", "My plan", results=_rows(), tables=[extra],
                         figures=[_figure("one"), _figure("two")], notes=["first note"], summary="1 passed, 1 failed")
    doc = _Doc()
    doc.feed(files.html.read_text())
    assert [t["caption"] for t in doc.tables] == ["Results", "Layouts"]
    results, layouts = doc.tables
    assert results["rows"][0] == ["check", "backend", "world size", "examples", "verdict", "max error", "bound",
                                  "detail"]
    assert results["rows"][2][0] == "x<script>alert(1)</script>" and results["rows"][2][7] == "a | b & <c>"
    assert layouts["rows"][1:] == [["8", "2", "68.98"], ["4", "4", "68.98"]]
    assert doc.scripts == 0 and doc.links == []  # the escaped <script> stayed text
    assert len(doc.images) == 2
    for img in doc.images:
        src = img["src"]
        assert src.startswith("data:image/png;base64,")
        pixels = mpl_image.imread(io.BytesIO(base64.b64decode(src.split(",", 1)[1])), format="png")
        assert (pixels.shape[1], pixels.shape[0]) == (int(img["width"]), int(img["height"]))
    text = files.html.read_text()
    assert "default-src 'none'" in text and "http://" not in text and "https://" not in text
    assert "first note" in text and "1 passed, 1 failed" in text


def test_markdown_has_the_tables_and_figure_files_beside_it(tmp_path):
    files = write_report(tmp_path, "T", results=_rows(), figures=[_figure("gantt")])
    md = files.markdown.read_text()
    assert files.markdown.parent == tmp_path and [p.name for p in files.figures] == ["report-gantt.png"]
    assert "![Figure 1. Gantt gantt](report-gantt.png)" in md
    pixels = mpl_image.imread(str(tmp_path / "report-gantt.png"))
    assert pixels.shape[0] > 50
    lines = [ln for ln in md.splitlines() if ln.startswith("| ")]
    assert lines[0] == "| check | backend | world size | examples | verdict | max error | bound | detail |"
    assert lines[2].endswith("| a \\| b & <c> |")  # the pipe escaped, the rest as written
    assert len(lines) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report-gantt.png", "report.html", "report.md"]


def test_report_folder_rules(tmp_path):
    from distcheck.core.errors import ConfigError

    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        write_report(tmp_path / "file", "t")
    with pytest.raises(ConfigError, match="does not exist"):
        write_report(tmp_path / "no" / "dir", "t")
    with pytest.raises(ConfigError, match="cells must match"):
        Table("t", ("a", "b"), (("1",),))


def test_atomic_write_replaces_whole_files_and_leaves_nothing_when_interrupted(tmp_path, monkeypatch):
    target = tmp_path / "report.html"
    atomic_write(target, "old")
    assert target.read_text() == "old"

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, "new " * 1000)
    monkeypatch.undo()
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]  # the temporary file is gone
    atomic_write(target, b"\x00new")
    assert target.read_bytes() == b"\x00new"
    with pytest.raises(IsADirectoryError):
        atomic_write(tmp_path, "x")
    with pytest.raises(TypeError):
        atomic_write(target, 3)  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_atomic_write_uses_the_umask_like_open(tmp_path):
    old = os.umask(0o027)
    try:
        path = atomic_write(tmp_path / "x.md", "x")
    finally:
        os.umask(old)
    assert oct(path.stat().st_mode & 0o777) == oct(0o640)


def test_a_write_that_fails_midway_leaves_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "fig.png"
    target.write_bytes(b"old")
    real_fdopen = os.fdopen

    class Broken(io.BufferedWriter):
        def write(self, data):
            raise OSError(28, "No space left on device")

    def fdopen(fd, mode="r"):
        return Broken(real_fdopen(fd, mode, buffering=0))

    monkeypatch.setattr(os, "fdopen", fdopen)
    with pytest.raises(OSError, match="No space"):
        atomic_write(target, b"new")
    monkeypatch.undo()
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["fig.png"]
