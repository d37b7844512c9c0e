"""Rank layout: bijection, groups, node locality, worked GPU counts, closed forms, errors."""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distcheck.core.errors import ConfigError
from distcheck.parallel.layout import (
    EXAMPLES,
    ParallelConfig,
    coords,
    groups,
    groups_node_local,
    mesh_dim_names,
    mesh_shape,
    node_of,
    rank_of,
    tp_groups_node_local,
)
from distcheck.parallel.layout import forms as forms

# ---------------------------------------------------------------- hand cases


def test_default_order_is_llama3():
    cfg = ParallelConfig(tp=2, pp=2, dp=2)
    assert cfg.order == ("tp", "cp", "pp", "dp")
    assert mesh_dim_names(cfg) == ("dp", "pp", "cp", "tp")
    assert mesh_shape(cfg) == (2, 2, 1, 2)
    assert cfg.world_size == 8


def test_coords_hand_values():
    cfg = ParallelConfig(tp=2, pp=3, dp=2)  # rank = tp + 2*pp + 6*dp
    assert coords(cfg, 0) == {"tp": 0, "cp": 0, "pp": 0, "dp": 0}
    assert coords(cfg, 5) == {"tp": 1, "cp": 0, "pp": 2, "dp": 0}
    assert coords(cfg, 7) == {"tp": 1, "cp": 0, "pp": 0, "dp": 1}
    assert rank_of(cfg, tp=1, pp=2, dp=1) == 11
    assert rank_of(cfg, tp=1, cp=0, pp=2, dp=1) == 11


