"""``distcheck certify --report DIR``: HTML and Markdown that open with a summary per target, group the
failures per property (one replay command each), then list every row. Read back by parsing both files."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from distcheck.certify.certificate import Certificate
from distcheck.certify.engine import certify
from distcheck.certify.hangs import HUNG_REASON
from distcheck.certify.report import write_certify_report
from distcheck.core.errors import WorldTimeout
from tests.addition_contract import AdditionContract, add_without_carry
from tests.addition_contract import good_add as add

ROOT = Path(__file__).resolve().parent.parent


class _Tables(HTMLParser):
    """Every <table> of a page: (caption, header cells, body rows of cells), in document order."""

    def __init__(self):
        super().__init__()
        self.tables: list[tuple[str, list[str], list[list[str]]]] = []
        self._cell: list[str] | None = None
        self._row: list[str] | None = None
        self._in_caption = False
        self._in_head = False

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append(("", [], []))
        elif tag == "caption":
            self._in_caption = True
        elif tag == "thead":
            self._in_head = True
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "caption":
            self._in_caption = False
        elif tag == "thead":
            self._in_head = False
        elif tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            caption, head, body = self.tables[-1]
            if self._in_head:
                head.extend(self._row)
            else:
                body.append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._in_caption:
            caption, head, body = self.tables[-1]
            self.tables[-1] = (caption + data, head, body)
        elif self._cell is not None:
            self._cell.append(data)


def html_tables(path: Path) -> list[tuple[str, list[dict[str, str]]]]:
    parser = _Tables()
    parser.feed(path.read_text())
    return [(caption, [dict(zip(head, row, strict=True)) for row in body]) for caption, head, body in parser.tables]


def md_tables(path: Path) -> list[tuple[str, list[dict[str, str]]]]:
    """Every ``## title`` followed by a pipe table, cells split on unescaped pipes."""
    out = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("## ") and i + 2 < len(lines) and lines[i + 2].startswith("| "):
            def cells(text):
                return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", text.strip())[1:-1]]

            head = cells(lines[i + 2])
            body = []
            for row in lines[i + 4:]:
                if not row.startswith("| "):
                    break
                body.append(dict(zip(head, cells(row), strict=True)))
            out.append((line[3:], body))
    return out


# ----------------------------------------------------------------------------- in process


class CarryContract(AdditionContract):
    """The addition contract in two dtypes: ``f(a, b) == a + b`` (fails for sums from 16) and symmetry."""

    name = "test-report-add"
    dtypes = ("float64", "float32")


def test_the_report_opens_with_the_targets_and_groups_failures_per_property(tmp_path):
    cert = certify(add_without_carry, CarryContract(), examples=40, seed=3)
    doc = Certificate([cert], command="distcheck certify m:f --seed 3")
    files = write_certify_report(tmp_path / "rep", doc)
    assert (files.html.name, files.markdown.name) == ("report.html", "report.md")
    replay = next(v.reproduce for v in cert.failures)
    for tables in (html_tables(files.html), md_tables(files.markdown)):
        rows_of = f"Rows: {cert.target} under test-report-add"
        assert [caption for caption, _ in tables] == ["Targets", "Failures, one row per property", rows_of]
        (target,) = tables[0][1]
        assert target["verdict"] == "FAILED" and target["failing properties"] == "sum"
        assert (target["seed"], target["profile"], target["torch"]) == ("3", "ci", str(doc.environment["torch"]))
        assert target["rows"] == "2 passed, 2 failed, 0 skipped"
        (failure,) = tables[1][1]  # one row for sum, though it failed in two dtypes
        assert failure["property"] == "test-report-add.sum"
        assert failure["failed at"] == "float64, float32 at world size 1" and failure["replay"] == replay
        assert re.fullmatch(r"f\((0, 16|16, 0)\) = 0", failure["reason (the first failure)"])
        rows = tables[2][1]  # grouped by target, property by property; a shared detail shown once
        assert [(r["check"], r["verdict"], r["detail"]) for r in rows] == [
            ("test-report-add.sum[float64]", "FAIL", "failure 1 (above)"),
            ("test-report-add.sum[float32]", "FAIL", "as above"),
            ("test-report-add.symmetric[float64]", "pass", "f(a, b) == f(b, a) (exact)"),
            ("test-report-add.symmetric[float32]", "pass", "as above")]
    page = files.html.read_text()
    assert page.count("--dtypes float64") == 1  # the replay command once, not per dtype
    assert page.count("f(a, b) == f(b, a)") == 1  # a shared detail once
    assert page.index("<caption>Targets</caption>") < page.index(f"<caption>{rows_of}</caption>")


