"""Outputs as one unit (:mod:`distcheck.core.outputs`): a report folder swapped whole, a certificate
pair renamed in as one set, leftovers of killed runs swept (only ours, only dead ones), and the one
rule for output targets (a link, a pipe, a folder where a file goes, a read-only target: exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from distcheck.cli import main
from distcheck.core.errors import ConfigError
from distcheck.core.outputs import STAGE_TAG, check_output_target, staging_leftovers, sweep, write_files, write_folder
from distcheck.reportdoc import Table, write_report


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _leftover(folder: Path, name: str, pid: int, suffix: str = "") -> Path:
    stage = folder / f".{name}.{STAGE_TAG}.{pid}.{'ab' * 6}{suffix}"
    stage.mkdir()
    (stage / "report.md").write_text("half")
    return stage


def test_a_report_replaces_the_whole_old_set_and_keeps_other_files(tmp_path):
    out = tmp_path / "rep"
    write_report(out, "one", tables=[Table("t", ("a",), (("old",),))])
    (out / "report-old-figure.png").write_bytes(b"old figure")  # a file of the old report: goes
    (out / "notes.txt").write_text("mine")  # not the report's: carried over
    write_report(out, "two", tables=[Table("t", ("a",), (("new",),))])
    assert sorted(os.listdir(out)) == ["notes.txt", "report.html", "report.md"]
    assert "two" in (out / "report.md").read_text() and "two" in (out / "report.html").read_text()
    assert (out / "notes.txt").read_text() == "mine"
    assert staging_leftovers(tmp_path) == []


def test_the_folder_swap_is_one_rename_of_the_folder(tmp_path):
    out = tmp_path / "rep"
    write_folder(out, {"report.md": b"old", "report.html": b"old"})
    inode = os.stat(out).st_ino
    write_folder(out, {"report.md": b"new", "report.html": b"new"})
    assert os.stat(out).st_ino != inode  # a new folder took the name: the set changed in one step
    assert {n: (out / n).read_bytes() for n in os.listdir(out)} == {"report.md": b"new", "report.html": b"new"}


def test_sweep_removes_only_our_leftovers_of_dead_runs(tmp_path):
    dead = _leftover(tmp_path, "rep", _dead_pid())
    alive = _leftover(tmp_path, "rep", os.getppid())
    other = tmp_path / ".rep.other-tool.123.abababababab"
    other.mkdir()
    plain_tmp = tmp_path / ".report.md.abcdef.tmp"
    plain_tmp.write_text("not ours to judge")
    assert sweep(tmp_path) == [dead]
    assert not dead.exists() and alive.exists() and other.exists() and plain_tmp.exists()


def test_sweep_puts_back_a_folder_moved_aside_by_a_killed_swap(tmp_path):
    aside = _leftover(tmp_path, "rep", _dead_pid(), ".old")
    sweep(tmp_path)
    assert (tmp_path / "rep" / "report.md").read_text() == "half" and not aside.exists()


def test_a_committed_file_set_is_finished_by_the_next_run(tmp_path):
    (tmp_path / "c.json").write_text("old")
    (tmp_path / "c.md").write_text("new")  # renamed in before the kill
    stage = tmp_path / f".c.json.{STAGE_TAG}.{_dead_pid()}.{'cd' * 6}"
    stage.mkdir()
    (stage / "c.json").write_text("new")
    (stage / ".committed").write_text("")
    sweep(tmp_path)
    assert (tmp_path / "c.json").read_text() == "new" and not stage.exists()


def test_write_files_writes_the_set_and_leaves_nothing(tmp_path):
    (tmp_path / "sub").mkdir()
    write_files({tmp_path / "c.json": b"{}", tmp_path / "sub" / "c.md": b"# c"})
    assert (tmp_path / "c.json").read_bytes() == b"{}" and (tmp_path / "sub" / "c.md").read_bytes() == b"# c"
    assert sorted(os.listdir(tmp_path)) == ["c.json", "sub"] and os.listdir(tmp_path / "sub") == ["c.md"]


def _targets(tmp_path: Path) -> dict[str, Path]:
    plain = tmp_path / "plain.json"
    plain.write_text("x")
    ro = tmp_path / "ro.json"
    ro.write_text("x")
    ro.chmod(0o444)
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    link = tmp_path / "link.json"
    link.symlink_to(plain)
    folder = tmp_path / "folder.json"
    folder.mkdir()
    ro_dir = tmp_path / "ro-dir"
    ro_dir.mkdir()
    ro_dir.chmod(0o555)
    return {"plain": plain, "ro": ro, "fifo": fifo, "link": link, "folder": folder, "ro_dir": ro_dir}


@pytest.mark.parametrize(("name", "folder", "words"), [
    ("ro", False, "read-only"), ("fifo", False, "named pipe"), ("link", False, "symbolic link"),
    ("folder", False, "a folder"), ("plain", True, "is a file"), ("ro_dir", True, "read-only"),
    ("link", True, "symbolic link"), ("fifo", True, "named pipe")])
def test_the_one_rule_for_output_targets(tmp_path, name, folder, words):
    t = _targets(tmp_path)
    with pytest.raises(ConfigError, match=words) as info:
        check_output_target("--flag", t[name], folder=folder)
    assert str(info.value).startswith("--flag=")


def test_new_targets_and_a_file_in_a_read_only_folder(tmp_path):
    t = _targets(tmp_path)
    assert check_output_target("--flag", tmp_path / "new.json") == tmp_path / "new.json"
    assert check_output_target("--flag", tmp_path / "new-dir", folder=True) == tmp_path / "new-dir"
    with pytest.raises(ConfigError, match="read-only folder"):
        check_output_target("--flag", t["ro_dir"] / "new.json")


def test_a_report_folder_holding_a_sub_folder_or_the_current_folder_is_refused(tmp_path, monkeypatch):
    (tmp_path / "rep" / "sub").mkdir(parents=True)
    with pytest.raises(ConfigError, match="holds 'sub'"):
        check_output_target("--report", tmp_path / "rep", folder=True)
    monkeypatch.chdir(tmp_path / "rep" / "sub")
    with pytest.raises(ConfigError, match="current folder"):
        check_output_target("--report", tmp_path / "rep", folder=True)


@pytest.mark.parametrize("argv", [
    ["audit", "chapter", "--output", "{ro}"],
    ["check", "--only", "golden", "--report", "{ro_dir}"],
    ["audit", "chapter", "--report", "{link}"],
    ["plan", "pp", "--p", "4", "--m", "8", "--figure", "{link}"],
])
def test_every_command_refuses_before_the_work(tmp_path, capsys, argv):
    t = {k: str(v) for k, v in _targets(tmp_path).items()}
    before = {p: p.stat().st_mtime_ns for p in tmp_path.iterdir() if not p.is_symlink() and not p.is_fifo()}
    assert main([a.format(**t) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("distcheck: error: --"), err
    assert {p: p.stat().st_mtime_ns for p in before} == before


def test_certify_refuses_a_named_pipe_certificate_at_once(tmp_path):
    fifo = tmp_path / "c.json"
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-m", "distcheck", "certify", "examples.my_pipeline_schedules:one_f_one_b",
                           "--contract", "pipeline-table", "--option", "schedule=1f1b", "--certificate", str(fifo)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == 2 and proc.stderr.startswith("distcheck: error: --certificate="), proc.stderr
    assert fifo.is_fifo()


def test_without_the_exchange_call_the_swap_still_replaces_the_set(tmp_path, monkeypatch):
    import distcheck.core.outputs as outputs

    out = tmp_path / "rep"
    write_folder(out, {"report.md": b"old"})
    monkeypatch.setattr(outputs, "_exchange", lambda a, b: False)  # a system without renameat2
    write_folder(out, {"report.md": b"new"})
    assert (out / "report.md").read_bytes() == b"new" and staging_leftovers(tmp_path) == []


def test_a_failed_write_keeps_the_old_set_and_leaves_nothing(tmp_path):
    out = tmp_path / "rep"
    write_folder(out, {"report.md": b"old"})
    with pytest.raises(OSError):
        write_folder(out, {"report.md": b"new", "sub/x.png": b"no such folder in the stage"})
    with pytest.raises(OSError):
        write_files({tmp_path / "c.json": b"new", tmp_path / "missing" / "c.md": b"new"})
    assert (out / "report.md").read_bytes() == b"old" and not (tmp_path / "c.json").exists()
    assert staging_leftovers(tmp_path) == []
