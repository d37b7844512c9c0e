"""Pipeline schedules: the tick simulator (distcheck.parallel.pp) against the lesson's
figures and the sympy closed forms (pp.* of distcheck.closed_form). Every quantity is an
integer or a Fraction, so every comparison is exact equality."""

from __future__ import annotations

import re
from fractions import Fraction
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distcheck.core.errors import ConfigError
from distcheck.parallel.pp import (
    Action,
    DeadlockError,
    from_torch_actions,
    replay,
    schedule_order,
    simulate,
)
from distcheck.parallel.pp.forms import FORMS

F = {f.name: f for f in FORMS}
COSTS = [(1, 2), (1, 1), (2, 1), (1, 3), (3, 2), (2, 5)]


def pct(x: Fraction) -> float:
    return round(100 * float(x), 1)


# ---------------------------------------------------------------------------------------------
# figures of the lesson "Scaling and distributed training" ("Pipeline bubble" and exercises), t_f = 1, t_b = 2


@pytest.mark.parametrize(
    "p, m, step, fraction, percent",
    [
        (4, 4, 21, Fraction(3, 7), 42.9),
        (4, 16, 57, Fraction(3, 19), 15.8),
        (4, 32, 105, Fraction(3, 35), 8.6),
        (16, 4, 57, Fraction(15, 19), 78.9),
        (8, 8, 45, Fraction(7, 15), 46.7),   # exercise 1: 8 stages, 8 micro-batches
        (4, 12, 45, Fraction(1, 5), 20.0),   # knowledge check: 4 stages, 12 micro-batches = 3/15
    ],
)
def test_lesson_gpipe_figures(p, m, step, fraction, percent):
    t = simulate("gpipe", p, m)
    assert t.step_ticks == step == 3 * (m + p - 1)
    assert t.busy_ticks == (3 * m,) * p
    assert t.bubble_fraction == fraction
    assert pct(t.bubble_fraction) == percent
    assert t.bubble_ratio == Fraction(p - 1, m)
    assert F["pp.step_ticks.gpipe"].evaluate(p=p, m=m) == step
    assert F["pp.bubble_fraction.gpipe"].evaluate(p=p, m=m) == fraction


def test_lesson_p16_m4_is_79_percent():
    assert round(100 * float(simulate("gpipe", 16, 4).bubble_fraction)) == 79


def test_lesson_ratio_versus_fraction_m16():
    t = simulate("gpipe", 4, 16)
    assert t.bubble_ratio == Fraction(3, 16) and float(t.bubble_ratio) == 0.1875
    assert t.bubble_fraction == t.bubble_ratio / (1 + t.bubble_ratio) == Fraction(3, 19)
    assert t.step_ticks - t.busy_ticks[0] == 9  # idle ticks per rank: 3 forward + 6 backward slots


def test_lesson_doubling_stages_more_than_doubles_the_bubble():
    a, b = simulate("gpipe", 4, 32), simulate("gpipe", 8, 32)
    assert (a.bubble_fraction, b.bubble_fraction) == (Fraction(3, 35), Fraction(7, 39))
    assert b.bubble_fraction / a.bubble_fraction == Fraction(245, 117)  # about 2.09x, not 2x
    assert b.bubble_ratio / a.bubble_ratio == Fraction(7, 3)


def test_1f1b_matches_gpipe_step_with_less_stash():
    g, f = simulate("gpipe", 4, 8), simulate("1f1b", 4, 8)
    assert g.step_ticks == f.step_ticks == 33
    assert g.peak_in_flight == (8, 8, 8, 8)
    assert f.peak_in_flight == (4, 3, 2, 1)


# ---------------------------------------------------------------------------------------------
# simulator == closed forms


