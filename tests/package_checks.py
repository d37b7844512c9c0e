"""The two checks every parallelism package's test file runs on its registry entries: each of its
properties holds for the reference, and each of its mutants is killed, by an edge case and by the
generated search alone (a found_by naming which). One definition, called from tests/test_<name>.py."""

from __future__ import annotations

from distcheck.engine.mutants import kill_mutant
from distcheck.engine.runner import run_property
from distcheck.report import PASS


def assert_property_holds(name: str) -> None:
    row = run_property(name, profile="ci")
    assert row.verdict == PASS, row.detail


def assert_mutant_killed(name: str, edge_cases: bool) -> None:
    row = kill_mutant(name, edge_cases=edge_cases)
    assert row.verdict == PASS and row.extra["outcome"] == "killed", row.detail
    assert ("edge" in row.extra["found_by"]) == edge_cases, row.extra["found_by"]
