"""What a run leaves behind and how it ends: Hypothesis' files go to distcheck's cache folder (never
``.hypothesis/`` in the current folder), and a signal after :func:`distcheck.cli.main` returned
exits 130 / 143, never by the signal (-2 / -15)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from distcheck.core.cache import HYPOTHESIS_STORAGE_VAR, cache_folder

ROOT = Path(__file__).resolve().parents[1]

#: a check stage replaced by one small Hypothesis test, so the run is quick and still uses Hypothesis' storage
TINY_CHECK = """
import sys
import distcheck.cli as cli
from hypothesis import given, settings, strategies as st

def tiny(args):
    @settings(max_examples=5, database=None)
    @given(st.integers(min_value=-12345, max_value=98765))
    def prop(x):
        assert x == x
    prop()
    # what Hypothesis does before it writes a file of its own (its constants, its database)
    from hypothesis.configuration import storage_directory

    storage_directory("constants").create_if_missing()
    return 0

cli._run_check = tiny
sys.exit(cli.main(["check"]))
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != HYPOTHESIS_STORAGE_VAR}
    return {**env, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache"), **extra}


def test_check_leaves_no_hypothesis_folder_in_the_current_folder(tmp_path):
    work = tmp_path / "project"
    work.mkdir()
    (work / "helper.py").write_text("LIMIT = 4242\n")
    subprocess.run([sys.executable, "-c", "import helper\n" + TINY_CHECK], cwd=work, env=_env(tmp_path), check=True,
                   timeout=120)
    assert os.listdir(work) == ["helper.py"] or sorted(os.listdir(work)) == ["__pycache__", "helper.py"]
    assert (tmp_path / "cache" / "distcheck" / "hypothesis").is_dir()


def test_a_storage_folder_the_user_set_is_kept(tmp_path):
    mine, work = tmp_path / "mine", tmp_path / "project"
    work.mkdir()
    (work / "helper.py").write_text("LIMIT = 4242\n")
    subprocess.run([sys.executable, "-c", "import helper\n" + TINY_CHECK], cwd=work, check=True, timeout=120,
                   env=_env(tmp_path, **{HYPOTHESIS_STORAGE_VAR: str(mine)}))
    assert mine.is_dir() and not (tmp_path / "cache").exists() and not (work / ".hypothesis").exists()


def test_the_cache_folder_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_folder() == tmp_path / "distcheck"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # ignored, as the specification says
    assert cache_folder() == Path.home() / ".cache" / "distcheck"


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_after_main_returned_exits_128_plus_its_number(tmp_path, sig, code):
    script = ("import os, sys, time\nfrom distcheck.cli import main\n"
              "sys.argv = ['distcheck', 'audit', '--list-keys']\n"
              f"rc = main()\nprint('returned', rc, flush=True)\nos.kill(os.getpid(), {int(sig)})\ntime.sleep(5)\n"
              "sys.exit(rc)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=120, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert "returned 0" in proc.stdout
    assert proc.returncode == code, (proc.returncode, proc.stderr)


@pytest.mark.slow
def test_the_properties_stage_leaves_the_current_folder_as_it_was(tmp_path):
    work = tmp_path / "project"
    work.mkdir()
    subprocess.run([sys.executable, "-m", "distcheck", "check", "--only", "properties", "--profile", "ci", "--quiet"],
                   cwd=work, env=_env(tmp_path), check=True, timeout=600, stdout=subprocess.DEVNULL)
    assert os.listdir(work) == []
    assert (tmp_path / "cache" / "distcheck" / "hypothesis" / "constants").is_dir()
