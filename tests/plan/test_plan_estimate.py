"""The planner: the lesson's conclusions, exact bytes against independent arithmetic and the catalogue, layouts,
errors."""

from __future__ import annotations

from fractions import Fraction
from itertools import product

import pytest

from distcheck.closed_form import get
from distcheck.core.errors import ConfigError
from distcheck.parallel import memory
from distcheck.plan import Hardware, Layout, Workload, check_layout, estimate, plan, resolve_model, valid_layouts

P70 = 68_975_329_280  # the lesson's 70B-style model (section 3, worked example, step 4)
GB = 10**9


@pytest.fixture(scope="module")
def lesson_plan():
    return plan(resolve_model("lesson-70b-style"), Hardware(gpus=16, gpu_memory="80 GB"), Workload())


def test_lesson_70b_on_16_gpus_reproduces_the_lessons_conclusions(lesson_plan):
    p = lesson_plan
    assert p.model.params == P70
    # DDP: 16 B/param on every GPU, 1,103.61 GB, does not fit 80 GB (lesson section 3, step 5)
    assert p.ddp_state == 16 * P70 == 1_103_605_268_480
    ddp = p.questions[0]
    assert ddp.step == 1 and ddp.answer is False and ddp.best.layout == Layout(dp=16)
    assert ddp.best.state == 16 * P70
    # the smallest TP x PP split that fits before activations: TP 8 x PP 2 at 68.98 GB (section 2, exercise 3)
    assert p.smallest_split == (8, 2, P70)
    assert memory.min_tp_pp(P70, 80 * GB, num_layers=80) == (8, 2)
    # TP 8 alone is 137.95 GB: "still too big"
    assert estimate(p.model, Hardware(gpus=8, gpu_memory="80 GB"), Workload(), Layout(tp=8)).state == 2 * P70


def test_lesson_70b_recommendation_walks_the_order_of_questions(lesson_plan):
    p = lesson_plan
    assert [q.answer for q in p.questions] == [False, False, False, True, True]
    # ZeRO-3 over 16 GPUs reaches the same 68.98 GB state, but its unsplit activations do not fit
    zero3 = p.questions[2].best
    assert zero3.layout == Layout(dp=16, zero=3) and zero3.state == P70
    assert zero3.activations == 34 * 2048 * 8192 * 80  # Table 2 selective row at t = 1, 80 layers, 1 in flight
    rec = p.recommended
    assert rec.layout == Layout(tp=8, pp=2, dp=1, cp=1, zero=0)
    # 34 s b h / t per layer (sequence parallel + selective), 40 layers per stage,
    # min(pp, m) = 2 micro-batches in flight
    assert rec.activations == 34 * 2048 * 8192 // 8 * 40 * 2 == 5_704_253_440
    assert rec.total == P70 + 5_704_253_440 and rec.fits
    assert rec.bubble_fraction == Fraction(1, 9)  # (p - 1) / (m + p - 1) at p = 2, m = 8
    assert p.reasons()[-1].startswith("4. ") and "TP 8 × PP 2" in p.reasons()[-1]


