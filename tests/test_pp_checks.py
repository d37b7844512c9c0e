"""torch.distributed.pipelining against the simulator (distcheck.parallel.pp.checks, .tables):
its tables without a process group, and every schedule on a gloo world of 2 ranks, where
the gradients must equal the unsplit model's and what each rank executes its table."""

from __future__ import annotations

import warnings

import pytest

from distcheck.report import FAIL, PASS, SKIP

torch = pytest.importorskip("torch")

from distcheck.parallel.pp import checks as pipelining  # noqa: E402
from distcheck.parallel.pp import tables  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def by_check(rows):
    return {r.check: r for r in rows}


# --------------------------------------------------------------------------- pipelining


def test_pipeline_tables_against_simulator():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = by_check(pipelining.run_table_checks(max_p=3, max_m=6))
    for name in ("ScheduleGPipe", "ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble",
                 "ScheduleZBVZeroBubble", "ScheduleDualPipeV"):
        assert rows[f"pp.table.{name}"].verdict == PASS, rows[f"pp.table.{name}"].detail
    # finding (torch 2.13): Schedule1F1B's own table names micro-batch m on the last rank
    bad = rows["pp.table.Schedule1F1B"]
    assert bad.verdict == FAIL and "p=1, m=1" in bad.detail and "microbatch=1" in bad.detail
    # no world runs: world size 1 on every row, the shapes in the detail
    assert {r.world_size for r in rows.values()} == {1}
    assert "p = 1..3, m = p..6" in rows["pp.table.ScheduleGPipe"].detail


def test_gpipe_table_matches_lesson_figure():
    tl = tables.table_timeline("ScheduleGPipe", 4, 4)
    assert tl.step_ticks == 21 and str(tl.bubble_fraction) == "3/7"  # lesson: 3 x (4 + 3) ticks, 3/7


@pytest.mark.multiprocess
def test_pipeline_schedules_on_gloo(gloo2):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = by_check(pipelining.run_pipelining_checks(gloo2, tables=False))
    for name in pipelining.SCHEDULES:
        assert rows[f"pp.grads.{name}"].verdict == PASS, rows[f"pp.grads.{name}"].detail
        assert rows[f"pp.grads.{name}"].max_error == 0.0
    for name in ("ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B"):
        assert rows[f"pp.executed_timeline.{name}"].verdict == PASS
    # torch executes 1F1B correctly (timeline = simulator) but not in its table's order
    assert rows["pp.executed_order.Schedule1F1B"].verdict == FAIL
    assert "rank 1" in rows["pp.executed_order.Schedule1F1B"].detail
    assert rows["pp.executed_order.ScheduleGPipe"].verdict == PASS
    # that FAIL is exactly the recorded finding, and no other row is
    from distcheck.report import FINDING
    from distcheck.runners.findings import label_findings

    labelled = label_findings(list(rows.values()))
    assert [r.check for r in labelled if r.verdict == FINDING] == ["pp.executed_order.Schedule1F1B"]


@pytest.mark.multiprocess
def test_pipeline_skips_threaded(threaded4):
    rows = pipelining.run_pipelining_checks(threaded4, tables=False,
                                            examples=pipelining.default_pipeline_examples(4)[:1])
    assert {r.verdict for r in rows} == {SKIP}




def test_every_torch_schedule_has_a_simulator_row():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = by_check(pipelining.world_free_rows())
    assert set(rows) == {f"pp.table.{name}" for name in tables.TORCH_SCHEDULES}
    for name, (sim, _) in tables.TORCH_SCHEDULES.items():
        row = rows[f"pp.table.{name}"]
        assert "no simulator" not in row.detail
        if name != "Schedule1F1B":
            assert row.verdict == PASS and f"agree with the simulator's {sim}" in row.detail, row.detail
    # the new tables, action for action at p = 4, m = 8 (the lesson's costs; a pair F&B costs 3)
    assert rows["pp.table.ScheduleDualPipeV"].detail.endswith(
        "p=4, m=8: same order; step 54, bubble 1/9, peak [9, 9, 9, 9]")
    assert rows["pp.table.ScheduleZBVZeroBubble"].detail.endswith("step 51, bubble 1/17, peak [8, 8, 8, 8]")
    assert rows["pp.table.ScheduleLoopedBFS"].detail.endswith("step 57, bubble 3/19, peak [16, 16, 16, 16]")


def test_a_table_compared_with_the_wrong_schedule_fails(monkeypatch):
    # GPipe's table against the simulator's 1F1B: same step, another order and stash
    monkeypatch.setitem(tables.TORCH_SCHEDULES, "ScheduleGPipe", ("1f1b", 1))
    ok, detail = tables.check_table("ScheduleGPipe", 2, 2)
    assert ok is False
    assert detail == ("p=2, m=2: torch's table gives step/bubble/peak 9, 1/3, [2, 2] != simulator 9, 1/3, [2, 1]; "
                      "first order difference rank 1 position 1: torch [F(mb=1, stage=1), B(mb=0, stage=1)] "
                      "vs simulator [B(mb=0, stage=1), F(mb=1, stage=1)]")


def test_dualpipev_table_keeps_its_overlapped_pairs():
    from distcheck.parallel.pp import from_torch_actions

    order = from_torch_actions(tables.torch_table("ScheduleDualPipeV", 2, 4), pairs=True)
    pairs = [u for row in order.values() for u in row if isinstance(u, tuple)]
    assert pairs and all(a.kind == "F" and b.kind in ("B", "I") for a, b in pairs)
    flat = from_torch_actions(tables.torch_table("ScheduleDualPipeV", 2, 4))
    assert sum(len(r) for r in flat.values()) == sum(len(u) if isinstance(u, tuple) else 1
                                                     for r in order.values() for u in r)