def _check_against_forms(schedule, p, m, v, t_f, t_b):
    t = simulate(schedule, p, m, v, t_f, t_b)
    kw = dict(p=p, m=m, t_f=t_f, t_b=t_b)
    if schedule == "interleaved":
        kw["v"] = v
    assert t.step_ticks == F[f"pp.step_ticks.{schedule}"].evaluate(**kw), (schedule, p, m, v, t_f, t_b)
    busy = F["pp.busy_ticks"].evaluate(p=p, m=m, v=v, t_f=t_f, t_b=t_b)
    assert t.busy_ticks == (busy,) * p
    assert t.bubble_fraction == F[f"pp.bubble_fraction.{schedule}"].evaluate(**kw)
    assert t.bubble_ratio == F[f"pp.bubble_ratio.{schedule}"].evaluate(**kw)
    assert t.bubble_fraction == t.bubble_ratio / (1 + t.bubble_ratio)
    peak = F[f"pp.peak_in_flight.{schedule}"].evaluate(**kw)
    assert t.peak_in_flight[0] == max(t.peak_in_flight) == peak
    return t


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_simulator_equals_closed_forms_flat(schedule):
    for p in range(1, 6):
        for m in range(1, 10):
            for t_f, t_b in COSTS:
                t = _check_against_forms(schedule, p, m, 1, t_f, t_b)
                if schedule == "gpipe":
                    assert t.peak_in_flight == (m,) * p
                else:
                    assert t.peak_in_flight == tuple(min(p - r, m) for r in range(p))


def test_simulator_equals_closed_forms_interleaved():
    for p in range(1, 6):
        for k in (1, 2, 3):
            for v in (2, 3, 4):
                for t_f, t_b in COSTS:
                    m = k * p
                    t = _check_against_forms("interleaved", p, m, v, t_f, t_b)
                    assert t.peak_in_flight == tuple(min(2 * (p - r - 1) + (v - 1) * p + 1, v * m) for r in range(p))


@settings(max_examples=30, deadline=None)
@given(
    p=st.integers(1, 8), k=st.integers(1, 4), v=st.integers(2, 5),
    t_f=st.integers(1, 7), t_b=st.integers(1, 7),
)
def test_interleaved_narayanan_exact_property(p, k, v, t_f, t_b):
    """(1/v)(p-1)/m is the exact bubble ratio of the interleaved order whenever m % p == 0."""
    t = simulate("interleaved", p, k * p, v, t_f, t_b)
    assert t.step_ticks == (v * k * p + p - 1) * (t_f + t_b)
    assert t.bubble_ratio == Fraction(p - 1, v * k * p)


def test_interleaved_beats_1f1b_by_v():
    a, b = simulate("1f1b", 4, 8), simulate("interleaved", 4, 8, 2)
    assert a.bubble_ratio == Fraction(3, 8) and b.bubble_ratio == Fraction(3, 16)
    assert b.step_ticks == (2 * 8 + 3) * 3 == 57


# ---------------------------------------------------------------------------------------------
# orders and replay


def test_schedule_orders_gpipe_and_1f1b():
    g = schedule_order("gpipe", 2, 2)
    assert g[1] == [Action("F", 0, 1), Action("F", 1, 1), Action("B", 0, 1), Action("B", 1, 1)]
    f = schedule_order("1f1b", 3, 4)
    assert [f"{a.kind}{a.microbatch}" for a in f[0]] == ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"]
    assert [f"{a.kind}{a.microbatch}" for a in f[2]] == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]
    assert all(a.stage == r for r, acts in f.items() for a in acts)


def test_schedule_order_interleaved_stages_and_warmup():
    o = schedule_order("interleaved", 2, 4, 2)
    assert {a.stage for a in o[0]} == {0, 2} and {a.stage for a in o[1]} == {1, 3}
    # rank 0 warms up with 2(p-1) + (v-1)p = 4 forwards: mb 0,1 on chunk 0, then mb 0,1 on chunk 1
    assert o[0][:5] == [Action("F", 0, 0), Action("F", 1, 0), Action("F", 0, 2), Action("F", 1, 2), Action("F", 2, 0)]
    assert o[0][5] == Action("B", 0, 2)  # first backward: the last chunk
    assert sum(a.kind == "F" for a in o[1]) == sum(a.kind == "B" for a in o[1]) == 8


