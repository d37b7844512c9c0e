"""Reproducible runs: one seed per run, printed with it; the same profile and seed give the
same rows (examples, counterexamples, shrinking), whether in one process or two."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

import pytest

from distcheck.core.errors import ConfigError
from distcheck.engine.mutants import registry
from distcheck.mutants import kill_mutant, row_parallel_bias_every_rank
from distcheck.props import example_seed, resolve_seed, run_property
from distcheck.report import summary_line


def _row(result) -> dict:
    return json.loads(json.dumps(asdict(result), default=str))


def test_the_same_failing_property_twice_gives_the_same_row():
    first = run_property("tp.row.exact", "ci", impl=row_parallel_bias_every_rank)
    second = run_property("tp.row.exact", "ci", impl=row_parallel_bias_every_rank)
    assert first.verdict == "FAIL"
    assert _row(first) == _row(second)  # examples, counterexample, shrink calls, blob, detail
    assert first.extra["seed"] == 0 and "seed=0" in first.extra["reproduce"]


def test_the_same_mutant_kill_twice_gives_the_same_row_under_every_profile():
    for profile in ("ci", "dev"):
        # without the edge cases, so that generation and shrinking both run
        a, b = (kill_mutant("dp.plain_mean_unequal", profile, seed=20240, edge_cases=False) for _ in range(2))
        assert a.verdict == "pass" and _row(a) == _row(b), profile
        assert a.extra["shrink_calls"] == b.extra["shrink_calls"] > 0


def test_a_dev_run_prints_its_seed_and_the_seed_replays_it():
    drawn = run_property("tp.row.exact", "dev", impl=row_parallel_bias_every_rank)
    seed = drawn.extra["seed"]
    assert isinstance(seed, int) and 0 <= seed < 2**32
    replay = run_property("tp.row.exact", "dev", impl=row_parallel_bias_every_rank, seed=seed)
    assert _row(replay) == _row(drawn)
    assert f"seed={seed}" in drawn.extra["reproduce"]


def test_different_seeds_draw_different_examples():
    rows = [run_property("tp.row.exact", "dev", impl=row_parallel_bias_every_rank, seed=s) for s in (1, 2, 3)]
    assert len({r.extra["hypothesis_seed"] for r in rows}) == 3
    assert len({r.extra["reproduce_failure"] for r in rows} | {r.examples for r in rows}) > 1


def test_each_row_has_its_own_stream_derived_from_the_run_seed():
    assert example_seed(0, "tp.row.exact") == int.from_bytes(
        __import__("hashlib").sha256(b"0:tp.row.exact").digest()[:8], "big")
    assert example_seed(0, "tp.row.exact") != example_seed(0, "mutant:tp.row.bias_every_rank")
    assert example_seed(0, "tp.row.exact") != example_seed(1, "tp.row.exact")


def test_seed_resolution():
    assert resolve_seed("ci") == 0  # derandomized: a fixed, printed seed
    assert resolve_seed("ci", 7) == 7 and resolve_seed("dev", 7) == 7 and resolve_seed("thorough", 0) == 0
    assert 0 <= resolve_seed("thorough") < 2**32  # random, 32 bits
    for bad, rule in ((-1, "seed=-1 must be >= 0"), (True, "seed=True must be an integer"),
                      ("3", "seed='3' must be an integer"), (1.5, "seed=1.5 must be an integer")):
        with pytest.raises(ConfigError, match=rule):
            resolve_seed("dev", bad)


def test_the_summary_line_and_the_table_show_the_seed_and_how_to_replay():
    from rich.console import Console

    from distcheck.report import render_table

    failing = run_property("tp.row.exact", "dev", impl=row_parallel_bias_every_rank, seed=11)
    mutant = kill_mutant("tp.row.bias_every_rank", "dev", seed=11)
    assert summary_line([failing, mutant]) == "1 passed, 1 failed, 0 skipped, 0 findings; seed 11 (profile dev)"
    console = Console(record=True, width=200, color_system=None)
    render_table([failing], console=console)
    text = " ".join(console.export_text().split())
    assert "FAIL tp.row.exact (reference, world size 1):" in text
    assert "seed: 11 (profile dev)" in text
    assert ("reproduce: run_property('tp.row.exact', profile='dev', seed=11, "
            "impl=distcheck.mutants.row_parallel_bias_every_rank)") in text
    assert mutant.extra["replay"] == "distcheck check --only properties --profile dev --seed 11"


def test_a_failing_registered_property_names_the_command_that_replays_the_run(monkeypatch):
    import dataclasses

    from distcheck import props

    def boom(case, **kw):
        raise AssertionError("boom")

    broken = dataclasses.replace(props.get("zero.bytes.padded"), function=boom)
    monkeypatch.setitem(props._REGISTRY, "zero.bytes.padded", broken)
    row = run_property("zero.bytes.padded", "dev", seed=5)
    assert row.verdict == "FAIL" and row.extra["failure_kind"] == "error"
    assert row.extra["replay"] == "distcheck check --only properties --profile dev --seed 5"
    assert row.detail.startswith("AssertionError: boom; counterexample ZeroCase(")
    # an unregistered property (or another implementation) is not what distcheck check runs: no replay command
    assert "replay" not in run_property(dataclasses.replace(broken), "dev", seed=5).extra


def test_a_dev_run_replays_with_its_seed():
    from distcheck.mutants import kill_mutants, mutants
    from distcheck.props import run_suite

    def run() -> list[dict]:
        names = ["dp.any_shards.bounded", "pp.stash.formula", "tp.row.exact"]
        return [_row(r) for r in run_suite(names=names, profile="dev", seed=99) + kill_mutants("dev", seed=99)]

    first = run()
    assert first == run()
    assert {r["extra"]["seed"] for r in first} == {99} and len(first) == 3 + len(mutants())


@pytest.mark.slow
def test_check_properties_json_is_the_same_twice_under_ci():
    def run() -> list[dict]:
        proc = subprocess.run([sys.executable, "-m", "distcheck", "check", "--only", "properties", "--format", "json"],
                              capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout)

    first, second = run(), run()
    # the rows carry no timings: the whole report must be identical, counterexamples and shrink counts included
    assert first == second
    mutants = [r for r in first if r["check"].startswith("mutant:")]
    assert len(mutants) == len(registry()) and all(r["extra"]["shrink_calls"] >= 0 for r in mutants)
    assert {r["extra"]["seed"] for r in first if r["backend"] == "reference"} == {0}


def test_a_long_failure_keeps_its_reason_in_the_detail_and_prints_everything_below_the_table():
    from rich.console import Console

    from distcheck.props import DETAIL_CHARS, failure_detail
    from distcheck.report import FAIL, CheckResult, render_table

    reason = ("PropertyFailure: row-parallel (tp=2) vs x @ W + b: not bitwise equal; "
              "max error 1.000e+00 > bound 0.000e+00")
    counter = "LinearCase(tp=2, x=[[" + ", ".join(["1.0"] * 300) + "]])"
    detail = failure_detail(reason, counter)
    assert detail.startswith(reason + "; counterexample LinearCase(tp=2, x=[[1.0, 1.0")
    assert detail.endswith("…") and len(detail) == DETAIL_CHARS
    row = CheckResult("tp.row.exact", "reference", FAIL, detail=detail,
                      extra={"error": reason.split(": ", 1)[1], "counterexample": counter, "seed": 3, "profile": "dev",
                             "reproduce": "run_property('tp.row.exact', profile='dev', seed=3)",
                             "replay": "distcheck check --only properties --profile dev --seed 3"})
    console = Console(record=True, width=120, color_system=None)
    render_table([row], console=console)
    text = "".join(console.export_text().split())
    assert ("counterexample:" + counter.replace(" ", "")) in text  # the whole counterexample, below the table
    assert "error:" not in text  # the reason was not cut: it is not repeated
    assert "seed:3(profiledev)" in text and "replay:distcheckcheck--onlyproperties--profiledev--seed3" in text


def test_a_commit_seeds_its_own_exploratory_run():
    from distcheck.engine.profiles import COMMIT_SEED_DIGITS, commit_seed

    sha1 = "1f3f4774fb8722d3ec6c98e7e9fee82c21abcd88"
    assert commit_seed(sha1) == int(sha1[:8], 16) == 524240756
    # abbreviated, with git's newline, SHA-256
    assert commit_seed(sha1[:8]) == commit_seed(sha1 + "\n") == commit_seed("1f3f4774" + "0" * 56)
    assert commit_seed("0" * 40) == 0 and commit_seed("f" * 40) == 2**32 - 1 and COMMIT_SEED_DIGITS == 8
    assert commit_seed("850fb32d" + "0" * 32) != commit_seed(sha1)  # another commit, another seed
    assert resolve_seed("dev", commit_seed(sha1)) == 524240756  # a seed run_property and --seed accept
    for bad in ("1f3f477", "HEAD", "1F3F4774FB8722D3", "g" * 40, "0" * 65, "", 0x1F3F4774, None):
        with pytest.raises(ConfigError, match=r"^revision=.* must be a git object name: 8 to 64 lowercase hex"):
            commit_seed(bad)


_SEED_SPY = """
import json, os
import distcheck.props as props
from distcheck.report import CheckResult

