"""The "Compositions drawn" table (distcheck.certify.compositions): a contract's ``composition(case)`` hook,
the compositions the engine records with each property's verdict on each, in the certificate (JSON and
Markdown) and in ``--report``; and the profile's largest world (``Contract.beyond_profile``)."""

from __future__ import annotations

import json

from distcheck.certify import Certificate, certify
from distcheck.certify.report import write_certify_report
from tests.addition_contract import AdditionContract, add_without_carry, good_add


class CarryContract(AdditionContract):
    """The addition contract whose examples are of two compositions: the sum carries past 15 or not."""

    name = "test-carry"

    def composition(self, case):
        return {"carry": "yes" if case.a + case.b >= 16 else "no", "a even": str(case.a % 2 == 0)}


def _rows(cert):
    return {(r.columns["carry"], r.columns["a even"]): r for r in cert.compositions}


def test_each_composition_carries_each_property_verdict(tmp_path):
    cert = certify(add_without_carry, CarryContract(), examples=60)
    rows = _rows(cert)
    assert {carry for carry, _ in rows} == {"yes", "no"}
    for (carry, _), row in rows.items():
        assert row.world_size == 1 and row.dtype == "float64" and row.examples > 0
        assert row.verdicts["symmetric"] == "pass"  # the wrong adder is still symmetric
        # it is wrong exactly where the sum carries: only there may the row say FAIL
        assert row.verdicts["sum"] == ("FAIL" if carry == "yes" else "pass"), (carry, row)
        assert (row.failures["sum"] > 0) == (carry == "yes")
    assert sum(r.examples for r in rows.values()) >= 60

    doc = Certificate([cert], command="distcheck certify ...")
    md = doc.to_markdown()
    assert "### Compositions drawn" in md
    assert "| world size | dtype | carry | a even | examples | sum | symmetric |" in md
    failing = [line for line in md.splitlines() if line.startswith("| 1 | float64 | yes |")]
    assert failing and all("FAIL (" in line and line.endswith("| pass |") for line in failing)
    data = json.loads(doc.to_json())["certifications"][0]["compositions"]
    assert {(r["columns"]["carry"], r["verdicts"]["sum"]) for r in data} == {("yes", "FAIL"), ("no", "pass")}

    files = write_certify_report(tmp_path / "rep", doc)
    report = files.markdown.read_text()
    assert "Compositions drawn" in report and "FAIL (" in report
    assert "Compositions drawn" in files.html.read_text()


def test_a_certified_target_passes_on_every_composition():
    cert = certify(good_add, CarryContract(), examples=30)
    assert cert.ok and cert.compositions
    assert all(v == "pass" for r in cert.compositions for v in r.verdicts.values())


def test_a_contract_without_compositions_lists_none():
    cert = certify(good_add, AdditionContract(), examples=5)
    assert cert.compositions == []
    assert "Compositions drawn" not in Certificate([cert], command="c").to_markdown()


class CappedContract(AdditionContract):
    """The addition contract run on worlds at most 1 rank under ci, 2 under thorough."""

    name = "test-capped"
    max_world_sizes = {"ci": 1, "thorough": 2}
    max_world_reason = "costly"


class _TwoRanks:
    """A borrowed world of two ranks that answers like the local one (rank 0's result, twice)."""

    world_size, backend = 2, "fake"

    def run(self, fn, *args, timeout_s=None):
        from distcheck.certify.worlds import LocalWorld

        return LocalWorld().run(fn, *args) * 2


def test_a_world_above_the_profile_limit_is_a_skip_with_its_reason():
    c = CappedContract()
    assert c.beyond_profile(1, "ci") is None and c.beyond_profile(2, "thorough") is None
    assert c.beyond_profile(2, "dev") is None  # a profile not named has no limit
    reason = c.beyond_profile(2, "ci")
    assert "above 1" in reason and "2 under thorough" in reason and reason.endswith(": costly")
    cert = certify(good_add, c, world=_TwoRanks(), examples=3, profile="ci")
    assert {v.verdict for v in cert.verdicts} == {"skip"} and all(v.failure == reason for v in cert.verdicts)
    assert certify(good_add, c, world=_TwoRanks(), examples=3, profile="thorough", seed=0).ok