@pytest.mark.parametrize("schedule, p, m, v", [("gpipe", 3, 5, 1), ("1f1b", 4, 6, 1), ("interleaved", 3, 6, 2)])
def test_replay_of_schedule_order_equals_simulate(schedule, p, m, v):
    order = schedule_order(schedule, p, m, v)
    a = replay(order, v * p, m, t_f=2, t_b=3)
    b = simulate(schedule, p, m, v, t_f=2, t_b=3)
    assert a == b
    # a list of lists and interspersed None (idle slots, as in torch's pipeline_order) change nothing
    padded = [[None] * r + [x for act in order[r] for x in (act, None)] for r in range(p)]
    assert replay(padded, v * p, m, t_f=2, t_b=3) == b


def test_replay_split_backward_by_hand():
    order = {
        0: [Action("F", 0, 0), Action("F", 1, 0), Action("I", 0, 0), Action("I", 1, 0),
            Action("W", 0, 0), Action("W", 1, 0)],
        1: [Action("F", 0, 1), Action("I", 0, 1), Action("F", 1, 1), Action("I", 1, 1),
            Action("W", 0, 1), Action("W", 1, 1)],
    }
    t = replay(order, 2, 2, t_f=1, t_i=1, t_w=1)
    starts = {(s.rank, str(s.action)): s.start for s in t.spans}
    assert starts[(1, "F(mb=1, stage=1)")] == 3 and starts[(0, "I(mb=0, stage=0)")] == 3
    assert starts[(0, "I(mb=1, stage=0)")] == 5
    assert t.step_ticks == 8 and t.busy_ticks == (6, 6)
    assert t.bubble_fraction == Fraction(1, 4) and t.bubble_ratio == Fraction(1, 3)
    assert t.peak_in_flight == (2, 2)
    assert replay(order, 2, 2, t_b=2) == t  # t_i = t_w = t_b / 2 by default
    assert replay(order, 2, 2, t_i=2, t_w=1).step_ticks == 11


def test_deadlock_names_rank_and_action():
    order = {
        0: [Action("F", 0, 0), Action("B", 0, 0), Action("F", 1, 0), Action("B", 1, 0)],
        1: [Action("F", 0, 1), Action("F", 1, 1), Action("B", 0, 1), Action("B", 1, 1)],
    }
    with pytest.raises(DeadlockError) as info:
        replay(order, 2, 2)
    err = info.value
    assert err.rank == 0 and err.action == Action("B", 0, 0) and err.waiting_for == Action("B", 0, 1)
    assert err.blocked[1] == (Action("F", 1, 1), Action("F", 1, 0))
    assert str(err).startswith("deadlock: rank 0 cannot run B(mb=0, stage=0)")
    assert "rank 1 at F(mb=1, stage=1) waits for F(mb=1, stage=0)" in str(err)
    # a rank waiting on itself (backward before its own forward) is a deadlock too
    with pytest.raises(DeadlockError, match=r"rank 0 at B\(mb=0, stage=0\) waits for F\(mb=0, stage=0\)"):
        replay({0: [Action("B", 0, 0), Action("F", 0, 0)]}, 1, 1)


# ---------------------------------------------------------------------------------------------
# render


@pytest.mark.parametrize("schedule, p, m, v", [("gpipe", 4, 4, 1), ("1f1b", 3, 5, 1), ("interleaved", 2, 4, 2)])
def test_render_has_one_column_per_tick(schedule, p, m, v):
    t = simulate(schedule, p, m, v)
    lines = t.render().splitlines()
    assert len(lines) == p + 1
    assert lines[0].split("|", 1)[1].split() == [str(i) for i in range(t.step_ticks)]
    for r, line in enumerate(lines[1:]):
        name, cells = line.split("|", 1)
        assert name.strip() == f"rank {r}"
        cells = cells.split()
        assert len(cells) == t.step_ticks
        assert sum(c != "." for c in cells) == t.busy_ticks[r]


def test_render_labels():
    lines = simulate("gpipe", 2, 2).render().splitlines()
    assert lines[1].split("|")[1].split() == ["F0", "F1", ".", ".", ".", "B0", "B0", "B1", "B1"]
    lines = simulate("interleaved", 2, 2, 2).render().splitlines()
    assert lines[1].split("|")[1].split()[:3] == ["F0.0", "F1.0", "F0.1"]


# ---------------------------------------------------------------------------------------------
# torch.distributed.pipelining adapter (duck-typed; torch itself is optional)


