"""Zero-bubble and DualPipe schedules: pinned timelines, the published formulas against the simulator
with their smallest counterexamples, which reading of "B" a printed figure uses, shape rules."""

from __future__ import annotations

from fractions import Fraction

import pytest

from distcheck.closed_form import get
from distcheck.core.errors import ConfigError
from distcheck.parallel.pp import Action, DeadlockError, replay, schedule_order, simulate


def test_zb_h1_pinned():
    t = simulate("zb_h1", 4, 8)  # t_b = 2: I = W = 1, Qi et al.'s equal costs
    assert (t.step_ticks, t.idle_ticks, t.peak_in_flight) == (27, (3, 3, 3, 3), (4, 4, 4, 4))
    assert t.render().splitlines()[1].split("|")[1].split() == \
        "F0 F1 F2 F3 . . . I0 W0 F4 I1 W1 F5 I2 W2 F6 I3 W3 F7 I4 W4 I5 W5 I6 W6 I7 W7".split()
    assert simulate("1f1b", 4, 8).idle_ticks[0] == 3 * t.idle_ticks[0]  # a third of 1F1B's (Qi et al. §2.1)


def test_zb_h2_and_zb_v_idle_only_at_the_barrier():
    h2, zv = simulate("zb_h2", 4, 12), simulate("zb_v", 4, 12)
    assert h2.window_idle_ticks == (0, 0, 0, 0) and h2.idle_ticks == (3, 3, 3, 3) and h2.peak_in_flight == (7,) * 4
    assert zv.window_idle_ticks == (0, 0, 0, 0) and zv.idle_ticks == (3, 3, 3, 3) and max(zv.peak_in_flight) == 8


def test_dualpipe_pinned_with_its_pairs():
    t = simulate("dualpipe", 4, 8)  # F = I = W = 1, F&B = 3
    assert (max(t.idle_ticks), max(t.peak_in_flight), t.num_stages) == (2, 5, 8)
    assert any("+" in cell for cell in t.render().split())  # overlapped pairs drawn as F3+B1
    order = schedule_order("dualpipe", 4, 8)
    assert any(isinstance(u, tuple) for u in order[0])
    assert max(simulate("dualpipev", 4, 8).idle_ticks) == 6  # (PP/2-1)(F&B+B-3W) = 3 (3 + 2 - 3), PP = 8


def test_published_formulas_outside_their_regime_smallest_cases():
    # Qi et al. Table 2, ZB-H1 (p-1)(T_F+T_B-T_W): 0 for p = 2, T_F = T_B = 1, T_W = 2; the order idles 1 tick a rank
    assert get("pp.bubble_ticks.zb_h1.published").evaluate(p=2, t_f=1, t_i=1, t_w=2) == 0
    assert simulate("zb_h1", 2, 2, t_f=1, t_i=1, t_w=2).idle_ticks == (1, 1)
    # ZB-H2 (p-1)(T_F+T_B-2T_W) is the steady bubble: with a barrier p = 2, m = 3 idles 1 tick a rank
    t = simulate("zb_h2", 2, 3)
    assert get("pp.bubble_ticks.zb_h2.published").evaluate(p=2, t_f=1, t_i=1, t_w=1) == 0
    assert (t.idle_ticks, t.window_idle_ticks) == ((1, 1), (0, 0))
    # DeepSeek-V3 Table 2, DualPipe(V) (PP/2-1)(F&B+B-3W): DualPipeV PP = 4, m = 4, F = I = 1, W = 2, F&B = 4:
    # formula 1, simulated 2
    assert get("pp.bubble_ticks.dualpipe.published").evaluate(pp=4, t_fb=4, b=3, t_w=2) == 1
    assert max(simulate("dualpipev", 2, 4, t_f=1, t_i=1, t_w=2, t_fb=4).idle_ticks) == 2
    # DualPipe with a pair faster than F + I (F&B = 1): formula 0, simulated 2
    assert get("pp.bubble_ticks.dualpipe.published").evaluate(pp=4, t_fb=1, b=2, t_w=1) == 0
    assert max(simulate("dualpipe", 4, 8, t_fb=1).idle_ticks) == 2