def test_groups_hand_values_default_order():
    cfg = ParallelConfig(tp=2, pp=2, dp=2)
    assert groups(cfg, "tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups(cfg, "pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert groups(cfg, "dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert groups(cfg, "cp") == [[r] for r in range(8)]


def test_groups_hand_values_dp_innermost():
    cfg = ParallelConfig(tp=2, pp=2, dp=2, order=("dp", "tp", "pp"))  # rank = dp + 2*tp + 4*pp
    assert cfg.order == ("dp", "tp", "pp", "cp")
    assert groups(cfg, "dp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups(cfg, "tp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert groups(cfg, "pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert coords(cfg, 6) == {"tp": 1, "cp": 0, "pp": 1, "dp": 0}


def test_string_order_equals_tuple_order():
    assert ParallelConfig(tp=2, dp=2, order="dp-tp") == ParallelConfig(tp=2, dp=2, order=("dp", "tp", "cp", "pp"))
    assert ParallelConfig(tp=2, order="tp-cp-pp-dp") == ParallelConfig(tp=2)


def test_groups_match_device_mesh_layout():
    """init_device_mesh(("dp","pp","tp")) lays ranks out as arange(world).reshape(dp, pp, tp)."""
    dp, pp, tp = 3, 2, 4
    grid = np.arange(dp * pp * tp).reshape(dp, pp, tp)
    cfg = ParallelConfig(tp=tp, pp=pp, dp=dp)
    want_tp = sorted(grid[d, p, :].tolist() for d in range(dp) for p in range(pp))
    want_pp = sorted(grid[d, :, t].tolist() for d in range(dp) for t in range(tp))
    want_dp = sorted(grid[:, p, t].tolist() for p in range(pp) for t in range(tp))
    assert groups(cfg, "tp") == want_tp
    assert groups(cfg, "pp") == want_pp
    assert groups(cfg, "dp") == want_dp


def test_ep_inside_dp_groups():
    cfg = ParallelConfig(tp=2, cp=2, dp=4, ep=4)  # rank = tp + 2*cp + 4*dp; world 16
    assert cfg.world_size == 16
    # (dp, cp) flattened dp-outer, blocks of 4: dp in {0,1} x cp in {0,1}, then dp in {2,3}
    assert groups(cfg, "ep") == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
    assert groups(ParallelConfig(dp=4, ep=2), "ep") == [[0, 1], [2, 3]]


def test_ep_outside_is_a_mesh_axis():
    cfg = ParallelConfig(tp=2, dp=2, ep=2, ep_placement="outside")
    assert cfg.world_size == 8
    assert cfg.order == ("tp", "cp", "pp", "dp", "ep")
    assert groups(cfg, "ep") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert coords(cfg, 7) == {"tp": 1, "cp": 0, "pp": 0, "dp": 1, "ep": 1}
    assert rank_of(cfg, tp=1, dp=1, ep=1) == 7


# ---------------------------------------------------------------- properties

_orders = st.permutations(["tp", "cp", "pp", "dp"])
_deg = st.integers(1, 4)


@settings(max_examples=40, deadline=None)
@given(tp=_deg, cp=_deg, pp=_deg, dp=_deg, order=_orders)
def test_bijection_and_group_partition(tp, cp, pp, dp, order):
    cfg = ParallelConfig(tp=tp, cp=cp, pp=pp, dp=dp, order=tuple(order))
    world = cfg.world_size
    assert world == tp * cp * pp * dp
    seen = set()
    for r in range(world):
        c = coords(cfg, r)
        assert rank_of(cfg, **c) == r
        seen.add(tuple(sorted(c.items())))
    assert len(seen) == world
    # innermost axis varies fastest
    inner = cfg.order[0]
    if cfg.degree(inner) > 1:
        assert coords(cfg, 1)[inner] == 1
    for axis in ("tp", "cp", "pp", "dp"):
        gs = groups(cfg, axis)
        assert len(gs) == cfg.num_groups(axis)
        assert sorted(r for g in gs for r in g) == list(range(world))
        assert gs == sorted(gs) and all(g == sorted(g) for g in gs)
        for g in gs:
            assert len(g) == cfg.degree(axis)
            cs = [coords(cfg, r) for r in g]
            assert sorted(c[axis] for c in cs) == list(range(cfg.degree(axis)))
            for other in ("tp", "cp", "pp", "dp"):
                if other != axis:
                    assert len({c[other] for c in cs}) == 1


# ---------------------------------------------------------------- worked figures


def test_lesson_llama3_405b():
    cfg = EXAMPLES["lesson.llama3_405b"]
    assert (cfg.tp, cfg.pp, cfg.dp) == (8, 16, 128)
    assert cfg.world_size == 16_384
    assert cfg.weights_fraction_per_gpu == Fraction(1, 128)


def test_chapter_1024():
    cfg = EXAMPLES["chapter.llama3_405b_1024"]
    assert (cfg.dp, cfg.tp, cfg.pp) == (16, 8, 8)
    assert cfg.world_size == 1_024


@pytest.mark.parametrize(
    "name, tp, cp, pp, dp, gpus",
    [
        ("llama3.table4.8192", 8, 1, 16, 64, 8_192),
        ("llama3.table4.16384", 8, 1, 16, 128, 16_384),
        ("llama3.table4.16384_long_context", 8, 16, 16, 8, 16_384),
    ],
)
def test_llama3_table4_rows(name, tp, cp, pp, dp, gpus):
    cfg = EXAMPLES[name]
    assert (cfg.tp, cfg.cp, cfg.pp, cfg.dp) == (tp, cp, pp, dp)
    assert cfg.world_size == gpus
    assert ParallelConfig(tp=tp, cp=cp, pp=pp, dp=dp, world_size=gpus) == cfg
    assert forms.WORLD_SIZE.evaluate(tp=tp, cp=cp, pp=pp, dp=dp) == gpus
    assert tp_groups_node_local(cfg)


def test_groups_of_16384_ranks():
    cfg = ParallelConfig(tp=8, pp=16, dp=128)
    tp_g, pp_g, dp_g = groups(cfg, "tp"), groups(cfg, "pp"), groups(cfg, "dp")
    assert (len(tp_g), len(pp_g), len(dp_g)) == (2048, 1024, 128)
    assert tp_g[0] == list(range(8)) and tp_g[-1] == list(range(16_376, 16_384))
    assert pp_g[0] == list(range(0, 128, 8))
    assert dp_g[0] == list(range(0, 16_384, 128)) and dp_g[-1] == list(range(127, 16_384, 128))
    assert tp_groups_node_local(cfg)
    assert not groups_node_local(cfg, "pp") and not groups_node_local(cfg, "dp")


def test_long_context_row_strides():
    cfg = EXAMPLES["llama3.table4.16384_long_context"]  # tp 8, cp 16, pp 16, dp 8
    assert groups(cfg, "cp")[0] == list(range(0, 128, 8))
    assert groups(cfg, "pp")[0] == list(range(0, 2048, 128))
    assert groups(cfg, "dp")[0] == list(range(0, 16_384, 2048))
    assert coords(cfg, 16_383) == {"tp": 7, "cp": 15, "pp": 15, "dp": 7}


# ---------------------------------------------------------------- nodes


def test_tp_node_local_only_when_tp_is_innermost():
    assert tp_groups_node_local(ParallelConfig(tp=8, pp=2, dp=4, gpus_per_node=8))
    dp_inner = ParallelConfig(tp=8, pp=2, dp=4, gpus_per_node=8, order=("dp", "tp", "cp", "pp"))
    assert not tp_groups_node_local(dp_inner)
    assert groups(dp_inner, "tp")[0] == list(range(0, 32, 4))
    assert groups_node_local(dp_inner, "dp")


def test_node_local_depends_on_gpus_per_node():
    assert not tp_groups_node_local(ParallelConfig(tp=8, dp=2, gpus_per_node=4))
    assert tp_groups_node_local(ParallelConfig(tp=4, dp=4, gpus_per_node=8))
    # consecutive groups of 4 straddle the boundary of 6-GPU nodes: ranks 4..7 sit on nodes 0 and 1
    assert not tp_groups_node_local(ParallelConfig(tp=4, dp=3, gpus_per_node=6))
    assert tp_groups_node_local(ParallelConfig(tp=3, dp=4, gpus_per_node=6))


def test_node_of():
    cfg = ParallelConfig(tp=8, pp=2, dp=2, gpus_per_node=8)
    assert [node_of(cfg, r) for r in (0, 7, 8, 31)] == [0, 0, 1, 3]


# ---------------------------------------------------------------- closed forms


def test_layout_forms():
    assert forms.WORLD_SIZE.name == "layout.world_size"
    assert forms.WORLD_SIZE.evaluate(tp=8, pp=16, dp=128) == 16_384
    assert forms.WORLD_SIZE.evaluate(tp=8, pp=8, dp=16) == 1_024
    assert forms.WORLD_SIZE_EP_OUTSIDE_DP.name == "layout.world_size.ep_outside_dp"
    assert forms.WORLD_SIZE_EP_OUTSIDE_DP.evaluate(tp=2, pp=1, dp=2, ep=3) == 12
    assert forms.NUM_GROUPS.evaluate(world_size=16_384, degree=8) == 2_048
    assert forms.WEIGHTS_FRACTION_PER_GPU.evaluate(tp=8, pp=16) == Fraction(1, 128)


@settings(max_examples=30, deadline=None)
@given(tp=_deg, cp=_deg, pp=_deg, dp=_deg, ep=st.integers(1, 3))
def test_reference_matches_forms(tp, cp, pp, dp, ep):
    cfg = ParallelConfig(tp=tp, cp=cp, pp=pp, dp=dp)
    assert cfg.world_size == forms.WORLD_SIZE.evaluate(tp=tp, cp=cp, pp=pp, dp=dp)
    out = ParallelConfig(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, ep_placement="outside")
    assert out.world_size == forms.WORLD_SIZE_EP_OUTSIDE_DP.evaluate(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep)
    for axis in ("tp", "cp", "pp", "dp"):
        assert len(groups(cfg, axis)) == forms.NUM_GROUPS.evaluate(world_size=cfg.world_size, degree=cfg.degree(axis))
    assert cfg.weights_fraction_per_gpu == forms.WEIGHTS_FRACTION_PER_GPU.evaluate(tp=tp, pp=pp)


def test_layers_do_not_import_each_other():
    code = (
        "import sys, distcheck.parallel.layout.forms, distcheck.parallel.comm.forms; "
        "assert 'distcheck.parallel.layout.reference' not in sys.modules; "
        "assert 'distcheck.parallel.comm.reference' not in sys.modules; "
        "import distcheck.parallel.layout, distcheck.parallel.comm; "
        "distcheck.parallel.layout.ParallelConfig, distcheck.parallel.comm.volume; "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- errors

CONFIG_ERRORS = [
    (dict(tp=8, pp=4, dp=2, world_size=100), "world_size=100 must equal tp*cp*pp*dp = 8*1*4*2 = 64"),
    (dict(dp=4, ep=3, world_size=5, ep_placement="outside"), "world_size=5 must equal tp*cp*pp*dp*ep = 1*1*1*4*3 = 12"),
    (dict(tp=0), "tp=0 must be >= 1"),
    (dict(pp=2.0), "pp=2.0 must be an integer"),
    (dict(dp=True), "dp=True must be an integer"),
    (dict(cp=-1), "cp=-1 must be >= 1"),
    (dict(gpus_per_node=0), "gpus_per_node=0 must be >= 1"),
    (dict(world_size=0), "world_size=0 must be >= 1"),
    (dict(dp=4, ep=3), "ep=3 must divide dp*cp = 4*1 = 4 (ep_placement='inside_dp')"),
    (dict(ep_placement="inside"), "ep_placement='inside' must be one of 'inside_dp', 'outside'"),
    (dict(order=("tp", "xp")), "order=('tp', 'xp') names an unknown axis 'xp' (axes: tp, cp, pp, dp, ep)"),
    (dict(order="tp-pp-tp"), "order='tp-pp-tp' repeats axis tp"),
    (dict(tp=2, pp=2, order=("tp",)), "order=('tp',) must list 'pp' (pp=2 > 1)"),
    (dict(dp=2, ep=2, order=("tp", "pp", "dp", "ep")),
     "order=('tp', 'pp', 'dp', 'ep') places ep outside dp, but ep=2 is carved from the dp*cp ranks "
     "(ep_placement='inside_dp'); put ep inside dp (e.g. 'tp-cp-ep-dp-pp') or use ep_placement='outside'"),
    (dict(order=3), "order=3 must be a sequence of axis names or a string like 'tp-cp-pp-dp'"),
]


@pytest.mark.parametrize("kwargs, message", CONFIG_ERRORS)
def test_config_errors(kwargs, message):
    with pytest.raises(ConfigError) as info:
        ParallelConfig(**kwargs)
    assert str(info.value) == message


def test_lookup_errors():
    cfg = ParallelConfig(tp=2, pp=2)
    cases = [
        (lambda: coords(cfg, 4), "rank=4 must be in range(0, 4) (world_size=4)"),
        (lambda: coords(cfg, -1), "rank=-1 must be in range(0, 4) (world_size=4)"),
        (lambda: coords(cfg, 1.0), "rank=1.0 must be an integer"),
        (lambda: rank_of(cfg, tp=2, pp=0), "tp=2 must be in range(0, 2) (tp degree = 2)"),
        (lambda: rank_of(cfg, tp=0), "pp=None is required (pp degree = 2 > 1)"),
        (lambda: rank_of(cfg, tp=0, pp=0, ep=0), "ep=0 is not a mesh axis (mesh axes: tp, cp, pp, dp)"),
        (lambda: rank_of(cfg, tp=0, pp=0, dp=1), "dp=1 must be in range(0, 1) (dp degree = 1)"),
        (lambda: groups(cfg, "sp"), "axis='sp' must be one of 'tp', 'cp', 'pp', 'dp', 'ep'"),
        (lambda: node_of(cfg, 9), "rank=9 must be in range(0, 4) (world_size=4)"),
    ]
    for call, message in cases:
        with pytest.raises(ConfigError) as info:
            call()
        assert str(info.value) == message


def test_form_input_errors():
    with pytest.raises(ConfigError, match="tp=0 must be an integer >= 1"):
        forms.WORLD_SIZE.evaluate(tp=0, pp=1, dp=1)
    with pytest.raises(ConfigError, match="dp=None is required by layout.world_size"):
        forms.WORLD_SIZE.evaluate(tp=1, pp=1)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.integers(1, 6), st.integers(1, 6), st.integers(1, 3),
       st.sampled_from([1, 2, 3, 4, 6, 8, 16]), st.permutations(["tp", "cp", "pp", "dp"]))
def test_node_locality_arithmetic_equals_listing_every_group(tp, pp, dp, cp, gpus_per_node, order):
    from distcheck.parallel.layout.reference import _groups_array

    cfg = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, gpus_per_node=gpus_per_node, order=tuple(order))
    for axis in ("tp", "cp", "pp", "dp"):
        nodes = _groups_array(cfg, axis) // gpus_per_node
        listed = bool(np.all(nodes.min(axis=1) == nodes.max(axis=1)))
        assert groups_node_local(cfg, axis) == listed, (cfg, axis)


def test_node_locality_at_a_trillion_ranks():
    big = ParallelConfig(tp=8, pp=10**6, dp=10**6)
    assert tp_groups_node_local(big) is True
    assert groups_node_local(big, "pp") is False
    assert tp_groups_node_local(ParallelConfig(tp=8, pp=10**6, dp=10**6, order="dp-tp-pp-cp")) is False
