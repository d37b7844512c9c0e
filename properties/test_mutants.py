"""Every mutant must be killed by its property under the ci profile, with a counterexample."""

import pytest

from distcheck.mutants import MUTANTS, kill_mutant, mutants
from distcheck.props import get


def test_twelve_mutants_each_aimed_at_a_registered_property():
    assert len(MUTANTS) == 12
    for m in mutants():
        assert get(m.kills).name == m.kills
        assert m.description


@pytest.mark.parametrize("mutant", mutants(), ids=lambda m: m.name)
def test_mutant_is_killed_with_a_counterexample(mutant):
    result = kill_mutant(mutant, "ci")
    assert result.verdict == "pass", result.detail
    assert result.extra["killed"] is True
    assert result.extra["counterexample"], "the shrunk counterexample must be reported"
    assert result.extra["reproduce_failure"].startswith("@reproduce_failure(")
    assert result.detail.startswith(f"killed by {mutant.kills}")


def test_a_correct_implementation_survives(monkeypatch):
    # the reference itself, registered as a "mutant", must NOT be killed: the check can fail
    from distcheck.mutants import Mutant
    from distcheck.props.pipeline import bubble_fraction_formula

    fake = Mutant("reference", bubble_fraction_formula, "pipeline.bubble_fraction.formula", "not wrong")
    result = kill_mutant(fake, "ci")
    assert result.verdict == "FAIL" and "SURVIVED" in result.detail


def test_summary_row_counts_kills():
    from distcheck.props import mutant_summary
    from distcheck.report import CheckResult

    rows = [CheckResult("mutant:a", "reference", "pass", examples=3), CheckResult("mutant:b", "reference", "FAIL", examples=40)]
    summary = mutant_summary(rows)
    assert summary.verdict == "FAIL" and summary.detail == "mutants killed 1/2; survived: b"
    assert mutant_summary(rows[:1]).detail == "mutants killed 1/1"
