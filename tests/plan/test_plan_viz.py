"""Figures check their content: idle cells, stacked heights, rank groups; PNG decodes and SVG parses."""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from fractions import Fraction

import pytest

mpl_image = pytest.importorskip("matplotlib.image")

from distcheck.core.errors import ConfigError  # noqa: E402
from distcheck.parallel import layout  # noqa: E402
from distcheck.parallel import pp as pipeline  # noqa: E402
from distcheck.plan import Hardware, Layout, Workload, resolve_model  # noqa: E402
from distcheck.plan.charts import memory_chart_data  # noqa: E402
from distcheck.viz import layout_diagram, memory_bars, pipeline_gantt, save_figure  # noqa: E402


def _gids(fig, prefix: str) -> list[str]:
    return [a.get_gid() for a in fig.findobj() if isinstance(a.get_gid(), str) and a.get_gid().startswith(prefix)]


def _svg_ids(path) -> list[str]:
    root = ET.parse(path).getroot()  # raises if the SVG does not parse
    return [el.get("id") for el in root.iter() if el.get("id")]


@pytest.mark.parametrize("schedule, p, m, v", [("gpipe", 4, 4, 1), ("1f1b", 4, 8, 1), ("1f1b", 1, 3, 1),
                                               ("interleaved", 3, 6, 2), ("gpipe", 2, 1, 1)])
def test_gantt_draws_one_idle_cell_per_idle_tick_where_the_simulator_idles(schedule, p, m, v, tmp_path):
    t = pipeline.simulate(schedule, p, m, v)
    fig = pipeline_gantt(t, name=schedule)
    idle = _gids(fig, "idle-")
    assert len(idle) == sum(t.idle_ticks)
    cells = {tuple(int(x) for x in re.fullmatch(r"idle-r(\d+)-t(\d+)", g).groups()) for g in idle}
    assert cells == {(r, k) for r, row in enumerate(t.grid) for k, a in enumerate(row) if a is None}
    # every action drawn once, starting where the simulator placed it
    origin = min(s.start for s in t.spans)
    assert sorted(g for g in _gids(fig, "") if not g.startswith("idle-")) == sorted(
        f"{s.action.kind}-r{s.rank}-t{s.start - origin}" for s in t.spans)
    title = fig.axes[0].get_title()
    frac = t.bubble_fraction
    assert f"step {t.step_ticks} ticks" in title
    assert (f"bubble {frac.numerator}/{frac.denominator} =" if frac else "bubble 0 =") in title
    save_figure(fig, tmp_path / "g.svg")
    assert sum(i.startswith("idle-") for i in _svg_ids(tmp_path / "g.svg")) == sum(t.idle_ticks)


def test_gantt_of_the_lessons_gpipe_example_has_36_idle_cells():
    t = pipeline.simulate("gpipe", 4, 4)  # 21 ticks, 9 idle per rank (lesson: bubble 3/7)
    fig = pipeline_gantt(t)
    assert len(_gids(fig, "idle-")) == 36
    assert "3/7 = 42.9%" in fig.axes[0].get_title()


def test_gantt_labels_micro_batches_and_refuses_huge_timelines():
    t = pipeline.simulate("1f1b", 2, 3)
    texts = sorted(x.get_text() for x in pipeline_gantt(t).axes[0].texts)
    assert texts == sorted(["0", "1", "2"] * 4)  # 3 forwards and 3 backwards on each of 2 ranks
    with pytest.raises(ConfigError, match="cells to draw"):
        pipeline_gantt(pipeline.simulate("gpipe", 100, 200))


def _bar_heights(fig) -> list[float]:
    sums: dict[int, float] = {}
    for patch in fig.axes[0].patches:
        gid = patch.get_gid() or ""
        m = re.fullmatch(r"(weights|gradients|optimizer|activations)-(\d+)", gid)
        if m:
            sums[int(m.group(2))] = sums.get(int(m.group(2)), 0.0) + patch.get_height()
    return [sums[i] for i in sorted(sums)]


