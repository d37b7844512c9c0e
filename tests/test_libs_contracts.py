"""The world-free certify contracts behind ``distcheck libs`` on small targets: right ones are certified
with the convention named, deliberately wrong ones (estimators, layouts, bad-input handling) fail with
their smallest counterexample. No third-party library is needed here (tests/test_libs_targets.py runs
the real ones)."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from fractions import Fraction
from functools import partial

import pytest
from hypothesis import strategies as st

from distcheck.certify import certify
from distcheck.core.errors import ConfigError
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.libs import run_libs
from distcheck.libs.findings import LIB_FINDINGS, label
from distcheck.libs.table import summary_rows, to_markdown
from distcheck.parallel.layout import ParallelConfig, groups
from distcheck.parallel.layout.contracts import LayoutTarget, Probe, ProbeSet, canonical
from distcheck.parallel.memory.estimators import (
    STATE_CONVENTIONS,
    Estimator,
    EstimatorFamily,
    Fit,
    conventions_for,
    fit,
    named_conventions,
    read_printed,
    total_rule,
)
from distcheck.report import FAIL, FINDING, PASS, SKIP, CheckResult


def zero(stage: int, p, n, o, k: int = 12, w: int = 2, g: int = 2):
    """The ZeRO paper's Figure 1 for one stage, as an exact estimator."""
    rep, sh = {0: (w + g + k, 0), 1: (w + g, k), 2: (w, g + k), 3: (0, w + g + k)}[stage]
    return Fraction(rep * p) + Fraction(sh * p, n)


def _by(cert):
    return {v.property: v for v in cert.verdicts}


def _certify(target, contract, examples=None):
    """Certify with a fixed seed (profile dev, as ``distcheck libs`` does): the same examples every run."""
    return certify(target, contract, examples=examples, seed=0, profile="dev")


# ---------------------------------------------------------------- conventions


def test_every_convention_splits_by_the_zero_paper_stages():
    k12 = STATE_CONVENTIONS[0]
    assert [k12.split(s) for s in range(4)] == [(16, 0), (4, 12), (2, 14), (0, 16)]
    names = {c.short for c in STATE_CONVENTIONS}
    assert {"K = 12", "K = 8", "K = 6", "K = 14", "K = 16", "fp32 gradients instead of 16-bit ones",
            "fp32 gradients on top of 16-bit ones", "fp32 weights with no separate master copy"} == names


@pytest.mark.parametrize("stage, a, b, expected", [
    (2, 2, 18, {"K = 16", "fp32 gradients on top of 16-bit ones"}),       # DeepSpeed's ZeRO-2 estimator
    (3, 0, 18, {"K = 14", "fp32 gradients instead of 16-bit ones"}),      # DeepSpeed's ZeRO-3 estimator
    (1, 6, 12, {"fp32 gradients instead of 16-bit ones"}),                # Megatron's distributed optimizer 6 + 12/d
    (0, 16, 0, {"K = 12", "fp32 weights with no separate master copy"}),  # 16 B/param, two readings
    (0, 12, 0, {"K = 8"}),
    (3, 0, 10, {"K = 6"}),
    (0, 8, 0, set()),                                                      # accelerate's float16 figure: none
])
def test_conventions_for_names_each_documented_split(stage, a, b, expected):
    assert {c.short for c in conventions_for(stage, Fit(Fraction(a), Fraction(b), Fraction(0)))} == expected


def test_components_pick_one_reading_and_total_rule_names_max_or_sum():
    f = Fit(Fraction(16), Fraction(0), Fraction(0))
    comps = {"weights": Fraction(4), "grads": Fraction(4), "optimizer": Fraction(8), "step": Fraction(16)}
    assert [c.short for c in conventions_for(0, f, comps)] == ["fp32 weights with no separate master copy"]
    assert total_rule(Fraction(16), comps) == "max"
    assert total_rule(Fraction(32), comps) == "sum"
    assert total_rule(Fraction(20), comps) is None


def test_read_printed_gives_the_half_step_of_the_last_digit():
    assert read_printed("18.63GB") == (Fraction(1863, 100), Fraction(1, 200), "GB")
    assert read_printed(" 953.67 MB") == (Fraction(95367, 100), Fraction(1, 200), "MB")
    assert read_printed("12 bytes") == (Fraction(12), Fraction(1, 2), "bytes")
    with pytest.raises(ConfigError, match="printed"):
        read_printed("about 3 GB")


# ---------------------------------------------------------------- memory-estimator


def test_a_right_zero_estimator_is_certified_with_k12_named():
    est = Estimator("paper.zero2", None, 2, partial(zero, 2))
    cert = _certify(est, "memory-estimator", examples=25)
    v = _by(cert)
    assert cert.ok and [v[p].verdict for p in ("fit", "truncation", "monotone_n")] == [PASS] * 3
    assert v["printed_unit"].verdict == SKIP and v["printed_unit"].failure == "paper.zero2 prints no figure"
    assert v["fit"].note.startswith("bytes per GPU = 2·P + 14·P/N: 2 B/param replicated, 14 B/param sharded over N "
                                    "at ZeRO stage 2; convention: K = 12")
    assert [c.short for c in named_conventions(est)] == ["K = 12"]
    assert fit(Estimator("paper.zero1", None, 1, partial(zero, 1))) == Fit(Fraction(4), Fraction(12), Fraction(0))
    assert cert.world_sizes == [1] and cert.backend == "local" and cert.dtypes == ["exact"]