seen = []


def run_property(prop, profile="ci", *args, seed=None, **kwargs):
    seen.append([getattr(prop, "name", prop), profile, seed])
    return CheckResult(getattr(prop, "name", prop), "reference", "pass", examples=1)


props.run_property = run_property  # before pytest imports the suite's modules


def pytest_sessionfinish(session):
    with open(os.environ["SEED_SPY_OUT"], "w") as out:
        json.dump(seen, out)
"""


@pytest.mark.slow
def test_hypothesis_seed_is_the_seed_of_every_property_row_of_the_suite(tmp_path):
    # --hypothesis-seed N seeds the @given tests; the distcheck_seed fixture hands the same N to every
    # test_property_holds, so one seed replays the whole suite (CI's exploratory run)
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    (tmp_path / "seed_spy.py").write_text(_SEED_SPY)
    out = tmp_path / "seen.json"
    env = {**os.environ, "SEED_SPY_OUT": str(out),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "seed_spy",
                           "--distcheck-profile", "dev", "--hypothesis-seed", "4242", "-k", "test_property_holds",
                           "properties/"], cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = json.loads(out.read_text())
    from distcheck.props import properties

    names = {name for name, _, _ in seen}
    assert names <= {p.name for p in properties()} and len(names) == len(seen) >= 30  # each suite's rows, once
    assert {profile for _, profile, _ in seen} == {"dev"}
    assert {seed for _, _, seed in seen} == {4242}, [row for row in seen if row[2] != 4242]