def test_memory_bars_stack_to_the_computed_totals():
    model, hw = resolve_model("lesson-70b-style"), Hardware(gpus=16, gpu_memory="80 GB")
    chart = memory_chart_data(model, hw, Workload(), Layout(tp=8, pp=2))
    assert [label for label, _ in chart.bars] == ["ZeRO-0", "ZeRO-1", "ZeRO-2", "ZeRO-3", "ZeRO-0"]
    assert chart.groups == (("DP 16", 4), ("TP 8 × PP 2 × DP 1", 1)) and chart.highlight == 4
    fig = memory_bars(**chart.viz_args())
    heights = _bar_heights(fig)
    totals = [e.total for _, e in chart.bars]
    assert totals[4] == 68_975_329_280 + 5_704_253_440 and totals[0] == 1_103_605_268_480 + 45_634_027_520
    for h, total in zip(heights, totals, strict=True):
        # four float segments, each the correctly rounded GB value: |error| <= 4 * 2**-53 * total (Higham's gamma_4)
        assert abs(h - float(Fraction(total, 10**9))) <= 4 * 2**-52 * float(Fraction(total, 10**9))
    cap = [line for line in fig.axes[0].lines if line.get_gid() == "capacity"]
    assert len(cap) == 1 and cap[0].get_ydata()[0] == 80.0


def test_memory_bars_with_a_reserve_draw_the_usable_line():
    fig = memory_bars([("a", {"weights": 10**9})], 80 * 10**9, usable_bytes=75 * 10**9)
    assert [line.get_gid() for line in fig.axes[0].lines] == ["capacity", "usable"]
    assert _bar_heights(fig) == [1.0]
    with pytest.raises(ConfigError, match="at least one bar"):
        memory_bars([], 10)


def _groups_from_gids(fig, axis: str) -> list[list[int]]:
    groups: dict[int, list[int]] = {}
    for gid in _gids(fig, f"{axis}-g"):
        g, r = (int(x) for x in re.fullmatch(rf"{axis}-g(\d+)-r(\d+)", gid).groups())
        groups.setdefault(g, []).append(r)
    return [sorted(groups[g]) for g in sorted(groups)]


def test_layout_diagram_colours_the_rank_groups_and_marks_node_boundaries(tmp_path):
    cfg = layout.ParallelConfig(tp=2, pp=2, dp=2, gpus_per_node=4)
    fig = layout_diagram(cfg)
    assert _groups_from_gids(fig, "tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert _groups_from_gids(fig, "pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert _groups_from_gids(fig, "dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert _gids(fig, "cp-") == []  # cp = 1: no panel
    assert sorted(_gids(fig, "tp-node-boundary")) == ["tp-node-boundary-1"]  # 8 ranks on 2 nodes of 4
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert "dp: 4 groups of 2 (across nodes)" in titles and "tp: 4 groups of 2 (inside a node)" in titles
    save_figure(fig, tmp_path / "l.svg")
    assert sum(i.startswith("dp-g") for i in _svg_ids(tmp_path / "l.svg")) == 8


def test_layout_diagram_refuses_more_than_64_ranks():
    with pytest.raises(ConfigError, match="must be <= 64"):
        layout_diagram(layout.ParallelConfig(tp=8, dp=16))


def test_png_decodes_and_svg_parses_and_other_suffixes_are_refused(tmp_path):
    fig = pipeline_gantt(pipeline.simulate("gpipe", 2, 2))
    png = save_figure(fig, tmp_path / "g.png")
    pixels = mpl_image.imread(io.BytesIO(png.read_bytes()), format="png")
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 300
    assert len({tuple(px) for px in pixels.reshape(-1, pixels.shape[2])[:: max(1, pixels.size // 4000)]}) > 3
    assert _svg_ids(save_figure(fig, tmp_path / "g.svg"))
    with pytest.raises(ConfigError, match="must end in .png or .svg"):
        save_figure(fig, tmp_path / "g.pdf")
    with pytest.raises(ConfigError, match="does not exist"):
        save_figure(fig, tmp_path / "missing" / "g.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.png", "g.svg"]  # no temporary files left


def test_svg_output_is_reproducible(tmp_path):
    t = pipeline.simulate("1f1b", 3, 4)
    a = save_figure(pipeline_gantt(t), tmp_path / "a.svg").read_bytes()
    b = save_figure(pipeline_gantt(t), tmp_path / "b.svg").read_bytes()
    assert a == b and a.startswith(b"<?xml")
