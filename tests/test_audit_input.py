"""Hostile answer-key input: only a regular file within the size and claim limits is read; a named
pipe, a device, a folder, an oversized file or too many claims is bad input (exit 2, one line),
never a hang or a MemoryError (docs/AUDIT.md, "Limits")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from distcheck.audit import keys, load_key, parse_key
from distcheck.audit.files import MAX_KEY_BYTES
from distcheck.audit.keys import MAX_CHECKS, MAX_CLAIMS
from distcheck.core.errors import AnswerKeyError

META = '[meta]\ntitle = "t"\nsource = "s"\n'
CLAIM = ('\n[[claim]]\nid = "c{i}"\nquantity = "layout.world_size"\ninputs = {{ tp = 2, pp = 2, dp = 2 }}\n'
         'claimed = 8\nunit = "GPUs"\n')


def run_audit(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``distcheck audit ARGS`` in a subprocess, killed after ``timeout`` seconds (a hang fails the test)."""
    return subprocess.run([sys.executable, "-m", "distcheck", "audit", *args], capture_output=True, text=True,
                          timeout=timeout)


def assert_one_line_exit_2(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("distcheck: error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
@pytest.mark.timeout(60)
def test_a_named_pipe_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "key.toml"
    os.mkfifo(fifo)
    with pytest.raises(AnswerKeyError, match=r"key.toml: is a named pipe; an answer key must be a regular file"):
        load_key(fifo)
    assert_one_line_exit_2(run_audit(str(fifo)), "is a named pipe")


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
@pytest.mark.timeout(60)
def test_dev_zero_is_refused_without_reading():
    with pytest.raises(AnswerKeyError, match=r"/dev/zero: is a character device"):
        load_key("/dev/zero")
    assert_one_line_exit_2(run_audit("/dev/zero"), "/dev/zero: is a character device")


def test_a_folder_is_refused(tmp_path):
    assert_one_line_exit_2(run_audit(str(tmp_path)), f"{tmp_path}: is a folder")


def test_a_file_over_the_size_limit_is_refused_naming_the_limit(tmp_path):
    big = tmp_path / "big.toml"
    with open(big, "wb") as f:
        f.truncate(MAX_KEY_BYTES + 1)
    assert MAX_KEY_BYTES == 4 * 2**20
    assert_one_line_exit_2(run_audit(str(big)),
                           "is 4,194,305 bytes, over the answer-key limit of 4,194,304 bytes (4 MiB)")
    with pytest.raises(AnswerKeyError, match="holds more than the answer-key limit of 4,194,304 bytes"):
        parse_key("#" * (MAX_KEY_BYTES + 1))
    # the limit is in bytes: 2**21 two-byte characters are 4 MiB of UTF-8 plus the newline
    with pytest.raises(AnswerKeyError, match="holds more than the answer-key limit"):
        parse_key("#" + "é" * (2**21) + "\n")


def test_a_file_at_the_size_limit_is_read(tmp_path):
    text = META + CLAIM.format(i=0)
    path = tmp_path / "k.toml"
    path.write_text(text + "#" * (MAX_KEY_BYTES - len(text)))
    assert path.stat().st_size == MAX_KEY_BYTES
    assert [c.id for c in load_key(path).claims] == ["c0"]


def test_too_many_claims_are_refused_before_they_are_validated():
    text = META + "".join(CLAIM.format(i=i) for i in range(MAX_CLAIMS + 1))
    assert len(text.encode()) < MAX_KEY_BYTES
    with pytest.raises(AnswerKeyError, match=r"\[claim\] holds 10,001 claims, over the limit of 10,000 per answer key"):
        parse_key(text, "many.toml")


def test_too_many_checks_are_refused():
    check = '\n[[check]]\nid = "k{i}"\nkind = "equal"\nparts = ["c0"]\n'
    text = META + CLAIM.format(i=0) + "".join(check.format(i=i) for i in range(MAX_CHECKS + 1))
    with pytest.raises(AnswerKeyError, match=r"\[check\] holds 10,001 checks, over the limit of 10,000"):
        parse_key(text, "many.toml")


def test_a_symlink_to_a_regular_file_is_read(tmp_path):
    real = tmp_path / "real.toml"
    real.write_text(META + CLAIM.format(i=0))
    link = tmp_path / "link.toml"
    link.symlink_to(real)
    assert len(load_key(link).claims) == 1


def test_a_field_name_with_a_newline_is_escaped_so_the_error_stays_one_line():
    # found by tests/test_audit_fuzz.py: {"meta": {"\n": None}}
    with pytest.raises(AnswerKeyError) as err:
        keys.validate_data({"meta": {"\n": None}}, path="fuzz.toml")
    assert str(err.value) == ("fuzz.toml: [meta.\\n] unknown field '\\n' (allowed: title, source, note, url, date, "
                              "version, author, license)")
