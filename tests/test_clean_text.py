"""Text from input files reaches a terminal and an HTML page with its control characters made visible
(``ESC [2J`` in a key's title shows as ``\\x1b[2J``), and an error line echoing a 5,000-digit value
stays short."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from distcheck.cli import main
from distcheck.core.results import CheckResult
from distcheck.core.text import clean, shorten
from distcheck.report import render_table

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
ESC = "\x1b"


@pytest.fixture
def evil_key(tmp_path) -> Path:
    text = (GOLDEN / "zero_paper.toml").read_text()
    start = text.index("\ntitle = ") + 1
    end = text.index("\n", start)
    key = tmp_path / "evil.toml"
    key.write_text(text[:start] + 'title = "evil \\u001b[2J\\u009b key"' + text[end:])
    return key


def test_a_keys_title_reaches_the_terminal_and_the_report_escaped(evil_key, tmp_path, capsys):
    assert main(["audit", str(evil_key), "--report", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert ESC not in out and "\x9b" not in out and "evil \\x1b[2J\\x9b key" in out
    for name in ("report.html", "report.md"):
        text = (tmp_path / "rep" / name).read_text()
        assert ESC not in text and "\x9b" not in text and "\\x1b[2J" in text, name


def test_the_check_table_shows_control_characters_escaped():
    out = io.StringIO()
    from rich.console import Console

    rows = [CheckResult(check=f"key.{ESC}[2Jclaim", backend="golden", verdict="FAIL", detail=f"bad {ESC}]0;title\x07")]
    for width in (200, 80):  # the table, and the narrow one-line form
        render_table(rows, console=Console(file=out, force_terminal=False, width=width))
    text = out.getvalue()
    assert ESC not in text and "\x07" not in text and "\\x1b[2Jclaim" in text


@pytest.mark.parametrize("argv", [["check", "--seed", "9" * 5000], ["check", "--world-sizes", "9" * 5000],
                                  ["plan", "pp", "--p", "9" * 5000, "--m", "8"]])
def test_an_error_echoing_a_huge_value_is_one_short_line(capsys, argv):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors exit from parse_args
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 400 and "(5,000 digits)" in err, err[:400]


def test_clean_and_shorten():
    assert clean("a\tb\nc\x00\x7f\x85") == "a\tb\nc\\x00\\x7f\\x85"
    assert shorten("x=" + "1" * 41 + " y=" + "2" * 40) == "x=1111111111...1111 (41 digits) y=" + "2" * 40
