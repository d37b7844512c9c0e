"""``distcheck plan time``: the step-time model against hand-computed terms, the placement against the enumerated
rank groups, the hardware catalogue, the ranking by step time, the lesson's 70B-style model at 64 GPUs (TP across
nodes behind TP inside a node, with the reason), bad input (exit 2, one line naming the flag), and the same data in
JSON, Markdown and HTML. No timings here: benchmarks/bench_plan.py prints the plan's CPU time."""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction as F
from itertools import product

import pytest

from distcheck.cli import main
from distcheck.closed_form import get
from distcheck.core.errors import ConfigError
from distcheck.parallel import layout as layout_ref
from distcheck.plan import Hardware, Layout, Workload, resolve_model
from distcheck.plan.hardware import ACCELERATORS, FIGURES, accelerator, parse_overrides
from distcheck.plan.planner import rank_key
from distcheck.plan.steptime import Assumptions, placement, step_time
from distcheck.plan.timeplan import plan_time

H100 = accelerator("h100-sxm")
SMALL = dict(hidden_size=1024, num_layers=4, ffn_hidden_size=4096, num_heads=8, num_kv_heads=8, vocab_size=1000)
LESSON = ["plan", "time", "--model", "lesson-70b-style", "--gpus", "64", "--quiet"]
BASE, INTRA, INTER = F(84, 10**7), F(34, 10**7), F(14, 10**6)