def _fake(kind_name, mb, stage, sub=None):
    return SimpleNamespace(computation_type=SimpleNamespace(name=kind_name), microbatch_index=mb, stage_index=stage,
                           sub_actions=sub)


def test_from_torch_actions_duck_typed():
    order = {
        0: [_fake("FORWARD", 0, 0), None, _fake("SEND_F", 0, 0), _fake("BACKWARD_INPUT", 0, 0),
            _fake("BACKWARD_WEIGHT", 0, 0), _fake("REDUCE_GRAD", None, 0)],
        1: [None, _fake("OVERLAP_F_B", None, 1, sub=(_fake("FORWARD", 0, 1), _fake("FULL_BACKWARD", 0, 1)))],
    }
    assert from_torch_actions(order) == {
        0: [Action("F", 0, 0), Action("I", 0, 0), Action("W", 0, 0)],
        1: [Action("F", 0, 1), Action("B", 0, 1)],
    }
    with pytest.raises(ConfigError, match=r"has computation type 'TELEPORT'"):
        from_torch_actions({0: [_fake("TELEPORT", 0, 0)]})


def test_from_torch_actions_real_torch_orders():
    torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    _Action, ct = torch_schedules._Action, torch_schedules._ComputationType
    assert from_torch_actions([[_Action(0, ct.FORWARD, 3), None, _Action(0, ct.FULL_BACKWARD, 3)]]) == {
        0: [Action("F", 3, 0), Action("B", 3, 0)]
    }
    gpipe = torch_schedules.ScheduleGPipe._get_pipeline_order(SimpleNamespace(_num_stages=3, _n_microbatches=4))
    assert from_torch_actions(gpipe) == schedule_order("gpipe", 3, 4)
    one = torch_schedules.Schedule1F1B._get_pipeline_order(SimpleNamespace(_num_stages=4, _n_microbatches=6))
    mine = schedule_order("1f1b", 4, 6)
    for r in range(3):  # torch 2.13's IR for the last rank starts at micro-batch 1; ranks 0..p-2 agree
        assert from_torch_actions(one)[r] == mine[r]
    for p, m, v in [(2, 4, 2), (4, 8, 2), (3, 6, 3)]:
        fake_self = SimpleNamespace(n_local_stages=v, pp_group_size=p, microbatches_per_round=p, _n_microbatches=m)
        ops = torch_schedules.ScheduleInterleaved1F1B._calculate_single_rank_operations
        raw = {r: ops(fake_self, r) for r in range(p)}
        assert from_torch_actions(raw) == schedule_order("interleaved", p, m, v)
        assert replay(from_torch_actions(raw), v * p, m) == simulate("interleaved", p, m, v)


# ---------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(schedule="zb", p=2, m=2), "schedule='zb' must be one of 'gpipe', '1f1b', 'interleaved'"),
        (dict(schedule="gpipe", p=0, m=2), "p=0 must be >= 1"),
        (dict(schedule="gpipe", p=2, m=0), "m=0 must be >= 1"),
        (dict(schedule="1f1b", p=2, m=2.0), "m=2.0 must be an integer"),
        (dict(schedule="interleaved", p=2, m=2, v=0), "v=0 must be >= 1"),
        (dict(schedule="interleaved", p=2, m=4, v=1),
         "v=1 must be >= 2 for the interleaved schedule (v=1 is plain 1f1b)"),
        (dict(schedule="interleaved", p=4, m=6, v=2), "m=6 must be a multiple of p=4 for the interleaved schedule"),
        (dict(schedule="gpipe", p=2, m=2, v=2),
         "v=2 must be 1 for the gpipe schedule (chunks per rank need 'interleaved')"),
        (dict(schedule="1f1b", p=2, m=2, t_f=0), "t_f=0 must be >= 1 tick"),
        (dict(schedule="1f1b", p=2, m=2, t_b=1.5), "t_b=1.5 must be a positive integer number of ticks"),
        (dict(schedule="1f1b", p=2, m=2, t_b=True), "t_b=True must be a positive integer number of ticks"),
    ],
)
def test_simulate_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        simulate(**kwargs)
    if "t_f" not in kwargs and "t_b" not in kwargs:
        with pytest.raises(ConfigError, match=re.escape(message)):
            schedule_order(**kwargs)


