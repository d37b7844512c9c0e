"""Killed while writing its outputs (SIGKILL, SIGTERM, SIGINT at drawn delays), a run leaves the
complete old set or the complete new one, and the next run leaves no staging folder behind.

The fast test kills a process that rewrites a report and a certificate pair in a loop (many kills a
second, so the signal lands inside the writes); the slow one kills the real ``distcheck check
--report`` and ``distcheck certify --certificate`` near the end of their run, where they write."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distcheck.core.outputs import staging_leftovers, sweep

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)

LOOP = r"""
import struct, sys, zlib
from distcheck.core.outputs import write_files
from distcheck.reportdoc import FigureImage, Table, write_report
ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
PNG = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
folder = sys.argv[1]
n = int(sys.argv[2])
while True:
    n += 1
    tag = f"gen-{n}-"
    write_report(f"{folder}/rep", tag, tables=[Table("t", ("a",), ((tag * 500,),))],
                 figures=[FigureImage(tag, "f", PNG)])
    write_files({f"{folder}/c.json": (tag * 500).encode(), f"{folder}/c.md": (tag * 500).encode()})
"""


def _generations(folder: Path) -> set[str]:
    rep = folder / "rep"
    texts = [(rep / "report.md").read_text(), (rep / "report.html").read_text()]
    tags = {m for t in texts for m in re.findall(r"gen-[0-9]+-", t)}
    pair = {re.findall(r"gen-[0-9]+-", (folder / name).read_text())[0] for name in ("c.json", "c.md")}
    assert len(tags) == 1, f"a mixed report: {tags}"
    assert len(pair) == 1, f"a mixed certificate pair: {pair}"
    return tags | pair


def _child_signals_default() -> None:
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    signal.signal(signal.SIGINT, signal.default_int_handler)


def test_a_killed_writer_leaves_the_old_set_or_the_new_one(tmp_path):
    rng = random.Random(23)
    subprocess.run([sys.executable, "-c", LOOP.replace("while True", "for _ in range(1)"), str(tmp_path), "0"],
                   check=True, env=ENV, cwd=ROOT, timeout=120)
    for i in range(12):
        sig = SIGNALS[i % 3]
        proc = subprocess.Popen([sys.executable, "-c", LOOP, str(tmp_path), str(1000 * (i + 1))], env=ENV, cwd=ROOT,
                                stderr=subprocess.DEVNULL, preexec_fn=_child_signals_default)
        time.sleep(0.5 + rng.uniform(0.0, 0.5))  # past the imports, inside the loop of writes
        proc.send_signal(sig)
        proc.wait(timeout=60)
        if sig == signal.SIGKILL:  # between the pair's renames nothing runs: the next run's sweep finishes
            sweep(tmp_path)        # the committed set first (SIGINT and SIGTERM wait for the renames)
        _generations(tmp_path)
    subprocess.run([sys.executable, "-c", LOOP.replace("while True", "for _ in range(1)"), str(tmp_path), "99999"],
                   check=True, env=ENV, cwd=ROOT, timeout=120)
    assert _generations(tmp_path) == {"gen-100000-"}
    assert staging_leftovers(tmp_path) == [] and staging_leftovers(tmp_path / "rep") == []


def _report_stamp(rep: Path) -> str:
    """The summary line of a check report, the same in both files (a mixed pair fails here), with report.md's
    modification time: two runs can print the same seconds, never write the file at the same instant."""
    md, page = (rep / "report.md").read_text(), (rep / "report.html").read_text()
    stamps = {m for t in (md, page) for m in re.findall(r"[0-9]+ passed, [^<\n]*? in [0-9.]+s", t)}
    assert len(stamps) == 1, f"a mixed report: {stamps}"
    return f"{stamps.pop()} @ {(rep / 'report.md').stat().st_mtime_ns}"


def _certificate_stamp(folder: Path) -> str:
    created = {m for n in ("a.json", "a.md") for m in re.findall(r"20[0-9-]+T[0-9:]+\+00:00", (folder / n).read_text())}
    assert len(created) == 1, f"a mixed certificate pair: {created}"
    return created.pop()


CHECK = ["check", "--only", "golden", "--report", "{out}/rep", "--quiet"]
CERTIFY = ["certify", "examples.my_pipeline_schedules:one_f_one_b", "--contract", "pipeline-table", "--option",
           "schedule=1f1b", "--certificate", "{out}/a.json", "--certificate", "{out}/a.md"]


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "stamp"), [(CHECK, lambda out: _report_stamp(out / "rep")),
                                             (CERTIFY, _certificate_stamp)], ids=["check", "certify"])
def test_a_killed_command_leaves_a_whole_set(tmp_path, argv, stamp):
    cmd = [sys.executable, "-m", "distcheck", *(a.format(out=tmp_path) for a in argv)]

    def run() -> float:
        start = time.monotonic()
        subprocess.run(cmd, check=True, env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, timeout=300)
        return time.monotonic() - start

    took = run()
    seen = {stamp(tmp_path)}
    rng = random.Random(2023)
    for sig in SIGNALS:
        for _ in range(2):
            proc = subprocess.Popen(cmd, env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    preexec_fn=_child_signals_default)
            time.sleep(max(0.0, took + rng.uniform(-0.5, 0.1)))  # near the end, where the outputs are written
            proc.send_signal(sig)
            proc.wait(timeout=120)
            seen.add(stamp(tmp_path))
    time.sleep(1.0)  # a new second: the last run's stamp is its own
    run()
    assert stamp(tmp_path) not in seen
    assert staging_leftovers(tmp_path) == []
