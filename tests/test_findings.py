"""Recorded upstream findings: only the exact symptom on its own check is a ``finding``;
anything else on that check is FAIL; a finding that no longer reproduces is reported."""

from __future__ import annotations

import json
import re

import pytest

from distcheck.core.results import exit_code
from distcheck.core.vocab import Verdict
from distcheck.report import FAIL, FINDING, PASS, SKIP, CheckResult, summary_line, to_json
from distcheck.runners.findings import KNOWN_FINDINGS, Finding, label_findings

TABLE = "pp.table.Schedule1F1B"
EXECUTED = "pp.executed_order.Schedule1F1B"
#: the details the checks produce on torch 2.13 (see tests/test_pp_checks.py for the live runs)
TABLE_DETAIL = ("smallest disagreement: p=1, m=1: torch's table does not replay: microbatch=1 must be "
                "< num_microbatches=1 (in F(mb=1, stage=0) on rank 0)")
EXECUTED_DETAIL = ("p=2, m=4, rank 1: first difference at position 0: executed [('F', 1, 0), ('B', 1, 0), "
                   "('F', 1, 1)] vs table [('F', 1, 1), ('B', 1, 0), ('F', 1, 2)]")
VERSIONS = {"torch": "9.9.9"}


def _row(check, verdict, detail, backend="gloo"):
    return CheckResult(check=check, backend=backend, verdict=verdict, world_size=2, examples=1, detail=detail)


def _label(*rows):
    return label_findings(list(rows), versions=VERSIONS)


def test_every_record_is_exact_and_complete():
    names = [f.name for f in KNOWN_FINDINGS]
    assert len(set(names)) == len(names) and len({f.check for f in KNOWN_FINDINGS}) == len(KNOWN_FINDINGS)
    for f in KNOWN_FINDINGS:
        assert f.library == "torch" and f.seen_on and f.reproduce and f.reported and f.summary
        # no catch-all: the symptom matches neither an empty detail nor a one-character one
        assert re.fullmatch(f.symptom, "") is None and re.fullmatch(f.symptom, "x") is None
        assert f.symptom not in (".", ".*", ".+")


@pytest.mark.parametrize("check, detail, p", [(TABLE, TABLE_DETAIL, 1), (EXECUTED, EXECUTED_DETAIL, 2)])
def test_exact_symptom_is_a_finding(check, detail, p):
    (row,) = _label(_row(check, FAIL, detail))
    assert row.verdict == FINDING
    assert row.extra["finding"]["check"] == check
    assert row.detail.startswith("recorded finding torch.Schedule1F1B.") and row.detail.endswith(f"Observed: {detail}")
    assert "here torch 9.9.9" in row.detail and "2.13.0+cpu" in row.detail
    assert exit_code([row]) == 0


def test_executed_order_symptom_matches_any_world_size_but_only_its_pattern():
    four = EXECUTED_DETAIL.replace("p=2, m=4, rank 1", "p=4, m=8, rank 3").replace("'F', 1", "'F', 3").replace(
        "'B', 1", "'B', 3")
    assert _label(_row(EXECUTED, FAIL, four))[0].verdict == FINDING
    wrong = [
        EXECUTED_DETAIL.replace("position 0", "position 2"),                   # a later difference
        EXECUTED_DETAIL.replace("table [('F', 1, 1)", "table [('F', 1, 3)"),   # another micro-batch
        EXECUTED_DETAIL.replace("executed [('F', 1, 0)", "executed [('F', 0, 0)"),  # another stage
        EXECUTED_DETAIL + " and more",
    ]
    for detail in wrong:
        (row,) = _label(_row(EXECUTED, FAIL, detail))
        assert row.verdict == FAIL, detail
        assert row.extra["finding_differs"] == "torch.Schedule1F1B.executed_vs_table"


@pytest.mark.parametrize("check, detail", [
    # a rank crash on the pipelining row (what run_guarded reports)
    (EXECUTED, "m=4: RankFailure: rank 1 failed: RuntimeError: Connection closed by peer [127.0.0.1]:4242"),
    (EXECUTED, "m=4: WorldTimeout: step did not finish within 60.0 s; stuck ranks [0, 1]"),
    # the table check when replay deadlocks instead of naming micro-batch m
    (TABLE, ("smallest disagreement: p=1, m=1: torch's table does not replay: DeadlockError: rank 0 waits for "
             "F(mb=0, stage=1) which no rank runs")),
    (TABLE, "smallest disagreement: p=2, m=2: torch table step/bubble/peak 8, 1/4, [2, 2] != simulator 7, 1/7, [2, 1]"),
    (TABLE, TABLE_DETAIL + " (and a second problem)"),
    (TABLE, ""),
])
def test_anything_else_on_the_check_is_fail(check, detail):
    (row,) = _label(_row(check, FAIL, detail))
    assert row.verdict == FAIL
    assert row.detail.startswith(detail)  # the failure's own text comes first, unchanged
    assert "its symptom differs" in row.detail
    assert exit_code([row]) == 1


