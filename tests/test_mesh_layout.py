"""Layouts over any named axes: foreign order strings, size-1 axes, HSDP, borrowed ep, multi-axis groups."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distcheck.core.errors import ConfigError
from distcheck.parallel.layout import (
    AxisLayout,
    ParallelConfig,
    derive_degree,
    groups,
    megatron_layout,
    parse_order,
    torchtitan_layout,
)


def test_megatron_order_with_size_one_axes_hand_values():
    # tp-cp-ep-dp-pp with cp = ep = 1: rank = t + 2 d + 4 p
    lay = AxisLayout.from_order("tp-cp-ep-dp-pp", tp=2, cp=1, ep=1, dp=2, pp=2)
    assert lay.world_size == 8 and lay.order == "tp-cp-ep-dp-pp"
    assert lay.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert lay.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert lay.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert lay.groups("tp-pp") == [[0, 1, 4, 5], [2, 3, 6, 7]]        # model-parallel groups
    assert lay.groups("dp-cp") == lay.groups("dp")                     # cp of size 1 adds nothing
    assert lay.coords(7) == {"tp": 1, "cp": 0, "ep": 0, "dp": 1, "pp": 1}


def test_axes_left_out_of_the_order_are_size_one_and_appended_outermost():
    lay = AxisLayout.from_order("tp-dp", tp=2, dp=2, cp=1)
    assert lay.axes == ("tp", "dp", "cp")
    with pytest.raises(ConfigError, match="must list 'cp'"):
        AxisLayout.from_order("tp-dp", tp=2, dp=2, cp=2)


@pytest.mark.parametrize("order, rule", [
    ("tp-tp-dp", "repeats axis tp"),
    ("tp-xp-dp", "names axis 'xp', which has no degree"),
    ("", "must name axes"),
])
def test_bad_orders_are_refused(order, rule):
    with pytest.raises(ConfigError, match=rule):
        AxisLayout.from_order(order, tp=2, dp=2)


@pytest.mark.parametrize("degrees", [{"tp": 0, "dp": 2}, {"tp": -1, "dp": 2}, {"tp": True, "dp": 2}])
def test_zero_negative_and_bool_degrees_are_refused(degrees):
    with pytest.raises(ConfigError, match="tp="):
        AxisLayout.from_order("tp-dp", **degrees)


def test_world_size_must_match():
    with pytest.raises(ConfigError, match="world_size=5 must equal tp\\*dp = 4"):
        AxisLayout.from_order("tp-dp", tp=2, dp=2, world_size=5)


def test_derive_degree_is_the_minus_one_sentinel():
    assert derive_degree(64, tp=8, pp=2) == 4
    assert derive_degree(7) == 7
    with pytest.raises(ConfigError, match="world_size=10 must be a multiple of tp\\*pp = 4"):
        derive_degree(10, tp=2, pp=2)
    with pytest.raises(ConfigError, match="tp=0"):
        derive_degree(8, tp=0)


def test_blocks_and_strided_borrow_an_axis():
    lay = AxisLayout.from_order("tp-dp", tp=2, dp=4)  # rank = t + 2 d
    assert lay.blocks("dp", 2) == [[0, 2], [1, 3], [4, 6], [5, 7]]     # consecutive dp indices, tp fixed
    assert lay.strided("dp", 2) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert lay.blocks("tp-dp", 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]    # borrowed from tp and dp together
    with pytest.raises(ConfigError, match="size=3 must divide the product of the host axes"):
        lay.blocks("dp", 3)


def test_torchtitan_hsdp_hand_values():
    # mesh (pp, dp_replicate, dp_shard, cp, tp) = (1, 2, 2, 1, 2): rank = t + 2 s + 4 r
    tt = torchtitan_layout(dp_replicate=2, dp_shard=-1, tp=2, world_size=8)
    assert tt.dense.degree("dp_shard") == 2
    assert tt.groups("dp_shard") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert tt.groups("dp_replicate") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert tt.groups("batch") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert tt.groups("fsdp") == tt.groups("dp_shard")
    with pytest.raises(ConfigError, match="ep=3 must divide dp_shard\\*cp\\*tp"):
        torchtitan_layout(dp_shard=2, tp=2, ep=3, world_size=4)


def test_torchtitan_ep_borrows_tp_unlike_distchecks_inside_dp():
    tt = torchtitan_layout(dp_shard=2, tp=2, ep=2, world_size=4)   # rank = t + 2 s
    assert tt.groups("ep") == [[0, 1], [2, 3]]                     # consecutive: the tp ranks
    assert tt.groups("efsdp") == [[0, 2], [1, 3]]
    assert groups(ParallelConfig(tp=2, dp=2, ep=2), "ep") == [[0, 2], [1, 3]]   # distcheck: from dp*cp only


def test_megatron_expert_layout_hand_values():
    meg = megatron_layout(tp=2, pp=1, ep=2, world_size=8)          # dp = 4; expert dp = 8 / (2*2) = 2
    assert meg.groups("ep", expert=True) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert meg.groups("dp", expert=True) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert meg.groups("tp-ep", expert=True) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ConfigError, match="world_size=None is required when dp is not given"):
        megatron_layout(tp=2)


def test_parse_order_accepts_sequences_and_commas():
    assert parse_order("tp,cp-dp") == ("tp", "cp", "dp")
    assert parse_order(["tp", "dp"]) == ("tp", "dp")
    with pytest.raises(ConfigError, match="order"):
        parse_order(3)


# ---------------------------------------------------- against distcheck.parallel.layout (independent reference)

_AXES = ("tp", "cp", "pp", "dp")


@settings(max_examples=60, deadline=None)
@given(st.tuples(*(st.integers(1, 3) for _ in _AXES)), st.permutations(_AXES))
def test_single_axis_groups_equal_distcheck_layout_under_any_order(degrees, order):
    kw = dict(zip(_AXES, degrees, strict=True))
    cfg = ParallelConfig(**kw, order=tuple(order))
    lay = AxisLayout.from_order(order, **kw)
    for a in _AXES:
        assert lay.groups(a) == groups(cfg, a)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(1, 4), st.data())
def test_megatron_default_ep_is_distchecks_ep_inside_dp(tp, cp, pp, dp, data):
    ep = data.draw(st.sampled_from([d for d in range(1, cp * dp + 1) if cp * dp % d == 0]))
    meg = megatron_layout(tp=tp, cp=cp, pp=pp, ep=ep, dp=dp)
    cfg = ParallelConfig(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, order="tp-cp-ep-dp-pp")
    assert meg.groups("ep", expert=True) == groups(cfg, "ep")
    for a in _AXES:
        assert meg.groups(a) == groups(cfg, a)


def test_multi_axis_groups_are_unions_along_the_axes():
    lay = AxisLayout.from_order("tp-cp-dp-pp", tp=2, cp=2, dp=2, pp=2)
    for a, b in itertools.combinations(("tp", "cp", "dp", "pp"), 2):
        joint = lay.groups(f"{a}-{b}")
        assert all(len(g) == 4 for g in joint)
        # each joint group is a union of a-groups, and of b-groups
        for single in (a, b):
            parts = [g for g in lay.groups(single) if set(g) <= set(joint[0])]
            assert sorted(r for g in parts for r in g) == joint[0]


# ----------------------------------------------------- distcheck.parallel.layout accepts Megatron's order strings


def test_parallel_config_accepts_megatron_order_strings():
    cfg = ParallelConfig(tp=2, dp=4, pp=2, ep=2, order="tp-cp-ep-dp-pp")
    assert cfg.order == ("tp", "cp", "dp", "pp")
    assert groups(cfg, "ep") == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    assert ParallelConfig(tp=2, dp=2, order="tp-cp-ep-dp-pp").order == ("tp", "cp", "dp", "pp")
    with pytest.raises(ConfigError, match="places ep outside dp"):
        ParallelConfig(tp=2, dp=4, ep=2, order="tp-cp-dp-ep-pp")
    with pytest.raises(ConfigError, match="repeats axis"):
        ParallelConfig(tp=2, dp=2, order="tp-tp-dp")
