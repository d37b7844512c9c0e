"""The ``distcheck`` command line: help, exit codes, one-line usage errors, reports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from distcheck.cli import main


def _run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distcheck", *argv], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("argv", [["--help"], ["check", "--help"], ["audit", "--help"]])
def test_help_documents_every_option(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    out = capsys.readouterr().out
    for word in {"--help": ["check", "audit", "Exit codes"],
                 "check": ["--profile", "--seed", "--backend", "--world-sizes", "--launcher", "--only", "--skip",
                           "--golden-dir", "--timeout", "--format"],
                 "audit": ["--list", "--list-keys", "--format", "--output", "KEY.toml"]}[argv[0]]:
        assert word in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["chek"], "invalid choice: 'chek'"),
        (["check", "--world-sizes", "0"], "world sizes must be integers >= 1"),
        (["check", "--world-sizes", "a"], "comma-separated integers"),
        (["check", "--world-sizes", "2,,4"], "comma-separated integers"),
        (["check", "--world-sizes", "2,2"], "must be distinct"),
        (["check", "--timeout", "inf"], "positive, finite"),
        (["check", "--timeout", "-1"], "positive, finite"),
        (["check", "--backend", "mpi"], "invalid choice: 'mpi'"),
        (["check", "--seed", "-1"], "seed must be an integer >= 0, got '-1'"),
        (["check", "--seed", "0x10"], "seed must be an integer >= 0, got '0x10'"),
        (["check", "--only", "golden", "--skip", "golden"], "no stage left to run"),
        (["check", "--golden-dir", "/nonexistent/golden"], "is not a folder"),
        (["check", "--world-sizes", "99999999999999999999", "--only", "distributed"], "must be <= 64"),
        (["check", "--backend", "threaded", "--world-sizes", "2000", "--only", "layers"], "must be <= 1024"),
        (["audit"], "needs at least one KEY.toml"),
        (["audit", "--list", "golden/lesson.toml"], "--list takes no KEY.toml"),
        (["audit", "/nonexistent/key.toml"], "key.toml"),
        (["audit", "chaptre"], "chaptre: no such file, and no shipped key of that name (shipped: chapter, "),
        (["audit", "--list-keys", "chapter"], "--list-keys takes no KEY.toml"),
        (["audit", "--list", "--list-keys"], "cannot be combined"),
    ],
)
def test_bad_input_is_one_line_on_stderr_and_exit_2(argv, message, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors exit through the parser
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_nccl_without_a_gpu_is_refused_not_skipped(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert main(["check", "--backend", "nccl", "--world-sizes", "2", "--only", "distributed"]) == 2
    assert "--backend nccl cannot run here" in capsys.readouterr().err


def test_output_to_a_missing_folder_or_a_folder_is_refused_and_leaves_nothing(tmp_path, capsys):
    assert main(["audit", "golden/zero_paper.toml", "--output", str(tmp_path / "no" / "x.md")]) == 2
    assert main(["audit", "golden/zero_paper.toml", "--output", str(tmp_path)]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    out = tmp_path / "zero.md"
    assert main(["audit", "golden/zero_paper.toml", "--format", "markdown", "--output", str(out)]) == 0
    assert out.read_text().startswith("#") and sorted(p.name for p in tmp_path.iterdir()) == ["zero.md"]


def test_golden_stage_alone_passes_and_reports_json(capsys):
    assert main(["check", "--only", "golden", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) > 100 and {r["backend"] for r in rows} == {"golden"}
    assert {r["verdict"] for r in rows} == {"pass", "skip"}  # the skips: undecided claims, recorded with a reason
    assert all(r["detail"].startswith("undecided, recorded as") for r in rows if r["verdict"] == "skip")
    verdicts = {r["detail"].split(":")[0] for r in rows}
    assert "as recorded, wrong" in verdicts and "as recorded, holds" in verdicts


_STRICT_KEY = ('[meta]\ntitle = "t"\nsource = "s"\n[[claim]]\nid = "a"\nquantity = "layout.world_size"\n'
               'inputs = {{ tp = 2, pp = 2, dp = 2 }}\nclaimed = 8\nunit = "GPUs"\n{extra}')


@pytest.mark.parametrize("extra, plain, strict", [
    ("", 0, 0),  # every claim decided
    ('[[claim]]\nid = "b"\nquantity = "reported.fact"\nclaimed = 8\nunit = "GPUs"\n', 0, 1),  # not-checkable
    ('[[claim]]\nid = "b"\nquantity = "layout.world_size"\ninputs = { tp = 2 }\nclaimed = 8\nunit = "GPUs"\n',
     0, 1),  # not-checkable: an input missing
    ('[[claim]]\nid = "b"\nquantity = "layout.world_size"\ninputs = { tp = 2, pp = 2, dp = 2 }\nclaimed = 9\n'
     'unit = "GPUs"\n', 1, 1),  # wrong: 1 either way
])
def test_audit_strict_fails_unless_every_claim_is_decided(tmp_path, capsys, extra, plain, strict):
    p = tmp_path / "k.toml"
    p.write_text(_STRICT_KEY.format(extra=extra))
    assert main(["audit", str(p)]) == plain
    assert main(["audit", str(p), "--strict"]) == strict
    capsys.readouterr()


def test_audit_strict_on_the_shipped_keys_and_an_ambiguous_claim(capsys):
    from dataclasses import replace

    from distcheck.audit import audit_exit_code, audit_file
    from distcheck.golden import resolve_key

    assert main(["audit", "zero_paper", "--strict"]) == 0  # every claim decided
    assert main(["audit", "lesson"]) == 0 and main(["audit", "lesson", "--strict"]) == 1  # not-checkable facts
    chapter = audit_file(resolve_key("chapter"))
    only_ambiguous = replace(chapter, claims=[v for v in chapter.claims if v.verdict == "ambiguous"], checks=[])
    assert len(only_ambiguous.claims) == 1
    assert audit_exit_code(only_ambiguous) == 0 and audit_exit_code(only_ambiguous, strict=True) == 1
    capsys.readouterr()


def test_a_failing_golden_fails_the_check(tmp_path, capsys):
    (tmp_path / "bad.toml").write_text(
        '[meta]\ntitle = "t"\nsource = "s"\n\n[[claim]]\nid = "x"\nquantity = "layout.world_size"\n'
        'inputs = { tp = 8, pp = 16, dp = 128 }\nclaimed = 16000\nunit = "GPUs"\nsection = "s"\nexpect = "holds"\n')
    assert main(["check", "--only", "golden", "--golden-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "golden records holds" in out and "0 passed, 1 failed" in out


#: SIGTERM (a CI timeout) and Ctrl-C: what main() raises for each, its exit code and its last words
SIGNALS = [pytest.param(signal.SIGTERM, "_Terminated", 143, "terminated", id="SIGTERM"),
           pytest.param(signal.SIGINT, "KeyboardInterrupt", 130, "interrupted", id="SIGINT")]


def _raised(name: str) -> type[BaseException]:
    from distcheck import cli

    return KeyboardInterrupt if name == "KeyboardInterrupt" else getattr(cli, name)


@pytest.mark.multiprocess
@pytest.mark.parametrize("sig, raised, code, words", SIGNALS)
def test_a_signal_unwinds_closes_the_pool_and_exits(tmp_path, sig, raised, code, words):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "distcheck", "check", "--only", "layers", "--world-sizes", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 240  # a wait, not a timing claim: a loaded machine starts the pool late
    while time.monotonic() < deadline and not any(p.name.startswith("distcheck-pool-") for p in tmp_path.iterdir()):
        time.sleep(0.1)
    assert any(p.name.startswith("distcheck-pool-") for p in tmp_path.iterdir()), "the pool never started"
    time.sleep(0.5)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert words in err and "Traceback" not in err
    time.sleep(0.5)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("distcheck-pool-")]


@pytest.mark.parametrize("sig, raised, code, words", SIGNALS)
def test_a_signal_inside_a_gc_callback_is_not_lost(monkeypatch, sig, raised, code, words):
    """A handler's exception raised inside a garbage-collector callback (Hypothesis installs one) would be
    printed and dropped: there the handler waits for the signal to be delivered again."""
    import gc

    from distcheck import cli

    sent = []
    monkeypatch.setattr(cli.os, "kill", lambda pid, s: sent.append(s))
    monkeypatch.setattr(cli, "_RESEND_S", 0.05)
    monkeypatch.setitem(cli._TERM, "state", "idle")
    seen = {}

    def callback(phase, info):
        if phase == "start" and "raised" not in seen:
            try:
                cli._terminate(sig, sys._getframe())
                seen["raised"] = False
            except _raised(raised):
                seen["raised"] = True

    gc.callbacks.append(callback)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(callback)
    assert seen == {"raised": False} and cli._TERM["state"] == "pending"
    time.sleep(0.3)
    assert sent == [sig]  # delivered again
    with pytest.raises(_raised(raised)):  # outside a callback: unwinds at once
        cli._terminate(sig, sys._getframe())
    assert cli._terminate(sig, sys._getframe()) is None  # raised once: a second signal during the unwind waits
    monkeypatch.setitem(cli._TERM, "raised_at", time.monotonic() - cli._GRACE_S)
    with pytest.raises(_raised(raised)):  # a signal after the grace period raises again
        cli._terminate(sig, sys._getframe())
    cli._TERM["state"] = "handled"  # what main() does when it has unwound
    time.sleep(0.3)
    assert sent == [sig] and cli._terminate(sig, None) is None


def test_a_shipped_key_is_named_without_a_path(tmp_path, monkeypatch, capsys):
    from distcheck.golden import default_golden_dir

    monkeypatch.chdir(tmp_path)  # no checkout here: the names resolve to the shipped keys
    assert main(["audit", "--list-keys"]) == 0
    out = capsys.readouterr().out
    assert str(default_golden_dir()) in out.splitlines()[0]
    rows = [line.split(None, 2) for line in out.splitlines()[2:]]
    assert [(name, claims) for name, claims, _ in rows] == [
        ("chapter", "34"), ("checkpoint", "8"), ("context_parallel", "6"), ("korthikanti", "8"), ("lesson", "89"),
        ("llama3_table4", "14"), ("megatron_2021", "10"), ("moe", "7"), ("palm", "1"),
        ("zero_bubble", "25"), ("zero_paper", "7")]
    assert main(["audit", "zero_paper", "--format", "json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert report["path"] == str(default_golden_dir() / "zero_paper.toml")
    assert main(["audit", "chapter", "--format", "json"]) == 1  # its wrong figures, found from the name alone
    (tmp_path / "chapter").write_text("not toml")  # a file of that name here wins over the shipped key
    assert main(["audit", "chapter"]) == 2
    assert "chapter:1: not valid TOML" in capsys.readouterr().err



def test_only_and_skip_take_comma_separated_stages(capsys):
    assert main(["check", "--only", "properties,golden", "--skip", "properties", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(r["backend"] == "golden" for r in rows)
    with pytest.raises(SystemExit) as exit_:
        main(["check", "--only", "golden,propertis"])
    assert exit_.value.code == 2 and "unknown stage 'propertis'" in capsys.readouterr().err


@pytest.mark.parametrize("sig, code, words", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_a_signal_dropped_by_an_at_fork_hook_still_ends_the_run_with_its_code(monkeypatch, capsys, sig, code, words):
    """The handler's exception raised inside a callback whose exceptions Python prints and drops (logging's
    at-fork hook ``_releaseLock``, run by every fork of a pool) is not lost: the run goes on, then main()
    exits with the signal's code instead of 0."""
    from distcheck import cli

    def run_command(args, argv):
        try:  # what Python does with an at-fork hook's exception: print it and go on
            cli._terminate(sig, None)
        except BaseException:  # noqa: BLE001 - the drop being simulated
            pass
        return 0

    monkeypatch.setattr(cli, "_run_command", run_command)
    monkeypatch.setattr(cli, "_is_main_thread", lambda: False)  # leave the test's own handlers alone
    assert cli.main(["audit", "--list-keys"]) == code
    assert f"distcheck: {words}" in capsys.readouterr().err


def test_a_signal_inside_logging_s_at_fork_hook_waits_for_redelivery(monkeypatch):
    """Inside logging's at-fork hook (``_releaseLock`` on 3.11) the handler does not raise: the signal is pending."""
    import logging

    from distcheck import cli

    hook = getattr(logging, "_releaseLock", None) or getattr(logging, "_afterFork", None)
    if hook is None:
        pytest.skip("this Python's logging has no known at-fork hook")
    monkeypatch.setitem(cli._TERM, "state", "idle")
    monkeypatch.setattr(cli, "_RESEND_S", 3600.0)  # the timer never fires within the test

    class Frame:  # a frame whose caller is the hook, as when the signal lands inside it
        f_code = hook.__code__
        f_back = None

    cli._terminate(signal.SIGTERM, Frame())  # type: ignore[arg-type]
    assert cli._TERM["state"] == "pending"
