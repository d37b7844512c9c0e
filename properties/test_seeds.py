"""Reproducible runs: one seed per run, printed with it; the same profile and seed give the
same rows (examples, counterexamples, shrinking), whether in one process or two."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

import pytest

from distcheck.engine.mutants import registry
from distcheck.errors import ConfigError
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
        names = ["dp.any_shards.bounded", "pipeline.stash.formula", "tp.row.exact"]
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