def test_a_finding_only_matches_its_own_check():
    rows = _label(_row("pp.executed_order.ScheduleGPipe", FAIL, EXECUTED_DETAIL),
                  _row("pp.table.ScheduleGPipe", FAIL, TABLE_DETAIL, backend="torch-table"))
    assert [r.verdict for r in rows] == [FAIL, FAIL]
    assert all(r.extra == {} for r in rows)  # no record touches another check
    assert exit_code(rows) == 1


def test_a_finding_that_no_longer_reproduces_is_reported():
    passing = _row(TABLE, PASS, "all 26 shapes of p = 1..4, m = p..8 agree", backend="torch-table")
    (row,) = _label(passing)
    assert row.verdict == PASS
    assert row.detail.startswith("recorded finding torch.Schedule1F1B.table_last_rank no longer reproduces on "
                                 "torch 9.9.9")
    assert row.detail.endswith("all 26 shapes of p = 1..4, m = p..8 agree")
    assert row.extra["finding_no_longer_reproduces"] == "torch.Schedule1F1B.table_last_rank"
    line = summary_line([row])
    assert line == ("1 passed, 0 failed, 0 skipped, 0 findings; recorded findings no longer reproducing: "
                    "torch.Schedule1F1B.table_last_rank")
    assert exit_code([row]) == 0  # good news upstream is not a failure; the record is to be retired
    extra = json.loads(to_json([row]))[0]["extra"]
    assert extra["finding_no_longer_reproduces"] == "torch.Schedule1F1B.table_last_rank"


def test_skip_rows_are_left_alone_and_labelling_is_idempotent():
    skip = _row(EXECUTED, SKIP, "backend 'threaded' has no point-to-point send/recv")
    rows = [_row(TABLE, FAIL, TABLE_DETAIL), _row(EXECUTED, FAIL, "m=4: RankFailure: rank 1 failed"), skip,
            _row(TABLE, PASS, "all agree")]
    once = _label(*rows)
    assert _label(*once) == once
    assert once[2] == skip


def test_two_records_for_one_check_are_refused():
    f = KNOWN_FINDINGS[0]
    other = Finding(**{**f.__dict__, "name": "other"})
    with pytest.raises(ValueError, match=re.escape(f"two findings record check '{f.check}'")):
        label_findings([], [f, other])


def test_verdicts_are_strings_in_json_and_comparisons():
    assert [str(v) for v in Verdict] == ["pass", "FAIL", "skip", "finding"]
    assert Verdict.FINDING == "finding" and PASS == "pass"
    (row,) = _label(_row(TABLE, FAIL, TABLE_DETAIL))
    assert json.loads(to_json([row]))[0]["verdict"] == "finding"
    assert f"{row.verdict:<8}|" == "finding |"


def test_rendered_finding_says_how_to_reproduce_it():
    from rich.console import Console

    from distcheck.report import render_table

    (row,) = _label(_row(TABLE, FAIL, TABLE_DETAIL, backend="torch-table"))
    console = Console(record=True, width=200, color_system=None)
    render_table([row], console=console)
    text = " ".join(console.export_text().split())  # the console wraps long lines
    assert "reproduce: python -c" in text and "get_schedule_ops(Schedule1F1B, 1, 1)" in text
    assert "reported: " in text and "pull request 155935" in text


def test_the_table_finding_reproduces_on_this_torch():
    pytest.importorskip("torch")
    import warnings

    from distcheck.parallel.pp.checks import world_free_rows

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = {r.check: r for r in label_findings(world_free_rows())}
    # on torch 2.13 the scan's smallest case is exactly the recorded symptom
    assert rows[TABLE].verdict == FINDING, rows[TABLE].detail
    assert {r.verdict for c, r in rows.items() if c != TABLE} == {PASS}


def test_table_symptom_matches_any_case_but_only_micro_batch_m_on_its_own_stage():
    """`distcheck plan pp --torch` reports the case asked for (p=2, m=2), not the scan's smallest."""
    asked = ("p=2, m=2: torch's table does not replay: microbatch=2 must be < num_microbatches=2 "
             "(in F(mb=2, stage=1) on rank 1)")
    assert _label(_row(TABLE, FAIL, asked))[0].verdict == FINDING
    wrong = [
        asked.replace("microbatch=2 must", "microbatch=3 must"),          # not micro-batch m
        asked.replace("F(mb=2, stage=1) on rank 1", "F(mb=2, stage=0) on rank 1"),  # another stage than its rank
        asked.replace("in F(mb=2", "in B(mb=2"),                           # a backward, not the first forward
    ]
    for detail in wrong:
        (row,) = _label(_row(TABLE, FAIL, detail))
        assert row.verdict == FAIL, detail