def _code(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


# ------------------------------------------------------------------------------------- the model, by hand


def test_tp2_step_by_hand():
    """A 4-layer model on 2 GPUs of one node, TP 2 without sequence parallelism, no recomputation, 2 micro-batches."""
    model = resolve_model(**SMALL)
    hw = Hardware(gpus=2, gpu_memory="80 GB", gpus_per_node=8)
    wl = Workload(seq_len=512, num_microbatches=2, recompute="none", sequence_parallel=False)
    st = step_time(model, hw, wl, Layout(tp=2), H100)
    p = 4 * (4 * 1024 * 1024 + 3 * 1024 * 4096) + 1000 * 1024  # the layers' matrices and the head: 68,132,864
    per_token = 6 * p + 12 * 4 * 512 * 1024
    assert st.model_flops_per_token == st.hardware_flops_per_token == per_token == 433_963_008
    t_c = F(per_token * 512, 2) / (F(9895, 10) * 10**12 * F(3, 5))  # half the micro-batch's FLOPs per GPU at 60%
    size = 512 * 1024 * 2  # b s h 2-byte activations
    all_reduce = BASE + 2 * INTRA + F(2 * 1, 2) * size / (450 * 10**9)  # n = 2: 2 steps; 2(n-1)/n S over 450 GB/s
    assert st.terms == {"compute": 2 * t_c, "tp": 2 * 4 * 4 * all_reduce, "cp": 0, "pp": 0, "dp": 0, "bubble": 0}
    assert st.seconds == 2 * t_c + 32 * all_reduce
    assert st.axes["tp"].collectives == 32 and st.axes["tp"].busbw == 450 * 10**9
    assert st.tokens_per_second == F(2 * 512) / st.seconds
    assert st.mfu == F(per_token) * st.tokens_per_second / (2 * F(9895, 10) * 10**12)


def test_bubble_is_the_simulated_schedule_stretch_of_the_stage_time():
    model = resolve_model(**SMALL)
    hw = Hardware(gpus=8, gpu_memory="80 GB", gpus_per_node=8)
    for schedule, m in (("1f1b", 6), ("gpipe", 3)):
        wl = Workload(seq_len=512, num_microbatches=m, recompute="none", schedule=schedule)
        st = step_time(model, hw, wl, Layout(tp=2, pp=4), H100)
        busy = st.terms["compute"] + st.terms["tp"] + st.terms["pp"]
        assert st.terms["bubble"] == busy * F(4 - 1, m)  # 1F1B and GPipe: (m + p - 1) / m of the busy time
        assert (st.step_ticks, st.busy_ticks) == (3 * (m + 3), 3 * m)


def test_overlap_hides_up_to_the_compute_and_full_recompute_reruns_the_forward_collectives():
    model = resolve_model(**SMALL)
    hw = Hardware(gpus=2, gpu_memory="80 GB", gpus_per_node=8)
    wl = Workload(seq_len=512, num_microbatches=2, recompute="none")
    none = step_time(model, hw, wl, Layout(tp=2), H100)
    hidden = step_time(model, hw, wl, Layout(tp=2), H100, Assumptions(overlap={"tp": "compute"}))
    assert none.terms["tp"] > 0 and hidden.terms["tp"] == max(F(0), none.terms["tp"] - none.terms["compute"])
    full = step_time(model, hw, Workload(seq_len=512, num_microbatches=2, recompute="full"), Layout(tp=2), H100)
    assert full.axes["tp"].seconds == none.axes["tp"].seconds * F(3, 2)
    layers, head = 4 * (4 * 1024 * 1024 + 3 * 1024 * 4096), 1000 * 1024
    assert full.hardware_flops_per_token == none.model_flops_per_token + 2 * layers + 4 * 4 * 512 * 1024
    assert full.model_flops_per_token == 6 * (layers + head) + 12 * 4 * 512 * 1024


def test_a_group_across_nodes_uses_its_nics_and_the_network_latency():
    model = resolve_model("lesson-70b-style")
    hw = Hardware(gpus=64, gpu_memory="80 GB", gpus_per_node=4)
    st = step_time(model, hw, Workload(num_microbatches=8), Layout(tp=8, pp=4, dp=2, zero=1), H100)
    tp = st.axes["tp"]
    assert (tp.placement.nodes, tp.placement.per_node, tp.busbw) == (2, 4, 200 * 10**9)  # 4 NICs of 50 GB/s
    size = 2048 * 8192 * 2
    ag = get("comm.time_s.ring.all_gather").evaluate(size_bytes=size, n=8, nodes=2, busbw=200 * 10**9)
    assert ag == BASE + 6 * INTRA + 1 * INTER + F(7, 8) * size / (200 * 10**9)
    assert st.crossing == ("tp",)
    inside = step_time(model, Hardware(gpus=64, gpu_memory="80 GB", gpus_per_node=8), Workload(num_microbatches=8),
                       Layout(tp=8, pp=4, dp=2, zero=1), H100)
    assert inside.crossing == () and inside.axes["tp"].busbw == 450 * 10**9 and inside.seconds < st.seconds


@pytest.mark.parametrize("gpn", [2, 4, 8])
def test_placement_matches_the_enumerated_rank_groups(gpn):
    for tp, cp, pp, dp in product((1, 2, 4), (1, 2), (1, 2, 4), (1, 2, 4)):
        world = tp * cp * pp * dp
        if world % gpn and world > gpn:
            continue
        cfg = layout_ref.ParallelConfig(tp=tp, cp=cp, pp=pp, dp=dp, gpus_per_node=gpn)
        lay = Layout(tp=tp, cp=cp, pp=pp, dp=dp)
        grid = layout_ref.rank_grid(cfg)  # axes outermost first: dp, pp, cp, tp
        for axes in (("tp",), ("cp",), ("pp",), ("cp", "dp")):
            dims = [("dp", "pp", "cp", "tp").index(a) for a in axes]
            rest = [d for d in range(4) if d not in dims]
            rows = grid.transpose(rest + dims).reshape(-1, math.prod(grid.shape[d] for d in dims))
            counts = [{n: sum(1 for r in row if r // gpn == n) for n in {int(r) // gpn for r in row}} for row in rows]
            want = (max(len(c) for c in counts), min(min(c.values()) for c in counts))
            got = placement(lay, gpn, axes)
            assert (got.nodes, got.per_node) == want, (lay, gpn, axes)
            if len(axes) == 1:
                assert got.crosses == (not layout_ref.groups_node_local(cfg, axes[0]))


# ------------------------------------------------------------------------------------- the hardware catalogue


def test_the_catalogue_cites_a_datasheet_for_every_figure():
    assert set(ACCELERATORS) == {"h100-sxm", "h200", "a100-80gb", "b200", "mi300x"}
    for acc in ACCELERATORS.values():
        assert set(dict(acc.sources)) == set(FIGURES)
        for figure in FIGURES:
            assert acc.source(figure).strip()
        assert "Datasheet" in acc.source("peak_flops") or "Data Sheet" in acc.source("peak_flops")
    h100 = ACCELERATORS["h100-sxm"]
    assert h100.peak_flops == 1979 * 10**12 / F(2) and h100.intra_node_busbw == 450 * 10**9
    assert h100.inter_node_bandwidth == 400 * 10**9 // 8 and h100.hbm_bytes == 80 * 10**9
    assert ACCELERATORS["a100-80gb"].peak_flops == 312 * 10**12
    assert ACCELERATORS["mi300x"].peak_flops == F(13074, 10) * 10**12


def test_overrides_replace_a_figure_and_cite_the_user():
    acc = accelerator("h100-sxm", parse_overrides(["inter_node_bandwidth=25 GB/s", "latency_inter=0 us"]))
    assert acc.inter_node_bandwidth == 25 * 10**9 and acc.latency_inter == 0
    assert "user override" in acc.source("inter_node_bandwidth") and "Datasheet" in acc.source("peak_flops")
    from distcheck.plan.cli import ACCELERATORS as NAMES

    assert NAMES == tuple(ACCELERATORS)


def test_the_nccl_latencies_are_the_forms_defaults():
    from distcheck.parallel.comm.forms import NCCL_LATENCY_S as FORMS
    from distcheck.parallel.comm.ideal import NCCL_LATENCY_S, ring_time

    assert FORMS == NCCL_LATENCY_S == {"base": BASE, "intra": INTRA, "inter": INTER}
    for op, n, nodes in (("all_reduce", 8, 2), ("all_gather", 4, 1), ("reduce_scatter", 16, 4)):
        assert ring_time(op, 3 * 10**6, n, 50 * 10**9, nodes) == get(f"comm.time_s.ring.{op}").evaluate(
            size_bytes=3 * 10**6, n=n, busbw=50 * 10**9, nodes=nodes)


# ------------------------------------------------------------------------------------- the ranking


def test_the_ranking_is_by_step_time_not_the_memory_order():
    p = plan_time(resolve_model("lesson-70b-style"), Hardware(gpus=64, gpu_memory="80 GB", gpus_per_node=4),
                  Workload(), H100)
    times = [st.seconds for st in p.ranked]
    assert times == sorted(times) and len(p.ranked) == 163 and p.not_fitting == 111
    by_memory = sorted(p.ranked, key=lambda st: rank_key(st.estimate))
    assert [st.layout for st in by_memory] != [st.layout for st in p.ranked]
    assert all(st.estimate.fits for st in p.ranked)
    assert {st.num_microbatches * st.layout.dp for st in p.ranked} == {512}  # the same global batch everywhere


def test_lesson_70b_at_64_gpus_puts_tp_across_nodes_behind_tp_inside(capsys):
    assert main(LESSON + ["--gpus-per-node", "4", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    layouts = data["layouts"]
    steps = [F(x["step_time_s"]["exact"]) if isinstance(x["step_time_s"], dict) else F(x["step_time_s"])
             for x in layouts]
    assert steps == sorted(steps)
    across = [x for x in layouts if "tp" in x["crosses_nodes"]]
    inside = [x for x in layouts if x["layout"]["tp"] > 1 and "tp" not in x["crosses_nodes"]]
    assert across and inside and inside[0]["rank"] < across[0]["rank"]
    assert all(x["layout"]["tp"] == 8 for x in across)  # TP 8 in nodes of 4
    reason = across[0]["reason"]
    assert "TP 8 spans 2 nodes" in reason and "200 GB/s (4 NICs of 50 GB/s) instead of 450 GB/s" in reason
    assert f"#{inside[0]['rank']} " in reason
    # in nodes of 8 no TP degree the model allows (tp divides its 8 KV heads) leaves a node
    assert main(LESSON + ["--format", "json"]) == 0
    assert not [x for x in json.loads(capsys.readouterr().out)["layouts"] if "tp" in x["crosses_nodes"]]


def test_the_table_shows_the_terms_and_the_reason(capsys):
    assert main(LESSON + ["--gpus-per-node", "4", "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "Fastest that fits: DP 64, ZeRO-3" in out and "layouts that fit, by step time (5 of 163)" in out
    for col in ("step s", "compute s", "tp s", "bubble s", "MFU", "crosses"):
        assert col in out
    assert re.search(r"#\d+ TP 8 × PP 4 × DP 2, ZeRO-0: TP 8 spans 2 nodes", out)


def test_nothing_fits_is_exit_1(capsys):
    assert main(["plan", "time", "--model", "llama-3-405b", "--gpus", "8", "--quiet"]) == 1
    assert "Nothing fits" in capsys.readouterr().out


@pytest.mark.parametrize("argv, flag", [
    (["--hw", "bogus=1"], "--hw='bogus' is not a figure"),
    (["--hw", "peak_flops=fast"], "--hw peak_flops='fast' must be a number followed by a unit"),
    (["--hw", "peak_flops"], "--hw='peak_flops' must be KEY=VALUE"),
    (["--hw", "inter_node_bandwidth=-5 GB/s"], "--hw inter_node_bandwidth='-5 GB/s' must not be negative"),
    (["--gpu-memory", "80XB"], "--gpu-memory='80XB'"),
    (["--gpus-per-node", "0"], "--gpus-per-node='0' must be >= 1"),
    (["--gpus-per-node", "4", "--hw", "gpus_per_node=4"], "--gpus-per-node=4 repeats --hw gpus_per_node"),
    (["--overlap", "tp=backward"], "--overlap='tp=backward' must be one of none, compute"),
    (["--overlap", "zz=none"], "--overlap='zz' must name an axis"),
    (["--compute-efficiency", "1.5"], "--compute-efficiency='1.5' must be a fraction of the peak"),
    (["--compute-efficiency", "fast"], "--compute-efficiency='fast' must be a number"),
    (["--global-batch", "0"], "--global-batch=0 must be >= 1"),
    (["--top", "0"], "--top=0 must be >= 1"),
    (["--hardware", "tpu"], "argument --hardware: invalid choice"),
])
def test_bad_input_is_one_line_naming_the_flag_and_exit_2(argv, flag, capsys):
    assert _code(LESSON + argv) == 2
    err = capsys.readouterr().err
    assert flag in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_raw_parameter_count_is_refused():
    with pytest.raises(ConfigError, match="has no shape"):
        plan_time(resolve_model(params="13e9"), Hardware(gpus=8, gpu_memory="80 GB"), Workload(), H100)
    assert _code(["plan", "time", "--params", "13e9", "--gpus", "8"]) == 2


def test_json_markdown_and_html_carry_the_same_ranking(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    argv = LESSON + ["--gpus-per-node", "4", "--report", str(tmp_path / "r"), "--figure", str(tmp_path / "f.svg")]
    assert main(argv + ["--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    md = (tmp_path / "r" / "report.md").read_text()
    html = (tmp_path / "r" / "report.html").read_text()
    for x in data["layouts"]:
        step = x["step_time_s"]["approx"] if isinstance(x["step_time_s"], dict) else x["step_time_s"]
        row = f"| {x['rank']} | {x['layout']['tp']} | {x['layout']['cp']} | {x['layout']['pp']} | {x['layout']['dp']} |"
        assert row in md and f"{step:,.3f}" in md
    crossing = [x for x in data["layouts"] if x["crosses_nodes"]]
    assert len(re.findall(r"\| #?\d+ [^|]*: (?:TP|CP) \d+ spans \d+ nodes", md)) == len(crossing) > 0
    assert "| peak_flops | 989.5 TFLOP/s |" in md
    assert "NVIDIA H100 Tensor Core GPU Datasheet" in md and "NVIDIA H100 Tensor Core GPU Datasheet" in html
    svg = (tmp_path / "f.svg").read_text()
    assert 'id="compute-0"' in svg and 'id="tp-' in svg and re.search(r'id="crosses-\d+"', svg)
