"""torch.distributed.pipelining's own schedule tables, without a process group, against the simulator.

Each schedule class builds its per-rank action table (``pipeline_order``) when it is
instantiated over mock stages, the way torch's schedule visualizer does it
(``torch.distributed.pipelining._schedule_visualizer.get_schedule_ops``: the class over
``mock.create_autospec(PipelineStage)`` stages that carry only ``group_rank``,
``group_size`` and ``num_stages``). :func:`check_table` converts one table
(:func:`distcheck.parallel.pp.from_torch_actions`, an ``OVERLAP_F_B`` kept as one overlapped
pair), replays it through the simulator (every dependency, W after its I, no deadlock, the
placement of :data:`TORCH_SCHEDULES`) and compares it with the simulator's own schedule:
the order action for action, and the step, bubble and stash, under the lesson's costs
(F = 1, B = 2; I = W = 1 when split; an overlapped pair 3). torch is imported inside the
functions only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypedDict

from distcheck.core.errors import ConfigError
from distcheck.core.results import FAIL, PASS, SKIP, CheckResult
from distcheck.core.validate import check_choice, check_positive_int
from distcheck.core.vocab import Schedule
from distcheck.parallel.pp.actions import DeadlockError
from distcheck.parallel.pp.reference import from_torch_actions
from distcheck.parallel.pp.schedules import placement, schedule_order, simulate
from distcheck.parallel.pp.simulator import replay
from distcheck.parallel.pp.timeline import Timeline

__all__ = ["TORCH_SCHEDULES", "torch_table", "table_timeline", "check_table", "run_table_checks"]

#: torch schedule class -> (the simulator's schedule, stages per rank v)
TORCH_SCHEDULES: dict[str, tuple[str, int]] = {
    "ScheduleGPipe": (Schedule.GPIPE, 1),
    "Schedule1F1B": (Schedule.ONE_F_ONE_B, 1),
    "ScheduleInterleaved1F1B": (Schedule.INTERLEAVED, 2),
    "ScheduleLoopedBFS": (Schedule.LOOPED_BFS, 2),
    "ScheduleInterleavedZeroBubble": (Schedule.INTERLEAVED_ZB, 2),
    "ScheduleZBVZeroBubble": (Schedule.ZB_V, 2),
    "ScheduleDualPipeV": (Schedule.DUALPIPEV, 2),
}
class ReplayCosts(TypedDict):
    """Tick costs as :func:`~distcheck.parallel.pp.simulator.replay` takes them (keywords)."""

    t_f: int
    t_b: int
    t_i: int
    t_w: int
    t_fb: int


#: the lesson's costs, split and overlapped (F = 1, B = 2 = I + W, F&B = F + B)
COSTS: ReplayCosts = {"t_f": 1, "t_b": 2, "t_i": 1, "t_w": 1, "t_fb": 3}


def _schedule_class(name: str) -> type:
    from torch.distributed.pipelining import schedules

    check_choice("schedule", name, tuple(TORCH_SCHEDULES))
    return getattr(schedules, name)


def torch_table(schedule: str, p: int, m: int, v: int | None = None) -> list[list[Any]]:
    """The schedule's ``pipeline_order`` for ``p`` ranks and ``m`` micro-batches, built without a
    process group: ``list[list[_Action | None]]`` (index = rank). ``v`` defaults to the
    schedule's stages per rank (:data:`TORCH_SCHEDULES`). Raises what torch raises for shapes
    it refuses (ValueError for m not a multiple of Interleaved1F1B's rounds, ...)."""
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    cls = _schedule_class(schedule)
    check_positive_int("p", p)
    check_positive_int("m", m)
    v = TORCH_SCHEDULES[schedule][1] if v is None else v
    return get_schedule_ops(cls, p, m, num_stages_per_rank=v)


def _replay_table(schedule: str, table: list[list[Any]], p: int, m: int) -> tuple[dict[int, list], Timeline]:
    sim, v = TORCH_SCHEDULES[schedule]
    order = from_torch_actions(table, pairs=True)
    return order, replay(order, v * p, m, stage_to_rank=placement(sim, p, v).tolist(), **COSTS)


def table_timeline(schedule: str, p: int, m: int) -> Timeline:
    """The simulator's timeline of torch's table (the lesson's costs)."""
    return _replay_table(schedule, torch_table(schedule, p, m), p, m)[1]


def _first_difference(ours: dict, theirs: dict) -> str:
    for r in sorted(ours):
        a, b = ours[r], theirs.get(r, [])
        if a != b:
            k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            return f"rank {r} position {k}: torch {_names(b[k:k + 2])} vs simulator {_names(a[k:k + 2])}"
    return ""


def _names(units: Iterable[object]) -> str:
    return "[" + ", ".join("&".join(str(a) for a in u) if isinstance(u, tuple) else str(u) for u in units) + "]"


def compare_with_simulator(order: dict, schedule: str, p: int, m: int, v: int) -> dict[str, tuple[bool, str]]:
    """An action table against the simulator's ``schedule`` at (p, m, v), property by property.

    ``order`` is ``{rank: [Action | (Action, Action), ...]}``. Returns ``{"dependencies",
    "order", "bubble", "stash": (ok, detail)}``: the table replays (every action once, every
    dependency met, W after its I, no deadlock, the schedule's placement); it is the simulator's
    order action for action; its step and bubble fraction, and its peak in flight per rank, are
    the simulator's (the lesson's costs, :data:`COSTS`). Raises ConfigError when the simulator
    refuses the shape.
    """
    ours = schedule_order(schedule, p, m, v)
    want = simulate(schedule, p, m, v, t_f=COSTS["t_f"], t_b=COSTS["t_b"], t_fb=COSTS["t_fb"])
    out: dict[str, tuple[bool, str]] = {}
    diff = _first_difference(ours, order)
    out["order"] = (not diff, f"p={p}, m={m}: " + (f"first order difference {diff}" if diff else "same order"))
    try:
        tl = replay(order, v * p, m, stage_to_rank=placement(schedule, p, v).tolist(), **COSTS)
    except (ConfigError, DeadlockError) as exc:
        text = f"p={p}, m={m}: the table does not replay: {exc}"
        return out | {"dependencies": (False, text), "bubble": (False, text), "stash": (False, text)}
    out["dependencies"] = (True, f"p={p}, m={m}: replays with every dependency met")
    got, exp = (tl.step_ticks, tl.bubble_fraction), (want.step_ticks, want.bubble_fraction)
    out["bubble"] = (got == exp, f"p={p}, m={m}: step, bubble {got[0]}, {got[1]}" +
                     (" = " if got == exp else " != ") + f"simulator's {exp[0]}, {exp[1]}")
    ok = tl.peak_in_flight == want.peak_in_flight
    out["stash"] = (ok, f"p={p}, m={m}: peak in flight {list(tl.peak_in_flight)}" + (" = " if ok else " != ") +
                    f"simulator's {list(want.peak_in_flight)}")
    return out


def check_table(schedule: str, p: int, m: int) -> tuple[bool | None, str]:
    """Replay torch's table for (p, m) and compare it with the simulator's own schedule.

    Returns ``(ok, detail)``; ``ok`` is None when torch or the simulator refuses the shape
    (torch's Interleaved1F1B accepts m that is not a multiple of p, distcheck's interleaved
    does not).
    """
    sim, v = TORCH_SCHEDULES[schedule]
    try:
        table = torch_table(schedule, p, m)
    except (ValueError, AssertionError, RuntimeError, NotImplementedError) as exc:
        return None, f"torch refuses p={p}, m={m}: {str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__}"
    try:
        order, tl = _replay_table(schedule, table, p, m)
    except (ConfigError, DeadlockError) as exc:
        return False, f"p={p}, m={m}: torch's table does not replay: {exc}"
    try:
        ours = schedule_order(sim, p, m, v)
    except ConfigError as exc:  # a shape only torch allows
        return None, f"distcheck's {sim} refuses p={p}, m={m}: {exc}"
    want = simulate(sim, p, m, v, t_f=COSTS["t_f"], t_b=COSTS["t_b"], t_fb=COSTS["t_fb"])
    got_figures = (tl.step_ticks, tl.bubble_fraction, tl.peak_in_flight)
    want_figures = (want.step_ticks, want.bubble_fraction, want.peak_in_flight)
    diff = _first_difference(ours, order)
    if got_figures != want_figures:
        return False, (f"p={p}, m={m}: torch's table gives step/bubble/peak {got_figures[0]}, {got_figures[1]}, "
                       f"{list(got_figures[2])} != simulator {want_figures[0]}, {want_figures[1]}, "
                       f"{list(want_figures[2])}" + (f"; first order difference {diff}" if diff else ""))
    if diff:
        return False, f"p={p}, m={m}: same step/bubble/peak ({got_figures[0]}, {got_figures[1]}), another order: {diff}"
    return True, (f"p={p}, m={m}: same order; step {tl.step_ticks}, bubble {tl.bubble_fraction}, "
                  f"peak {list(tl.peak_in_flight)}")


def run_table_checks(schedules: Sequence[str] | None = None, *, max_p: int = 4, max_m: int = 8) -> list[CheckResult]:
    """One ``pp.table.<Schedule>`` row per torch schedule: scan ``1 <= p <= max_p``,
    ``p <= m <= max_m`` (smallest first) and stop at the first disagreement.

    Shapes torch or the simulator refuses are counted out; a schedule refused at every
    scanned shape gets a ``skip`` row. No world runs: every row has world size 1 and backend
    ``"torch-table"``; the shapes are in the detail.
    """
    rows = []
    for name in schedules or TORCH_SCHEDULES:
        check = f"pp.table.{name}"
        tried, first_fail, last = 0, None, ""
        for p in range(1, max_p + 1):
            for m in range(p, max_m + 1):
                ok, detail = check_table(name, p, m)
                if ok is None:
                    continue
                tried += 1
                last = detail
                if not ok:
                    first_fail = detail
                    break
            if first_fail:
                break
        if tried == 0:
            rows.append(CheckResult(check, "torch-table", SKIP, 1, 0, detail="torch refuses every scanned (p, m)"))
            continue
        sim = TORCH_SCHEDULES[name][0]
        detail = (f"smallest disagreement: {first_fail}" if first_fail else
                  f"all {tried} shapes of p = 1..{max_p}, m = p..{max_m} agree with the simulator's {sim}; last {last}")
        rows.append(CheckResult(check, "torch-table", PASS if first_fail is None else FAIL, 1, tried, bound=0.0,
                                detail=detail))
    return rows