def wrong_zero3(p, n, o):  # never shards the weights
    return 2 * p + Fraction(16 * p, n)


def test_a_wrong_estimator_that_never_shards_the_weights_fails_the_fit():
    v = _by(_certify(Estimator("wrong.zero3", None, 3, wrong_zero3), "memory-estimator", examples=10))["fit"]
    assert v.verdict == FAIL
    assert v.failure.startswith("bytes per GPU = 2·P + 16·P/N: 2 B/param replicated, 16 B/param sharded over N at "
                                "ZeRO stage 3; no documented convention reproduces it")


def weights_unsharded(p, n, o):  # declared ZeRO-3, never shards the weights: ZeRO-2's figures
    return zero(2, p, n, o)


def odd_split(p, n, o):  # 3 B/param replicated, 5 sharded: no convention at any stage
    return 3 * p + Fraction(5 * p, n)


def test_a_failing_fit_names_the_convention_it_follows_at_another_stage():
    v = _by(_certify(Estimator("late.zero3", None, 3, weights_unsharded), "memory-estimator", examples=5))["fit"]
    assert v.verdict == FAIL
    assert v.failure.endswith(
        "; no documented convention reproduces it; matches convention K = 12: 16-bit weights and gradients, fp32 "
        "master copy, Adam m and v (2 + 2 + 12 = 16 B/param) at ZeRO stage 2, not the declared stage 3: the "
        "estimator shards what stage 2 shards (certify it with Estimator(..., stage=2) if that is the stage it "
        "estimates)")
    never = _by(_certify(Estimator("wrong.zero3", None, 3, wrong_zero3), "memory-estimator", examples=5))["fit"]
    assert "matches convention K = 14: 16-bit weights and gradients, 14 B/param of optimizer state" in never.failure
    assert "at ZeRO stage 2, not the declared stage 3" in never.failure
    odd = _by(_certify(Estimator("odd.zero2", None, 2, odd_split), "memory-estimator", examples=5))["fit"]
    assert odd.verdict == FAIL and "matches convention" not in odd.failure