A = Action


@pytest.mark.parametrize(
    "order, kwargs, message",
    [
        ({0: [A("F", 0, 0)]}, {}, "order='B(mb=0, stage=0)' is missing"),
        ({0: [A("B", 0, 0)]}, {}, "order='F(mb=0, stage=0)' is missing"),
        ({0: [A("F", 0, 0), A("F", 0, 0), A("B", 0, 0)]}, {}, "order='F(mb=0, stage=0)' appears twice (ranks 0 and 0)"),
        ({0: [A("F", 0, 1), A("B", 0, 1)]}, {}, "stage=1 must be < num_stages=1"),
        ({0: [A("F", 1, 0), A("B", 1, 0)]}, {}, "microbatch=1 must be < num_microbatches=1"),
        ({0: [A("F", 0, 0)], 1: [A("B", 0, 0)]}, {}, "stage=0 must live on one rank (found on ranks 0 and 1)"),
        ({0: [A("F", 0, 0), A("B", 0, 0)]}, {"stage_to_rank": [1]}, "stage_to_rank=1 puts stage 0 on rank 1"),
        ({0: [A("F", 0, 0), A("B", 0, 0), A("I", 0, 0)]}, {}, "mixes a full backward B with split I/W"),
        ({0: [A("F", 0, 0), A("I", 0, 0)]}, {}, "order='W(mb=0, stage=0)' is missing"),
        ({0: [A("F", 0, 0), A("I", 0, 0), A("W", 0, 0)]}, {"t_b": 3},
         "t_i=None is required when the order has I/W actions and t_b=3 is odd"),
        ({0: [A("F", 0, 0), A("I", 0, 0), A("W", 0, 0)]}, {"t_i": 1, "t_w": 0}, "t_w=0 must be >= 1 tick"),
        ({0: ["0F0"]}, {}, "order[0]='0F0' must hold Action objects or None"),
        ({-1: []}, {}, "rank=-1 must be an integer >= 0"),
        ({}, {}, "order={} must have at least one rank"),
        ({0: [A("F", 0, 0), A("B", 0, 0)]}, {"num_stages": 0}, "num_stages=0 must be >= 1"),
    ],
)
def test_replay_config_errors(order, kwargs, message):
    kw = {"num_stages": 1, "num_microbatches": 1, **kwargs}
    with pytest.raises(ConfigError, match=re.escape(message)):
        replay(order, **kw)


def test_action_validation():
    with pytest.raises(ConfigError, match=re.escape("kind='X' must be one of 'F', 'B', 'I', 'W'")):
        Action("X", 0, 0)
    with pytest.raises(ConfigError, match=re.escape("microbatch=-1 must be an integer >= 0")):
        Action("F", -1, 0)
    with pytest.raises(ConfigError, match=re.escape("stage=None must be an integer >= 0")):
        Action("F", 0, None)


def test_closed_form_inputs_and_constraints():
    assert F["pp.peak_in_flight.1f1b"].evaluate(p=8, m=3) == 3
    assert F["pp.busy_ticks"].evaluate(p=4, m=4) == 12  # v = 1, t_f = 1, t_b = 2 by default
    assert "m % p == 0" in " ".join(F["pp.bubble_ratio.interleaved"].constraints)
    with pytest.raises(ConfigError, match=re.escape("v=2 is not an input of pp.step_ticks.gpipe")):
        F["pp.step_ticks.gpipe"].evaluate(p=4, m=4, v=2)
    names = {
        "pp.step_ticks.gpipe", "pp.step_ticks.1f1b", "pp.step_ticks.interleaved",
        "pp.busy_ticks",
        "pp.bubble_fraction.gpipe", "pp.bubble_fraction.1f1b", "pp.bubble_fraction.interleaved",
        "pp.bubble_ratio.gpipe", "pp.bubble_ratio.1f1b", "pp.bubble_ratio.interleaved",
        "pp.peak_in_flight.gpipe", "pp.peak_in_flight.1f1b",
    }
    assert names <= set(F)