def test_a_hang_shows_its_stacks_and_the_skips(tmp_path):
    class HangsInFloat32:
        world_size, backend = 2, "fake"

        def run(self, fn, contract, target, case, dtype, options):
            if dtype == "float32":
                raise WorldTimeout("step did not finish within timeout_s=3: ranks [0, 1] stuck", ranks=[0, 1],
                                   stacks={0: '  File "layer.py", line 7 in forward\n', 1: '  File "layer.py", line 9'},
                                   timeout_s=3.0)
            return [fn(None, contract, target, case, dtype, options)] * 2

    cert = certify(add, CarryContract(), world=HangsInFloat32(), examples=10, seed=1)
    files = write_certify_report(tmp_path, Certificate([cert], command="c"))
    for tables in (html_tables(files.html), md_tables(files.markdown)):
        by = dict(tables)
        rows_of = f"Rows: {cert.target} under test-report-add"
        assert list(by) == ["Targets", "Failures, one row per property", "Stacks of the stuck ranks", rows_of]
        assert [(r["rank"], r["stack"]) for r in by["Stacks of the stuck ranks"]] == [
            ("0", 'File "layer.py", line 7 in forward'), ("1", 'File "layer.py", line 9')]
        (failure,) = by["Failures, one row per property"]
        assert failure["failed at"] == "float32 at world size 2" and failure["case"].endswith("(it hung)")
        assert [r["verdict"] for r in by[rows_of]] == ["pass", "FAIL", "pass", "skip"]
        skips = [r for r in by[rows_of] if r["verdict"] == "skip"]
        assert skips and all(r["detail"].startswith(f"skip: {HUNG_REASON}") for r in skips)


# ----------------------------------------------------------------------------- the command line


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "distcheck", "certify", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_report_folder_that_cannot_be_one_is_bad_input(tmp_path):
    (tmp_path / "file").write_text("x")
    for bad in (tmp_path / "file", tmp_path / "missing" / "rep"):
        proc = _cli("examples.my_tp_layers:RowParallelLinear", "--contract", "row-parallel-linear",
                    "--report", str(bad))
        assert proc.returncode == 2 and proc.stderr.startswith("distcheck: error: --report="), proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.multiprocess
def test_cli_report_of_a_failing_layer(tmp_path):
    torch = pytest.importorskip("torch")
    proc = _cli("examples.my_tp_layers:RowParallelBiasEveryRank", "--contract", "row-parallel-linear", "--backend",
                "threaded", "--world-sizes", "2,3", "--dtypes", "float64,float32", "--examples", "5",
                "--report", str(tmp_path / "rep"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    html = tmp_path / "rep" / "report.html"
    for tables in (html_tables(html), md_tables(tmp_path / "rep" / "report.md")):
        by = dict(tables)
        rows_of = "Rows: examples.my_tp_layers:RowParallelBiasEveryRank under row-parallel-linear"
        assert list(by)[0] == "Targets" and list(by)[-1] == rows_of
        (target,) = by["Targets"]
        assert target["verdict"] == "FAILED" and target["failing properties"] == "forward"
        assert (target["seed"], target["profile"], target["torch"]) == ("0", "ci", torch.__version__)
        (failure,) = by["Failures, one row per property"]
        assert failure["failed at"] == "float64, float32 at world size 2; float64, float32 at world size 3"
        assert failure["replay"].endswith("--world-sizes 2 --backend threaded --seed 0 --profile ci --examples 5 "
                                          "--dtypes float64")
        assert sum(r["verdict"] == "FAIL" for r in by[rows_of]) == 4 and len(by[rows_of]) == 20
    assert html.read_text().count("--world-sizes 2 --backend threaded") == 1  # the replay command, once