def rounds_up(p, n, o):  # rounds P/N up and adds a byte whenever N does not divide P: off by up to 2 bytes
    return 16 * (-(-p // n)) + (1 if p % n else 0)


def test_truncation_over_a_byte_is_caught_with_the_smallest_counterexample():
    v = _by(_certify(Estimator("bad.zero3", None, 3, rounds_up), "memory-estimator", examples=60))["truncation"]
    assert v.verdict == FAIL
    assert v.failure == ("P=1, N=2: the estimator gives 17 bytes, 0·P + 16·P/N gives 8: off by +9 bytes "
                         "(at least a byte per rank)")
    # an object with no module:object name is replayed by the certify() call (the CLI replay: see below)
    assert v.reproduce.startswith("certify(<the object Estimator('bad.zero3')>, contract='memory-estimator'")


def grows_with_n(p, n, o):  # a buffer of one byte per rank: outgrows the sharded state for small P
    return 2 * p + Fraction(14 * p, n) + n


def test_figures_growing_with_n_are_caught():
    v = _by(_certify(Estimator("bad.zero2", None, 2, grows_with_n), "memory-estimator", examples=80))["monotone_n"]
    assert v.verdict == FAIL
    # 2 + 14/3 + 3 < 2 + 14/5 + 5
    assert v.failure == "P=1: N=3 gives 29/3 bytes but N=5 gives more, 49/5"


def ds_zero2(p, n, o):
    return 2 * p + int(18 * p / n)


def ds_zero3(p, n, o):
    return 4 * o["largest_layer_params"] + int(18 * p / n)


def layer_options(p):
    return st.integers(1, p).map(lambda n: {"largest_layer_params": n})


DS_LIKE = EstimatorFamily("ds.zero", (
    Estimator("ds.zero2", None, 2, ds_zero2),
    Estimator("ds.zero3", None, 3, ds_zero3, options=layer_options, fit_options={"largest_layer_params": 1}),
))


def test_a_deepspeed_like_pair_fails_baseline_and_stage_order_at_p1():
    v = _by(_certify(DS_LIKE, "memory-estimator-stages", examples=60))
    assert v["baseline_n1"].failure == (
        "P=1, N=1, largest_layer_params=1: nothing is sharded, yet the stages differ: ds.zero2 20 bytes (= 20·P), "
        "ds.zero3 22 bytes (= 18·P + 4)")
    assert v["stage_order"].failure == (
        "P=1, N=1, largest_layer_params=1: stage 3 (ds.zero3) needs 22 bytes, more than stage 2 (ds.zero2), 20")
    z3 = _by(_certify(DS_LIKE.estimators[1], "memory-estimator", examples=5))["fit"]
    assert z3.verdict == PASS and [c.short for c in named_conventions(DS_LIKE.estimators[1])] == [
        "K = 14", "fp32 gradients instead of 16-bit ones"]


def sixteen(p, n, o):
    return 16 * p


def printed_gib(p, n, o):
    return f"{16 * p / 2**30:.2f}GB"


def printed_gb(p, n, o):
    return f"{16 * p / 1e9:.2f}GB"


def test_gib_printed_as_gb_is_named_and_a_decimal_print_passes():
    wrong = Estimator("p.gib", None, 0, sixteen, printed=printed_gib, depends_on_n=False)
    right = Estimator("p.gb", None, 0, sixteen, printed=printed_gb, depends_on_n=False)
    w = _by(_certify(wrong, "memory-estimator", examples=60))
    assert w["printed_unit"].verdict == FAIL
    assert "which is bytes / 2**30: GiB printed as GB (GB = 1e9 bytes gives" in w["printed_unit"].failure
    assert w["monotone_n"].verdict == SKIP and "does not depend on N" in w["monotone_n"].failure
    assert _by(_certify(right, "memory-estimator", examples=60))["printed_unit"].verdict == PASS


def max_components(p, n, o):
    return {"weights": 4 * p, "grads": 6 * p, "optimizer": 8 * p, "step": 8 * p}


def max_total(p, n, o):
    return max(max_components(p, n, o).values())


def test_a_maximum_of_components_is_named_when_it_fits_no_convention():
    est = Estimator("acc.f16", None, 0, max_total, components=max_components, depends_on_n=False)
    v = _by(_certify(est, "memory-estimator", examples=5))["fit"]
    assert v.verdict == FAIL
    assert v.failure.endswith("no documented convention reproduces it; the total is the maximum of its components "
                              "(weights 4, grads 6, optimizer 8, step 8 B/param), not their sum (26); weights, "
                              "gradients and optimizer state together are 18 B/param")


def boom(p, n, o):
    raise ZeroDivisionError("float division by zero")


def test_an_estimator_that_raises_fails_every_property_naming_the_exception():
    cert = _certify(Estimator("boom.zero1", None, 1, boom), "memory-estimator", examples=5)
    assert [v.verdict for v in cert.verdicts] == [FAIL, FAIL, FAIL, SKIP]
    assert {v.failure for v in cert.verdicts if v.verdict == FAIL} == {
        "rank 0 raised ZeroDivisionError: float division by zero"}


def test_bad_estimator_arguments_and_targets_are_refused():
    with pytest.raises(ConfigError, match="stage"):
        Estimator("x", None, 4, partial(zero, 0))
    with pytest.raises(ConfigError, match="bytes_per_gpu"):
        Estimator("x", None, 1, 5)
    with pytest.raises(ConfigError, match="estimators"):
        EstimatorFamily("x", (Estimator("x", None, 1, partial(zero, 1)),))
    with pytest.raises(ProtocolError, match="must be a distcheck.parallel.memory.estimators.Estimator"):
        certify(partial(zero, 1), "memory-estimator")
    with pytest.raises(ConfigError, match="dtypes='int8' must be one of float64, float32, bfloat16, exact"):
        certify(Estimator("x", None, 1, partial(zero, 1)), "memory-estimator", dtypes=["int8"])


# ---------------------------------------------------------------- rank-layout


def tp_pp_dp_configs():
    return st.fixed_dictionaries({"tp": st.integers(1, 3), "pp": st.integers(1, 3), "dp": st.integers(1, 3)})


def tp_pp_dp_reference(cfg):
    c = ParallelConfig(tp=cfg["tp"], pp=cfg["pp"], dp=cfg["dp"], order="tp-pp-dp")
    return {a: groups(c, a) for a in ("tp", "pp", "dp")}


def hand_written(cfg):  # a hand-written "tp-pp-dp" layout: rank = t + tp*(p + pp*d), dp groups listed backwards
    tp, pp, dp = cfg["tp"], cfg["pp"], cfg["dp"]

    def rank(t, p, d):
        return t + tp * (p + pp * d)

    return {"tp": [[rank(t, p, d) for t in range(tp)] for p in range(pp) for d in range(dp)],
            "pp": [[rank(t, p, d) for p in range(pp)] for t in range(tp) for d in range(dp)],
            "dp": [[rank(t, p, d) for d in range(dp)][::-1] for t in range(tp) for p in range(pp)]}


def pp_dp_swapped(cfg):  # the layout of order tp-dp-pp, not tp-pp-dp
    c = ParallelConfig(tp=cfg["tp"], pp=cfg["pp"], dp=cfg["dp"], order="tp-dp-pp")
    return {a: groups(c, a) for a in ("tp", "pp", "dp")}


def tp_pp_dp(cfg):
    return "tp-pp-dp"


def test_a_layout_equal_to_distchecks_is_certified():
    target = LayoutTarget("fake.right", None, tp_pp_dp_configs, hand_written, tp_pp_dp_reference, tp_pp_dp)
    v = _by(_certify(target, "rank-layout", examples=30))["groups"]
    assert v.verdict == PASS and v.note == "the groups of dp, pp, tp equal distcheck's layout for the same order"


def test_a_wrong_layout_is_caught_with_the_smallest_config():
    target = LayoutTarget("fake.wrong", None, tp_pp_dp_configs, pp_dp_swapped, tp_pp_dp_reference, tp_pp_dp)
    v = _by(_certify(target, "rank-layout", examples=60))["groups"]
    assert v.verdict == FAIL
    assert v.failure == ("{'tp': 1, 'pp': 2, 'dp': 2} (order tp-pp-dp): pp groups differ, target [[0, 2], [1, 3]] "
                         "vs distcheck [[0, 1], [2, 3]] (first difference: group 0: [0, 2] vs [0, 1])")


def test_canonical_sorts_ranks_and_groups():
    assert canonical([[5, 4], [1, 0]]) == [[0, 1], [4, 5]]


# ---------------------------------------------------------------- bad-input, plain and under -O


def _fakelib(tmp_path):
    (tmp_path / "fakelib.py").write_text(textwrap.dedent("""
        def checked(tp):
            if tp < 1:
                raise ValueError(f"tp={tp} must be >= 1")
            return tp
        def asserted(tp):
            assert tp >= 1, "tp must be >= 1"
            return tp
        def renamed(size):  # the upstream signature changed: every call with tp= is a TypeError
            if size < 1:
                raise ValueError(f"size={size} must be >= 1")
            return size
        def untyped(tp):  # refuses only by crashing on a missing attribute
            return tp.bit_count() if tp >= 1 else tp.degree
    """))
    return f"import sys; sys.path.insert(0, {str(tmp_path)!r}); from fakelib import checked, asserted, renamed, untyped"


VALID = (Probe("tp=2", "checked(2)"),)


def test_bad_input_probes_see_asserts_vanish_under_minus_o(tmp_path):
    setup = _fakelib(tmp_path)
    good = _by(_certify(ProbeSet("fake.checked", None, setup, (Probe("tp=0", "checked(0)"),), VALID),
                        "bad-input"))["refused"]
    assert good.verdict == PASS and good.note == ("valid input is accepted; every bad input is refused, also under "
                                                  "python -O (tp=0: ValueError)")
    bad = ProbeSet("fake.asserted", None, setup, (Probe("tp=0", "asserted(0)"), Probe("tp=-1", "checked(-1)")), VALID)
    v = _by(_certify(bad, "bad-input"))["refused"]
    assert v.verdict == FAIL and v.failure == "python -O accepts tp=0 -> 0"
    assert sys.flags.optimize == 0
    with pytest.raises(ConfigError, match="probes"):
        ProbeSet("x", None, setup, (), VALID)
    with pytest.raises(ConfigError, match="valid"):
        ProbeSet("x", None, setup, (Probe("tp=0", "checked(0)"),), ())
    # a setup that raises (the positive control of accelerate's probes: a valid call first) FAILs the row
    control = setup + "\nif checked(1) != 2: raise RuntimeError(f'positive control: checked(1) gave {checked(1)}')"
    failed = _by(_certify(ProbeSet("fake.control", None, control, (Probe("tp=0", "checked(0)"),), VALID), "bad-input"))
    assert failed["refused"].verdict == FAIL and "positive control: checked(1) gave 1" in failed["refused"].failure


def test_a_changed_signature_rejects_valid_input_and_retires_no_finding(tmp_path):
    """TypeError on every probe (the call no longer matches the signature) is not "refuses bad
    input": the positive control fails first, and a recorded finding of the row stays a FAIL."""
    from distcheck.engine.findings import Finding, label_findings

    setup = _fakelib(tmp_path)
    changed = ProbeSet("fake.renamed", None, setup, (Probe("tp=0", "renamed(tp=0)"), Probe("tp=-1", "renamed(tp=-1)")),
                       (Probe("tp=2", "renamed(tp=2)"),))
    cert = _certify(changed, "bad-input")
    v = _by(cert)["refused"]
    assert v.verdict == FAIL and v.failure.startswith("the target rejects valid input (python: tp=2 raised TypeError: ")
    assert "refused" not in v.failure and "no bad input is judged" in v.failure
    [row] = cert.rows()
    record = Finding("fake.renamed.accepts_tp_0", row.check, r"python accepts tp=0 -> 0", "accepts tp=0", "fakelib",
                     ("1.0",), "distcheck libs", "nowhere")
    [labelled] = label_findings([row], [record], versions={"fakelib": "1.1"})
    assert labelled.verdict == FAIL and labelled.extra["finding_differs"] == record.name
    assert "no longer reproduces" not in labelled.detail


def test_only_the_refusal_kinds_count_as_refusing(tmp_path):
    """A TypeError or an AttributeError on bad input is not a refusal; a library's own error type
    counts when the ProbeSet names it, subclasses included."""
    setup = _fakelib(tmp_path)
    probes = (Probe("tp=0", "untyped(0)"), Probe("tp='2'", "checked('2')"), Probe("tp=-1", "checked(-1)"))
    v = _by(_certify(ProbeSet("fake.untyped", None, setup, probes, VALID), "bad-input"))["refused"]
    assert v.verdict == FAIL
    assert v.failure == (
        "python raises what is not a refusal (ValueError, AssertionError, LookupError, RuntimeError): "
        "tp=0 -> AttributeError: 'int' object has no attribute 'degree'; "
        "tp='2' -> TypeError: '<' not supported between instances of 'str' and 'int' | "
        "python -O raises what is not a refusal (ValueError, AssertionError, LookupError, RuntimeError): "
        "tp=0 -> AttributeError: 'int' object has no attribute 'degree'; "
        "tp='2' -> TypeError: '<' not supported between instances of 'str' and 'int'")
    own = ProbeSet("fake.own", None, setup, (Probe("tp=0", "checked(0)"),), VALID, refusals=("ArithmeticError",))
    v = _by(_certify(own, "bad-input"))["refused"]
    assert v.verdict == FAIL and v.failure.startswith("python raises what is not a refusal (ArithmeticError): tp=0 -> "
                                                      "ValueError: tp=0 must be >= 1")
    sub = ProbeSet("fake.sub", None, setup + "\nclass Base(Exception): pass", (Probe("tp=0", "checked(0)"),), VALID,
                   refusals=("Exception",))
    assert _by(_certify(sub, "bad-input"))["refused"].verdict == PASS


# ---------------------------------------------------------------- certificates and the command line


def test_a_world_free_certificate_and_its_replay_command(tmp_path, monkeypatch, capsys):
    from distcheck.cli import main

    path = tmp_path / "cert.json"
    code = main(["certify", "tests.test_libs_contracts:ROUNDS_UP", "--contract", "memory-estimator", "--examples",
                 "60", "--seed", "0", "--profile", "dev", "--certificate", str(path)])
    assert code == 1
    data = json.loads(path.read_text())
    cert = data["certifications"][0]
    assert cert["contract"] == "memory-estimator" and cert["backend"] == "local" and cert["dtypes"] == ["exact"]
    by = {v["property"]: v for v in cert["verdicts"]}
    assert by["truncation"]["verdict"] == FAIL and by["fit"]["verdict"] == PASS
    assert by["printed_unit"]["verdict"] == SKIP
    assert by["fit"]["note"].startswith("bytes per GPU = 0·P + 16·P/N")
    replay = by["truncation"]["reproduce"]
    assert replay == ("distcheck certify tests.test_libs_contracts:ROUNDS_UP --contract memory-estimator --seed 0 "
                      "--profile dev --examples 60 --dtypes exact")
    assert main(replay.split()[1:]) == 1
    assert "off by +9 bytes" in capsys.readouterr().out


ROUNDS_UP = Estimator("bad.zero3", None, 3, rounds_up)


def test_a_target_whose_library_is_missing_is_bad_input(monkeypatch, capsys):
    from distcheck.cli import main
    from distcheck.engine.contracts.errors import TargetError

    missing = Estimator("gone.zero2", "no-such-distribution-here", 2, partial(zero, 2))
    with pytest.raises(TargetError, match="wraps no-such-distribution-here, which is not installed"):
        certify(missing, "memory-estimator")
    monkeypatch.setattr("distcheck.engine.contracts.targets.distribution_version", lambda dist: None)
    assert main(["certify", "distcheck.libs.targets.deepspeed:ZERO2", "--contract", "memory-estimator"]) == 2
    assert "wraps deepspeed, which is not installed" in capsys.readouterr().err


def test_the_contracts_are_listed():
    from distcheck.certify.cli import render_contracts

    text = render_contracts()
    for name in ("memory-estimator (zero)", "memory-estimator-stages (zero)", "rank-layout (layout)",
                 "bad-input (layout)"):
        assert name in text


# ---------------------------------------------------------------- findings, table, runner


def test_every_recorded_finding_has_a_distinct_check_and_labels_only_its_symptom():
    checks = [f.check for f in LIB_FINDINGS]
    assert len(checks) == len(set(checks)) and len(checks) == 14
    record = next(f for f in LIB_FINDINGS if f.check == "libs.deepspeed.zero.baseline_n1")
    seen = ("P=1, N=1, largest_layer_params=1: nothing is sharded, yet the stages differ: deepspeed.zero2 20 bytes "
            "(= 20·P), deepspeed.zero3 22 bytes (= 18·P + 4)")
    rows = label([CheckResult(record.check, "deepspeed 0.19.8", FAIL, detail=seen),
                  CheckResult(record.check, "deepspeed 0.19.8", FAIL, detail=seen.replace("20·P", "21·P"))])
    assert rows[0].verdict == FINDING and rows[0].detail.endswith("Observed: " + seen)
    assert rows[1].verdict == FAIL and "not the recorded finding" in rows[1].detail


def test_accelerate_mean_loss_finding_matches_its_symptom_only():
    # the shrunk case under accelerate's DDP (dp_replicate=2), both ranks off the reference: the finding; one rank
    # off (the replicas disagree: not the mean of means) or another layout stays FAIL
    case = ("StepCase(dp_replicate=2, dp_shard=1, tp=1, pp=1, m=1, clip binds; 2 steps, lr=0.0078125, "
            "max_norm=0.015625; 1 micro-batches of 1 x 2 tokens per dp rank, kept lengths [step][dp rank]"
            "[micro-batch] [[[[1]], [[1]]], [[[1]], [[2]]]]; dim=8, layers=1, heads=1/1 (q/kv), head_dim=2, ffn=4, "
            "vocab=8, untied head; seed=0)")
    seen = (f"{case}: step 2 reported loss (global token mean): ranks [0, 1] differ from the reference; rank 0: "
            "expected 2.6798510454358606, got 2.1168971040660205, error 0.563 > bound 1.25e-09")
    check = "libs.accelerate.ga_mean_loss.loss"
    rows = label([CheckResult(check, "accelerate 1.16.0", FAIL, detail=d) for d in (
        seen, seen.replace("ranks [0, 1] differ", "ranks [1] differ"),
        seen.replace("dp_replicate=2, dp_shard=1", "dp_replicate=1, dp_shard=2"))])
    assert [r.verdict for r in rows] == [FINDING, FAIL, FAIL]
    assert rows[0].extra["finding"]["reproduce"].startswith(
        "distcheck certify distcheck.libs.targets.accelerate:GA_MEAN_LOSS --contract training-step")


def test_summary_rows_fold_a_target_into_one_verdict():
    rows = [CheckResult("libs.deepspeed.zero2.fit", "deepspeed 0.19.8", PASS, extra={"conventions": ["K = 16"]}),
            CheckResult("libs.deepspeed.zero2.monotone_n", "deepspeed 0.19.8", SKIP, detail="n/a"),
            CheckResult("libs.deepspeed.zero2.printed_unit", "deepspeed 0.19.8", FINDING,
                        detail="recorded finding x: y. Observed: P=1, N=1: a|b",
                        extra={"finding": {"reproduce": "python -c 'x'"}}),
            CheckResult("libs.torchtitan", "-", SKIP, detail="torchtitan is not installed")]
    out = {t.target: t for t in summary_rows(rows)}
    ds = out["DeepSpeed ZeRO-2 estimator"]
    assert ds.verdict == "finding (1/2 checks pass, 1 skipped; convention: K = 16)"
    assert ds.counterexamples == ("deepspeed.zero2.printed_unit: P=1, N=1: a|b",)
    assert ds.evidence == ("python -c 'x'", "distcheck libs --target deepspeed")
    assert out["torchtitan ParallelDims (fake backend)"].verdict == "not installed"
    assert "a\\|b" in to_markdown(list(out.values()))


def test_run_libs_skips_or_fails_a_missing_library(monkeypatch):
    monkeypatch.setattr("distcheck.libs.targets.dist_version", lambda dist: None)
    assert [r.verdict for r in run_libs(["torchtitan"])] == [SKIP]
    assert [r.verdict for r in run_libs(["torchtitan"], require_installed=True)] == [FAIL]
    # transformers (the libs extra, or its own): a skip row naming the install, folded into each of its rows
    skipped = run_libs(["transformers"])
    assert [(r.check, r.verdict, r.detail) for r in skipped] == [
        ("libs.transformers", SKIP, "transformers is not installed (pip install 'distcheck[libs]')")]
    from distcheck.libs.table import summary_rows

    assert [(t.library, t.verdict) for t in summary_rows(skipped)] == [("transformers", "not installed")] * 2
    with pytest.raises(ConfigError, match="target"):
        run_libs(["horovod"])


def test_cli_libs_exit_codes(monkeypatch, capsys):
    import tomllib
    from pathlib import Path

    from distcheck.cli import main
    from distcheck.libs import EXTRA, TARGET_NAMES
    from distcheck.libs.targets import target

    # nothing installed: nothing can be checked, so exit 2 and one line naming what to install (it was exit 0,
    # "0 passed, 0 failed, 4 skipped")
    monkeypatch.setattr("distcheck.libs.targets.dist_version", lambda dist: None)
    assert main(["libs"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("distcheck: error: libs='deepspeed, accelerate, megatron-core, torchtitan, transformers' "
                          "are not installed") and f"pip install 'distcheck[{EXTRA}]'" in err and "--allow-skips" in err
    # the extra named is pyproject.toml's, the one that installs every target's library
    extras = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    requirements = extras["project"]["optional-dependencies"][EXTRA]
    listed = {req.split(">")[0].split("=")[0].split("<")[0] for req in requirements}
    assert {target(name).DIST for name in TARGET_NAMES} <= listed
    assert main(["libs", "--target", "accelerate", "--require-installed"]) == 2  # the default, still accepted
    assert "libs='accelerate' is not installed, so nothing of its can be checked" in capsys.readouterr().err
    # one of the chosen libraries missing is enough: refused before anything runs
    monkeypatch.setattr("distcheck.libs.targets.dist_version", lambda dist: None if dist == "torchtitan" else "1.0")
    assert main(["libs", "--target", "deepspeed", "--target", "torchtitan"]) == 2
    assert "libs='torchtitan' is not installed" in capsys.readouterr().err
    # the user who accepts skips asks for them
    monkeypatch.setattr("distcheck.libs.targets.dist_version", lambda dist: None)
    assert main(["libs", "--target", "accelerate", "--allow-skips"]) == 0
    assert "accelerate is not installed" in capsys.readouterr().out
    assert main(["libs", "--examples", "0"]) == 2


def test_the_adapters_import_without_their_libraries():
    # the targets are module-level objects; their libraries load only when a figure is asked for
    from distcheck.libs.targets import accelerate, deepspeed, hf_transformers, megatron, torchtitan, torchtitan_llama

    assert deepspeed.STAGES.estimators == (deepspeed.ZERO2, deepspeed.ZERO3)
    assert {a for a, _ in megatron.CERTIFY} == {"RANK_GENERATOR", "BAD_INPUT"}
    assert accelerate.FLOAT16.depends_on_n is False and torchtitan.PARALLEL_DIMS.name == "torchtitan.parallel_dims"
    assert megatron.ORDERS[0] == "tp-cp-ep-dp-pp" and len(megatron.ORDERS) == 120
    assert {run.name for run in hf_transformers.WORLD_CERTIFY} >= {"transformers.llama_tp", "transformers.mixtral_tp"}
    assert torchtitan_llama.LLAMA.config.dim == 32 and torchtitan_llama.DEBUGMODEL.dim == 256
    assert {run.name for run in torchtitan.WORLD_CERTIFY} >= {"torchtitan.llama_fsdp", "torchtitan.llama_fsdp_tp",
                                                              "torchtitan.llama_pp", "torchtitan.llama_pp_tp"}
    assert torchtitan_llama.LLAMA.pipeline is torchtitan_llama.pipeline  # pp through torchtitan's own split


SEEN_LOCAL_CONSTANTS: list[int] = []


def records_local_constants(p, n, o):
    from hypothesis.internal.conjecture import providers

    SEEN_LOCAL_CONSTANTS.append(len(providers._get_local_constants().integers))
    return 16 * p


def test_hypothesis_draws_without_the_constants_of_loaded_local_modules(tmp_path, monkeypatch):
    # since Hypothesis 6.1xx integers are sometimes drawn from the numbers written in "local" modules (the
    # checkout, tests); a certification must not depend on which are loaded, so the engine empties that pool
    from hypothesis.internal.conjecture import providers

    (tmp_path / "many_constants.py").write_text("VALUES = [" + ", ".join(str(101 + 2 * i) for i in range(500)) + "]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("many_constants")
    providers.CONSTANTS_CACHE.cache.clear()
    assert 101 in providers._get_local_constants().integers  # the pool Hypothesis would draw from
    SEEN_LOCAL_CONSTANTS.clear()
    est = Estimator("local.zero0", None, 0, records_local_constants, depends_on_n=False)
    assert _certify(est, "memory-estimator", examples=10).ok
    assert SEEN_LOCAL_CONSTANTS and set(SEEN_LOCAL_CONSTANTS) == {0}  # empty during the run
    assert 101 in providers._get_local_constants().integers  # and restored after it


# ---------------------------------------------------------------- a target that cannot be loaded: skip, never finding


def test_an_import_failure_is_a_skip_never_a_finding(monkeypatch):
    from distcheck.engine.findings import Finding, label_findings, not_loaded

    with pytest.raises(ConfigError, match="never a finding"):  # a record cannot describe one
        Finding("x.not_in_wheel", "libs.x.import", "cannot import x: ModuleNotFoundError: .*", "s", "x", ("1",),
                "python -c 'import x'", "-")
    with pytest.raises(ConfigError, match="never a finding"):  # also as re.escape writes it
        Finding("x.escaped", "libs.x.import", re.escape("cannot import x.training"), "s", "x", ("1",), "-", "-")
    anything = Finding("x.anything", "libs.x.import", ".*", "matches any detail", "x", ("1",), "-", "-")
    exc = ModuleNotFoundError("No module named 'x.training'")
    skipped = not_loaded("libs.x.import", "x 1", "x.training", exc, "x from its repository")
    required = not_loaded("libs.x.import", "x 1", "x.training", exc, "x from its repository", required=True)
    crashed = CheckResult("libs.x.import", "x 1", FAIL, detail="rank 0 raised ModuleNotFoundError: No module named 'y'")
    rows = label_findings([skipped, required, crashed], (anything,), versions={"x": "1"})
    assert [r.verdict for r in rows] == [SKIP, FAIL, FAIL]
    assert rows[0].detail == ("not loaded: cannot import x.training (ModuleNotFoundError: No module named "
                              "'x.training'); to certify it, install x from its repository")
    assert rows[2].detail == crashed.detail and "finding" not in rows[2].extra
    # Megatron's theoretical memory, absent from the megatron-core wheel: skip, FAIL only when required
    from distcheck.libs.targets import megatron

    monkeypatch.setitem(sys.modules, megatron.THEORETICAL_MEMORY, None)  # makes the import fail here
    monkeypatch.setattr("distcheck.libs.targets.dist_version", lambda dist: "0.16.1")
    monkeypatch.setattr(megatron, "CERTIFY", ())
    monkeypatch.setattr(megatron, "ep_placement", list)  # its row needs megatron-core (tests/test_libs_targets.py)
    got = run_libs(["megatron"])
    assert [(r.check, r.verdict) for r in got] == [("libs.megatron.theoretical_memory.import", SKIP)]
    assert got[0].detail.startswith("not loaded: cannot import megatron.training.theoretical_memory_usage "
                                    "(ModuleNotFoundError")
    assert "git+https://github.com/NVIDIA/Megatron-LM" in got[0].detail
    # --require-installed requires what the libs extra installs: megatron-core is here, and no PyPI wheel of the
    # extra ships megatron.training, so the row stays a skip (the README table is made with the flag in CI)
    assert [r.verdict for r in run_libs(["megatron"], require_installed=True)] == [SKIP]
    monkeypatch.setattr("distcheck.libs.targets.dist_version", lambda dist: None)
    assert [r.verdict for r in run_libs(["megatron"], require_installed=True)] == [FAIL]  # megatron-core missing
    row = next(t for t in summary_rows(got) if t.target == "Megatron-core theoretical memory")
    assert row.verdict.startswith("skip (0/0 checks pass, 1 skipped): not loaded: cannot import")
    assert not row.counterexamples


# ---------------------------------------------------------------- expert-parallel placement, named


def test_the_ep_placement_row_names_megatrons_or_torchtitans_convention():
    from distcheck.libs.targets import ep_placement_row
    from distcheck.parallel.layout import EP_PLACEMENT_MEGATRON, EP_PLACEMENT_TORCHTITAN, ep_placements

    assert ep_placements(tp=2, data=2, ep=2) == {EP_PLACEMENT_MEGATRON: [[0, 2], [1, 3]],
                                                 EP_PLACEMENT_TORCHTITAN: [[0, 1], [2, 3]]}
    titan = ep_placement_row("libs.x.ep_placement", "x 1", [[3, 2], [1, 0]], tp=2, data=2, ep=2, call="x()")
    assert titan.verdict == PASS and titan.extra["conventions"] == [EP_PLACEMENT_TORCHTITAN]
    assert titan.detail == (f"x() gives ep groups [[0, 1], [2, 3]] at tp=2, 2 data-parallel ranks, ep=2: "
                            f"{EP_PLACEMENT_TORCHTITAN}; not {EP_PLACEMENT_MEGATRON}, which gives [[0, 2], [1, 3]]")
    megatron = ep_placement_row("libs.x.ep_placement", "x 1", [[0, 2], [1, 3]], tp=2, data=2, ep=2, call="x()")
    assert megatron.verdict == PASS and megatron.extra["conventions"] == [EP_PLACEMENT_MEGATRON]
    neither = ep_placement_row("libs.x.ep_placement", "x 1", [[0, 3], [1, 2]], tp=2, data=2, ep=2, call="x()")
    assert neither.verdict == FAIL and "none of the named placements" in neither.detail and not neither.extra
    blind = ep_placement_row("libs.x.ep_placement", "x 1", [[0, 1], [2, 3]], tp=1, data=4, ep=2, call="x()")
    assert blind.verdict == FAIL and "cannot be told apart" in blind.detail  # tp = 1: both give [[0, 1], [2, 3]]
    # the folded row names the convention of its passing rows
    rows = [CheckResult("libs.torchtitan.parallel_dims.groups", "torchtitan 0.3.0", PASS),
            titan.__class__(**{**titan.__dict__, "check": "libs.torchtitan.parallel_dims.ep_placement"})]
    row = next(t for t in summary_rows(rows) if t.library == "torchtitan")
    assert row.verdict == f"certified (2/2 checks pass; convention: {EP_PLACEMENT_TORCHTITAN})"


# ---------------------------------------------------------------- torchtitan's MoE debug model under its parallelize


def test_the_torchtitan_moe_step_row_skips_only_while_every_attention_backend_is_refused(monkeypatch):
    # the row's claim is probed: every backend refused on CPU gives a skip naming each refusal; one that trains
    # turns the row into a FAIL asking for the adapter (torchtitan itself is not needed: both probes replaced)
    from distcheck.libs.targets import torchtitan_moe as tm

    monkeypatch.setattr("distcheck.libs.targets.dist_version", lambda dist: "0.3.0")
    monkeypatch.setattr(tm, "expert_precision", lambda: -7.25)
    monkeypatch.setattr(tm, "backward_refusal", lambda b: f"NotImplementedError: no {b} on CPU")
    row = tm.moe_step_row()
    assert (row.check, row.verdict, row.backend) == ("libs.torchtitan.moe_step", SKIP, "torchtitan 0.3.0")
    for b in tm.ATTENTION_BACKENDS:
        assert f"{b}: NotImplementedError: no {b} on CPU" in row.detail, row.detail
    assert "(a float64 expert 2^-7.2 off the float64 product)" in row.detail
    monkeypatch.setattr(tm, "backward_refusal", lambda b: None if b == "varlen" else "ValueError: no")
    row = tm.moe_step_row()
    assert row.verdict == FAIL and "trains on CPU under attn_backend varlen" in row.detail, row.detail