def test_the_same_zb1p_text_names_two_schedules():
    # DeepSeek's ZB1P (PP-1)(F+B-2W) with its full B is Qi et al.'s ZB-H1; read with an input-gradient B it is
    # Qi et al.'s ZB-H2 expression: at p = 4, F = 1, W = 1, B = 2 the two readings give 3 and 0 ticks
    full = get("pp.bubble_ticks.zb_h1.b_full").evaluate(p=4, t_f=1, b=2, t_w=1)
    assert full == max(simulate("zb_h1", 4, 8, t_f=1, t_i=1, t_w=1).idle_ticks) == 3
    as_h2 = get("pp.bubble_ticks.zb_h2.published").evaluate(p=4, t_f=1, t_i=2, t_w=1)
    assert as_h2 == max(simulate("zb_h2", 4, 8, t_f=1, t_i=2, t_w=1).window_idle_ticks) == 3 * (1 + 2 - 2)


def test_the_audit_names_the_reading_of_b():
    from distcheck.audit import audit_file
    from distcheck.golden import default_golden_dir

    v = {c.claim.id: c for c in audit_file(default_golden_dir() / "zero_bubble.toml").claims}
    assert v["ds.zb1p.bubble"].verdict == "holds"
    read = v["ds.zb1p.bubble_read_as_input_b"]
    assert read.verdict == "holds-under-another-convention"
    assert read.convention == "B is the full backward (input and weight gradients: DeepSeek-V3 Table 2)"
    assert read.computed == 14  # (p-1) max(F + B - W, F, B) with B = 2 read as the input-gradient pass
    assert v["readme.zb2p.rate"].convention.startswith("no barrier between steps")
    assert v["qi.zb_h1.bubble_heavy_w"].verdict == "wrong" and v["qi.zb_h1.bubble_heavy_w"].computed == 1


def test_forms_carry_their_regimes():
    assert "m >= p" in get("pp.bubble_ticks.zb_h1").constraints
    assert any("2t <= t_fb <= 3t" in c for c in get("pp.bubble_ticks.dualpipev").constraints)
    assert get("pp.bubble_fraction.zb_v").evaluate(p=4, m=8) == Fraction(3, 51)
    assert get("pp.parameter_copies.dualpipe").evaluate(p=4) == 2


@pytest.mark.parametrize("schedule, p, m, match", [
    ("dualpipe", 3, 12, "p=3 must be even"), ("dualpipe", 4, 6, "m=6 must be even and >= 2p = 8"),
    ("dualpipev", 4, 7, "m=7 must be >= 2p = 8"), ("interleaved_zb", 4, 9, "rounds"),
])
def test_shape_rules(schedule, p, m, match):
    with pytest.raises(ConfigError, match=match):
        simulate(schedule, p, m)


def test_v_is_fixed_where_the_schedule_fixes_it():
    assert simulate("zb_v", 4, 8).num_stages == 8
    with pytest.raises(ConfigError, match="v=3 must be 2 for the zb_v schedule"):
        simulate("zb_v", 4, 8, 3)


def test_split_costs():
    assert simulate("zb_h1", 2, 2, t_b=3, t_i=1).busy_ticks == (2 * (1 + 1 + 2),) * 2  # t_w = t_b - t_i
    with pytest.raises(ConfigError, match="t_i=None is required for the zb_h1 schedule when t_b=3 is odd"):
        simulate("zb_h1", 2, 2, t_b=3)
    with pytest.raises(ConfigError, match=r"t_b=5 must equal t_i \+ t_w = 1 \+ 1"):
        simulate("zb_h1", 2, 2, t_b=5, t_i=1, t_w=1)


def test_a_weight_pass_before_its_input_pass_is_a_deadlock():
    with pytest.raises(DeadlockError) as e:
        replay({0: [Action("F", 0, 0), Action("W", 0, 0), Action("I", 0, 0)]}, 1, 1)
    assert e.value.blocked == {0: (Action("W", 0, 0), Action("I", 0, 0))}


def test_large_run_without_grid():
    t = simulate("interleaved", 64, 1024, 4, t_f=20, t_b=20)
    assert t.step_ticks == (4 * 1024 + 63) * 40 and set(t.idle_ticks) == {63 * 40}
    with pytest.raises(ConfigError, match="MAX_GRID_CELLS"):
        t.grid  # noqa: B018 - 64 ranks x 165,360 ticks
    with pytest.raises(ConfigError, match="MAX_ACTIONS"):
        schedule_order("1f1b", 100, 50_001)


def test_both_engines_agree_on_every_schedule():
    from distcheck.parallel.pp import SCHEDULES

    for s in SCHEDULES:
        a = simulate(s, 4, 8, t_f=2, engine="sweeps")
        b = simulate(s, 4, 8, t_f=2, engine="list")
        assert (a.start == b.start).all() and (a.end == b.end).all() and a.peak_in_flight == b.peak_in_flight