def test_state_equals_the_zero_paper_closed_form_for_every_layout(lesson_plan):
    for e in lesson_plan.estimates:
        lay = e.layout
        want = get(f"zero.bytes_per_gpu.stage{lay.zero}").evaluate(params=P70 // (lay.tp * lay.pp), dp=lay.dp * lay.cp)
        assert e.state == want, lay
        assert e.weights + e.gradients + e.optimizer + e.activations == e.total


@pytest.mark.parametrize("recompute, sp, tp, per_layer", [
    ("none", False, 1, 2048 * 8192 * (34 + 5 * 64 * 2048 // 8192)),
    ("none", False, 8, 2048 * 8192 * 10 + 2048 * 8192 * 24 // 8 + 5 * 64 * 2048 * 2048 // 8),
    ("none", True, 8, 2048 * 8192 * (34 + 5 * 64 * 2048 // 8192) // 8),
    ("selective", False, 8, 2048 * 8192 * 13),
    ("selective", True, 8, 34 * 2048 * 8192 // 8),
    ("full", False, 8, 2 * 2048 * 8192),
    ("full", True, 8, 2 * 2048 * 8192 // 8),
])
def test_activations_per_layer_follow_korthikanti_table_2(recompute, sp, tp, per_layer):
    model = resolve_model("lesson-70b-style")
    e = estimate(model, Hardware(gpus=tp, gpu_memory="80 GB"), Workload(recompute=recompute, sequence_parallel=sp),
                 Layout(tp=tp))
    assert e.activations_per_layer == per_layer
    assert e.activations == per_layer * 80  # one stage of 80 layers, 1F1B with pp = 1 holds one micro-batch


def test_gpipe_holds_every_micro_batch_and_1f1b_at_most_p():
    model, hw = resolve_model("lesson-70b-style"), Hardware(gpus=16, gpu_memory="80 GB")
    lay = Layout(tp=8, pp=2)
    one_f = estimate(model, hw, Workload(num_microbatches=8), lay)
    gpipe = estimate(model, hw, Workload(num_microbatches=8, schedule="gpipe"), lay)
    assert (one_f.in_flight, gpipe.in_flight) == (2, 8)
    assert gpipe.activations == 4 * one_f.activations


def test_communication_bytes_per_gpu_per_step():
    model, hw = resolve_model("lesson-70b-style"), Hardware(gpus=16, gpu_memory="80 GB")
    wl = Workload(num_microbatches=8)
    # DDP: one ring all-reduce of the 2-byte gradients over 16 ranks, 2 (n-1)/n of 2P bytes
    assert estimate(model, hw, wl, Layout(dp=16)).comm == {"tp": 0, "pp": 0, "cp": 0, "dp": Fraction(15, 4) * P70}
    # ZeRO-1/2: reduce-scatter + all-gather, the same bytes as DDP
    assert estimate(model, hw, wl, Layout(dp=16, zero=2)).comm["dp"] == Fraction(15, 4) * P70
    # ZeRO-3 with one micro-batch: 3 collectives of 2P bytes, the ZeRO paper's 3 Psi times the ring factor
    z3 = estimate(model, hw, Workload(num_microbatches=1), Layout(dp=16, zero=3))
    assert z3.comm["dp"] == 3 * Fraction(15, 16) * 2 * P70
    assert z3.comm["dp"] == Fraction(15, 16) * 2 * get("zero.comm_elements_per_rank.stage3").evaluate(params=P70)
    # ... and with 8 micro-batches the weights are gathered twice per micro-batch: 17 collectives
    assert estimate(model, hw, wl, Layout(dp=16, zero=3)).comm["dp"] == 17 * Fraction(15, 16) * 2 * P70
    # TP 8 x PP 2: 8 b s h (t-1)/t elements of 2 bytes per layer per micro-batch; b s h / t each way between stages
    split = estimate(model, hw, wl, Layout(tp=8, pp=2))
    assert split.comm["tp"] == 8 * 2048 * 8192 * Fraction(7, 8) * 2 * 40 * 8 == 75_161_927_680
    assert split.comm["pp"] == 8 * 2048 * 8192 * 2 // 8  # two stages: each sends one way
    assert split.comm["dp"] == 0 and split.comm_total == 75_161_927_680 + 33_554_432


def test_context_parallel_all_gathers_k_and_v():
    model, hw = resolve_model("lesson-70b-style"), Hardware(gpus=16, gpu_memory="80 GB")
    e = estimate(model, hw, Workload(num_microbatches=1), Layout(tp=8, cp=2))
    kv_full = 2 * 2048 * (8 // 8 * 128) * 2  # K and V of every token, one KV head per TP rank, 2 bytes
    assert e.comm["cp"] == 2 * Fraction(1, 2) * kv_full * 80  # all-gather + reduce-scatter on 2 ranks, 80 layers
    assert e.activations_per_layer == 34 * 1024 * 8192 // 8  # each rank holds s / cp tokens


def test_valid_layouts_are_exactly_the_factorizations_the_rules_allow(lesson_plan):
    model, hw, wl = lesson_plan.model, lesson_plan.hardware, lesson_plan.workload
    want = set()
    for tp, pp, cp, dp in product(range(1, 17), repeat=4):
        if tp * pp * cp * dp != 16 or 8 % tp or 8 % tp or 64 % tp or 28672 % tp or 80 % pp or 2048 % cp:
            continue
        for zero in ((0, 1, 2, 3) if dp * cp > 1 else (0,)):
            want.add((tp, pp, cp, dp, zero))
    got = {(e.layout.tp, e.layout.pp, e.layout.cp, e.layout.dp, e.layout.zero) for e in lesson_plan.estimates}
    assert got == want and len(got) == len(lesson_plan.estimates)
    assert {(lay.tp, lay.pp) for lay in valid_layouts(model, hw, wl)} >= {(8, 2), (1, 16), (4, 4)}


def test_ranking_puts_fitting_layouts_first_in_the_lessons_order(lesson_plan):
    fits = [e.fits for e in lesson_plan.estimates]
    assert fits == sorted(fits, reverse=True)
    steps = [e.layout.lesson_step for e in lesson_plan.estimates if e.fits]
    assert steps == sorted(steps)


def test_smaller_models_stop_at_earlier_questions():
    # 7B-style on 8 GPUs: DDP needs 107.81 GB (lesson section 3), ZeRO-1 fits
    p = plan(resolve_model("lesson-7b-style"), Hardware(gpus=8, gpu_memory="80 GB"), Workload())
    assert p.ddp_state == 107_810_390_016
    assert p.recommended.layout == Layout(dp=8, zero=1)
    assert [q.answer for q in p.questions[:2]] == [False, True]
    # the lesson's 13B-style exercise: 208 GB of state, TP 4 is the smallest power of two that fits 80 GB
    raw = plan(resolve_model(params="13e9"), Hardware(gpus=8, gpu_memory="80 GB"), Workload())
    assert raw.ddp_state == 208 * GB and raw.smallest_split == (4, 1, 52 * GB)
    assert all(e.activations is None and e.layout.cp == 1 for e in raw.estimates)


def test_presets_are_named_loosely_and_shapes_explicitly():
    assert resolve_model("llama3-70b").name == "llama-3-70b"
    assert resolve_model("Llama-3-70B").params == 70_553_706_496
    custom = resolve_model(hidden_size=8192, num_layers=80, ffn_hidden_size=28672, num_heads=64, num_kv_heads=8,
                           vocab_size=32000)
    assert custom.params == P70 + 80 * 2 * 8192 + 8192  # the preset without norms, plus RMS norm weights


def test_reserve_counts_against_the_fit():
    model = resolve_model("lesson-70b-style")
    lay = Layout(tp=8, pp=2)
    assert estimate(model, Hardware(gpus=16, gpu_memory="80 GB"), Workload(), lay).fits
    assert not estimate(model, Hardware(gpus=16, gpu_memory="80 GB", reserve="6 GB"), Workload(), lay).fits


@pytest.mark.parametrize("build, field, rule", [
    (lambda: Hardware(gpus=12, gpu_memory="80 GB"), "gpus", "must be a multiple of gpus_per_node=8"),
    (lambda: Hardware(gpus=0, gpu_memory="80 GB"), "gpus", "must be >= 1"),
    (lambda: Hardware(gpus=8, gpu_memory="80"), "gpu_memory", "number followed by a unit"),
    (lambda: Hardware(gpus=8, gpu_memory=80.0), "gpu_memory", "must be a number of bytes"),
    (lambda: Hardware(gpus=8, gpu_memory="80 GB", reserve="80 GB"), "reserve", "must be less than gpu_memory"),
    (lambda: Workload(recompute="some"), "recompute", "must be one of"),
    (lambda: Workload(bytes_per_param="fp8"), "convention", "must be one of"),
    (lambda: Workload(schedule="interleaved"), "schedule", "must be one of"),
    (lambda: Layout(zero=4), "zero", "must be 0, 1, 2 or 3"),
    (lambda: resolve_model("gpt-5"), "model", "is not a preset"),
    (lambda: resolve_model(), "model", "is required"),
    (lambda: resolve_model("llama-3-8b", params=8), "model", "cannot be combined with params"),
    (lambda: resolve_model(hidden_size=64), "num_layers", "is required with an explicit shape"),
    (lambda: resolve_model(params="1.5"), "params", "whole number"),
    (lambda: _check("lesson-70b-style", 3, Layout(tp=3)), "tp", "must divide num_heads=64"),
    (lambda: _check("lesson-70b-style", 24, Layout(tp=8, pp=3)), "pp", "must divide num_layers=80"),
    (lambda: _check("lesson-70b-style", 16, Layout(tp=8, dp=3)), "gpus", "must equal tp*cp*pp*dp = 8*1*1*3 = 24"),
    (lambda: _check("lesson-70b-style", 16, Layout(tp=16)), "tp", "must divide num_kv_heads=8"),
    (lambda: _check("llama-2-7b", 16, Layout(tp=16)), "tp", "must divide gpus_per_node=8"),
    (lambda: _check("lesson-70b-style", 3, Layout(cp=3)), "cp", "must divide seq_len=2048"),
    (lambda: plan(resolve_model("llama-3-405b"), Hardware(gpus=8, gpu_memory="16 GB"), Workload()), "model",
     "it needs at least 406 GPUs"),
])
def test_bad_input_names_the_field_and_the_rule(build, field, rule):
    with pytest.raises(ConfigError) as info:
        build()
    assert info.value.field == field and rule in str(info.value)


def _check(model: str, gpus: int, lay: Layout) -> None:
    check_layout(resolve_model(model), Hardware(gpus=gpus, gpu_memory="80 GB"), Workload(), lay)


def test_plan_memory_cp_figures_are_the_cp_package_forms(capsys):
    """``distcheck plan memory --cp 2``: the cp bytes sent and the all-gathered K/V buffer in the activations
    are the context-parallel package's closed forms (sympy, the catalogue), not a figure of the planner's own."""
    import json

    from distcheck.cli import main

    assert main(["plan", "memory", "--model", "lesson-70b-style", "--gpus", "64", "--tp", "8", "--cp", "2",
                 "--zero", "3", "--format", "json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    est = out["estimate"]
    wl = out["workload"]
    kv = {"s": wl["seq_len"], "b": wl["micro_batch_size"], "num_kv_heads": 8 // 8, "head_dim": 128,
          "bytes_per_element": 2}
    layers, m = est["layers_per_stage"], wl["num_microbatches"]
    sent = sum(get(f"cp.all_gather.bytes_per_rank.{d}").evaluate(cp=2, **kv) for d in ("forward", "backward"))
    assert Fraction(est["comm_bytes_per_step"]["cp"]) == sent * layers * m > 0
    buffer = get("cp.all_gather.buffer_bytes_per_rank").evaluate(**kv)
    assert Fraction(est["bytes"]["activations"]) == \
        Fraction(est["activations_per_layer"]) * layers * est["in_flight"] + buffer
    one = estimate(resolve_model("lesson-70b-style"), Hardware(gpus=8, gpu_memory="80 GB"), Workload(), Layout(tp=8))
    assert one.comm["cp"] == 0 and one.activations == one.activations_per_layer * 80 * one.in_flight


def test_a_layout_without_pp_is_never_labelled_a_pp_question(lesson_plan):
    # question 4 is "TP inside a node, PP across nodes": a layout with tp > 1 and pp == 1 answers it with TP alone
    assert Layout(tp=8, dp=2, zero=3).lesson_step == 4 and Layout(tp=8, dp=2, zero=3).question == "4 (TP alone)"
    assert Layout(tp=8, pp=2, dp=1).question == "4" and Layout(pp=2, dp=8).question == "4"
    assert Layout(dp=16, zero=3).question == "3" and Layout(tp=2, cp=2, dp=4).question == "5"
    labels = {(e.layout.pp > 1, e.layout.question) for e in lesson_plan.estimates if e.layout.lesson_step == 4}
    assert labels == {(True, "4"), (False, "4 (TP alone)")}
    # the lesson's 13B-style exercise on one node of 8: question 4's best layout has no pipeline stages
    raw = plan(resolve_model(params="13e9"), Hardware(gpus=8, gpu_memory="80 GB"), Workload())
    q4 = raw.questions[3]
    assert q4.best.layout == Layout(tp=2, dp=4, zero=1)
    assert q4.reason.endswith(" (TP alone: no PP across nodes)"), q4.reason
    with_pp = lesson_plan.questions[3]
    assert with_pp.best.layout.pp == 2 and "TP alone" not in with_pp.reason
