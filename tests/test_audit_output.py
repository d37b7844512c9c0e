"""``distcheck audit --output``: the report is written whole or not at all, and its temporary file is
removed on every exit path, SIGTERM and SIGINT included (distcheck.core.atomic, docs/AUDIT.md)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from distcheck import cli
from distcheck.core.atomic import write_text_atomic
from distcheck.core.errors import ConfigError

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
# interrupt the write once the whole report is in the temporary file, just before the rename:
# os.replace announces itself with a marker file and waits for the signal
_SLOW_RENAME = textwrap.dedent("""
    import os, sys, time
    marker = sys.argv[1]
    def replace(src, dst):
        open(marker, "w").close()
        time.sleep(120)
    os.replace = replace
    from distcheck.cli import main
    sys.exit(main(sys.argv[2:]))
""")


def _hidden(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.startswith("."))


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig, code, message", [
    (signal.SIGTERM, 143, "distcheck: terminated"),
    (signal.SIGINT, 130, "distcheck: interrupted"),
])
def test_a_signal_during_the_write_leaves_no_temporary_file_and_the_old_report(tmp_path, sig, code, message):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    report = out_dir / "report.json"
    report.write_text("old report\n")
    marker = tmp_path / "writing"
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_RENAME, str(marker), "audit", *map(str, sorted(GOLDEN.glob("*.toml"))),
         "--output", str(report)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the audit never reached the write"
            time.sleep(0.05)
        (tmp,) = _hidden(out_dir)  # the full report sits in its hidden temporary file
        assert tmp.stat().st_size > 50_000
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert (proc.returncode, err.strip()) == (code, message)
    assert _hidden(out_dir) == []
    assert [p.name for p in out_dir.iterdir()] == ["report.json"]
    assert report.read_text() == "old report\n"


def test_a_failing_rename_leaves_no_temporary_file(tmp_path, monkeypatch, capsys):
    report = tmp_path / "report.md"

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    code = cli.main(["audit", str(GOLDEN / "zero_paper.toml"), "--output", str(report)])
    assert code == 2
    assert capsys.readouterr().err == f"distcheck: error: --output {report}: Permission denied\n"
    assert list(tmp_path.iterdir()) == []


def test_keyboard_interrupt_inside_the_write_leaves_no_temporary_file(tmp_path, monkeypatch, capsys):
    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    code = cli.main(["audit", str(GOLDEN / "zero_paper.toml"), "--output", str(tmp_path / "r.json")])
    assert code == 130 and capsys.readouterr().err == "distcheck: interrupted\n"
    assert list(tmp_path.iterdir()) == []


def test_the_report_is_written_whole_with_the_usual_permissions(tmp_path):
    report = tmp_path / "r.json"
    assert cli.main(["audit", str(GOLDEN / "zero_paper.toml"), "--output", str(report)]) == 0
    assert json.loads(report.read_text())[0]["title"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(report.stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_write_text_atomic_replaces_and_refuses_bad_arguments(tmp_path):
    target = tmp_path / "t.txt"
    target.write_text("old")
    write_text_atomic(target, "new\n")
    assert target.read_text() == "new\n" and [p.name for p in tmp_path.iterdir()] == ["t.txt"]
    with pytest.raises(ConfigError, match="path=3 must be a file path"):
        write_text_atomic(3, "x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="text='bytes' must be a str"):
        write_text_atomic(target, b"x")  # type: ignore[arg-type]
    with pytest.raises(IsADirectoryError):
        write_text_atomic(tmp_path, "x")
    with pytest.raises(LookupError):
        write_text_atomic(target, "x", encoding="no-such-codec")
    assert target.read_text() == "new\n" and [p.name for p in tmp_path.iterdir()] == ["t.txt"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
@pytest.mark.timeout(60)
def test_output_to_a_named_pipe_is_refused_and_the_pipe_kept(tmp_path, capsys):
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    assert cli.main(["audit", str(GOLDEN / "zero_paper.toml"), "--output", str(fifo)]) == 2
    err = capsys.readouterr().err
    assert err == f"distcheck: error: --output='{fifo}' is a named pipe; it must be a regular file or a new path\n"
    assert stat.S_ISFIFO(fifo.stat().st_mode) and [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_output_through_a_symlink_is_refused_before_the_work(tmp_path, capsys):
    real = tmp_path / "real.md"
    real.write_text("old")
    link = tmp_path / "link.md"
    link.symlink_to(real)
    assert cli.main(["audit", str(GOLDEN / "zero_paper.toml"), "--output", str(link)]) == 2
    assert capsys.readouterr().err == (f"distcheck: error: --output='{link}' is a symbolic link; "
                                       "it must be a regular file or a new path\n")
    assert link.is_symlink() and real.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.md", "real.md"]
