"""Exit 0 means checked: code of the user's that distcheck runs in its own process (a target's module while it
is imported, a module ``__getattr__`` that resolves the target, a world-free contract's call of the target)
cannot end the run as if it had passed by calling ``sys.exit(0)`` or raising ``KeyboardInterrupt`` or another
``BaseException``. Importing or resolving is bad input (exit 2, one line naming the target); a call is the
target's failure (a FAIL row, exit 1), as on a rank of a real world. A real Ctrl-C still interrupts (130)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from distcheck.cli import main

ROOT = Path(__file__).resolve().parent.parent
_names = itertools.count()

#: module bodies that end their import with something other than an Exception
AT_IMPORT = {
    "exit0": ("import sys\nsys.exit(0)\n", "SystemExit(0): its code calls sys.exit while it is imported"),
    "exit-none": ("import sys\nsys.exit()\n", "SystemExit(None)"),
    "keyboard-interrupt": ("raise KeyboardInterrupt\n", "KeyboardInterrupt (raised while it is imported)"),
    "base-exception": ("class Stop(BaseException):\n    pass\nraise Stop('halt')\n",
                       "Stop: halt (raised while it is imported)"),
    "getattr-exit": ("import sys\ndef __getattr__(name):\n    sys.exit(0)\n",
                     "cannot be looked up: SystemExit(0): its code calls sys.exit while it is looked up"),
}


def _module(tmp_path: Path, monkeypatch, body: str) -> str:
    """A module of ``body`` in ``tmp_path``, importable under a name used once."""
    name = f"zz_user_exit_{os.getpid()}_{next(_names)}"
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


@pytest.mark.parametrize("kind", list(AT_IMPORT))
def test_a_target_that_exits_while_imported_is_bad_input_naming_it(kind, tmp_path, monkeypatch, capsys):
    body, said = AT_IMPORT[kind]
    target = f"{_module(tmp_path, monkeypatch, body)}:Layer"
    code = main(["certify", target, "--contract", "row-parallel-linear"])
    out, err = capsys.readouterr()
    line = _one_line(err)
    assert code == 2 and out == "", out
    assert line.startswith(f"distcheck: error: target={target!r} cannot be ") and said in line, line


def test_distcheck_check_fails_a_pyproject_target_that_exits_while_imported(tmp_path, monkeypatch, capsys):
    name = _module(tmp_path, monkeypatch, AT_IMPORT["exit0"][0])
    (tmp_path / "pyproject.toml").write_text(
        f'[[tool.distcheck.certify]]\ntarget = "{name}:Layer"\ncontract = "pipeline-table"\n')
    monkeypatch.chdir(tmp_path)
    code = main(["check", "--only", "certify", "--quiet", "--format", "json"])
    rows = json.loads(capsys.readouterr().out)
    assert code == 1 and [r["verdict"] for r in rows] == ["FAIL"]  # the stage's error is its FAIL row
    assert f"target='{name}:Layer' cannot be imported: SystemExit(0)" in rows[0]["detail"], rows


CALLED = {
    "exit0": ("import sys\n", "sys.exit(0)", "rank 0 raised SystemExit: 0"),
    "keyboard-interrupt": ("", "raise KeyboardInterrupt", "rank 0 raised KeyboardInterrupt"),
}


@pytest.mark.parametrize("kind", list(CALLED))
def test_a_world_free_target_that_exits_when_called_fails(kind, tmp_path, monkeypatch, capsys):
    head, stop, said = CALLED[kind]
    body = head + textwrap.dedent(f"""
        def schedule(p, m):
            {stop}
    """)
    target = f"{_module(tmp_path, monkeypatch, body)}:schedule"
    code = main(["certify", target, "--contract", "pipeline-table", "--option", "schedule=1f1b", "--examples", "3",
                 "--format", "json"])
    rows = json.loads(capsys.readouterr().out)
    assert code == 1
    assert rows and {r["verdict"] for r in rows} == {"FAIL"} and all(said in r["detail"] for r in rows), rows[0]


def test_code_that_exits_anywhere_else_in_a_command_never_exits_0(monkeypatch, capsys):
    # what no guard closer to the user's code caught: main() reports it and exits 1, never with its code
    def exits(args):
        sys.exit(0)

    monkeypatch.setattr("distcheck.certify.cli.run", exits)
    code = main(["certify", "a:b", "--contract", "pipeline-table"])
    line = _one_line(capsys.readouterr().err)
    assert code == 1 and "called sys.exit(0)" in line and "`distcheck certify`" in line, line


def _console(args: list[str], cwd: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(cwd), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, "-m", "distcheck", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_the_console_script_exits_2_for_a_target_that_calls_sys_exit_0(tmp_path):
    (tmp_path / "exits_at_import.py").write_text(AT_IMPORT["exit0"][0])
    proc = _console(["certify", "exits_at_import:Layer", "--contract", "row-parallel-linear"], tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and out == ""
    assert "target='exits_at_import:Layer' cannot be imported: SystemExit(0)" in _one_line(err)


def test_a_real_ctrl_c_while_a_target_is_imported_still_interrupts(tmp_path):
    started = tmp_path / "importing"
    (tmp_path / "slow_import.py").write_text(f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\n"
                                             "time.sleep(120)\n")
    proc = _console(["certify", "slow_import:Layer", "--contract", "row-parallel-linear"], tmp_path)
    deadline = time.monotonic() + 120  # a wait for the import to begin, not a timing claim
    while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert started.exists(), proc.communicate(timeout=30)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "distcheck: interrupted", err[-2000:]
