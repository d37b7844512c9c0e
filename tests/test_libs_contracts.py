"""The real-library contracts on small fake targets: right ones pass with the convention named,
deliberately wrong ones (estimators and layouts) are caught with their smallest counterexample.
No third-party library is needed here (tests/test_libs_targets.py runs the real ones)."""

from __future__ import annotations

import sys
import textwrap
from fractions import Fraction

import pytest
from hypothesis import strategies as st

from distcheck.errors import ConfigError
from distcheck.layout import ParallelConfig, groups
from distcheck.libs import run_libs
from distcheck.libs.badinput import Probe, check_bad_input
from distcheck.libs.estimators import (
    STATE_CONVENTIONS, Estimator, Fit, check_estimator, check_family, conventions_for, fit, read_printed, total_rule,
)
from distcheck.libs.findings import LIB_FINDINGS, label
from distcheck.libs.layouts import LayoutTarget, canonical, check_layout
from distcheck.libs.search import falsify
from distcheck.libs.table import summary_rows, to_markdown
from distcheck.report import FAIL, FINDING, PASS, SKIP, CheckResult


def _zero(stage: int, k: int = 12, w: int = 2, g: int = 2):
    """The ZeRO paper's Figure 1 for one stage, as an exact estimator."""
    def f(p, n, o):
        rep, sh = {0: (w + g + k, 0), 1: (w + g, k), 2: (w, g + k), 3: (0, w + g + k)}[stage]
        return Fraction(rep * p) + Fraction(sh * p, n)
    return f


def _by_check(rows):
    return {r.check: r for r in rows}


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


# ---------------------------------------------------------------- the estimator contract


def test_a_right_zero_estimator_is_certified_with_k12_named():
    ests = [Estimator(f"paper.zero{s}", "paper", s, _zero(s)) for s in range(4)]
    rows = [r for e in ests for r in check_estimator(e, max_examples=25)] + check_family("paper.zero", ests,
                                                                                            max_examples=25)
    assert all(r.verdict == PASS for r in rows), [r.detail for r in rows if r.verdict != PASS]
    fits = _by_check(rows)
    assert fits["libs.paper.zero2.fit"].extra["conventions"] == ["K = 12"]
    assert fits["libs.paper.zero2.fit"].detail.startswith("bytes per GPU = 2·P + 14·P/N: 2 B/param replicated")
    assert fit(ests[1]) == Fit(Fraction(4), Fraction(12), Fraction(0))


def test_a_wrong_estimator_that_never_shards_the_weights_fails_the_fit():
    wrong = Estimator("wrong.zero3", "wrong", 3, lambda p, n, o: 2 * p + Fraction(16 * p, n))
    row = check_estimator(wrong, max_examples=10)[0]
    assert row.verdict == FAIL
    assert row.detail.startswith("bytes per GPU = 2·P + 16·P/N: 2 B/param replicated, 16 B/param sharded over N at "
                                 "ZeRO stage 3; no documented convention reproduces it")


def test_truncation_over_a_byte_is_caught_with_the_smallest_counterexample():
    # rounds P/N up and adds a byte whenever N does not divide P: off by up to 2 bytes
    bad = Estimator("bad.zero3", "bad", 3, lambda p, n, o: 16 * (-(-p // n)) + (1 if p % n else 0))
    row = _by_check(check_estimator(bad, max_examples=60))["libs.bad.zero3.truncation"]
    assert row.verdict == FAIL
    assert row.detail == ("P=1, N=2: the estimator gives 17 bytes, 0·P + 16·P/N gives 8: off by +9 bytes "
                          "(at least a byte per rank)")


def test_figures_growing_with_n_are_caught():
    # a buffer of one byte per rank in the world: grows with N, outgrowing the sharded state for small P
    bad = Estimator("bad.zero2", "bad", 2, lambda p, n, o: 2 * p + Fraction(14 * p, n) + n)
    row = _by_check(check_estimator(bad, max_examples=80))["libs.bad.zero2.monotone_n"]
    assert row.verdict == FAIL
    assert row.detail == "P=1: N=3 gives 29/3 bytes but N=5 gives more, 49/5"  # 2 + 14/3 + 3 < 2 + 14/5 + 5


def test_a_deepspeed_like_pair_fails_baseline_and_stage_order_at_p1():
    z2 = Estimator("ds.zero2", "ds", 2, lambda p, n, o: 2 * p + int(18 * p / n))
    z3 = Estimator("ds.zero3", "ds", 3, lambda p, n, o: 4 * o["largest_layer_params"] + int(18 * p / n),
                   options=lambda p: st.integers(1, p).map(lambda n: {"largest_layer_params": n}),
                   fit_options={"largest_layer_params": 1})
    rows = _by_check(check_family("ds.zero", [z2, z3], max_examples=60))
    assert rows["libs.ds.zero.baseline_n1"].detail == (
        "P=1, N=1, largest_layer_params=1: nothing is sharded, yet the stages differ: ds.zero2 20 bytes (= 20·P), "
        "ds.zero3 22 bytes (= 18·P + 4)")
    assert rows["libs.ds.zero.stage_order"].detail == (
        "P=1, N=1, largest_layer_params=1: stage 3 (ds.zero3) needs 22 bytes, more than stage 2 (ds.zero2), 20")
    fit_row = check_estimator(z3, max_examples=5)[0]
    assert fit_row.verdict == PASS and fit_row.extra["conventions"] == ["K = 14", "fp32 gradients instead of 16-bit ones"]


def test_gib_printed_as_gb_is_named_and_a_decimal_print_passes():
    def gib(p, n, o):
        return f"{16 * p / 2**30:.2f}GB"

    def gb(p, n, o):
        return f"{16 * p / 1e9:.2f}GB"

    wrong = Estimator("p.gib", "p", 0, lambda p, n, o: 16 * p, printed=gib, depends_on_n=False)
    right = Estimator("p.gb", "p", 0, lambda p, n, o: 16 * p, printed=gb, depends_on_n=False)
    w = _by_check(check_estimator(wrong, max_examples=60))["libs.p.gib.printed_unit"]
    assert w.verdict == FAIL and "which is bytes / 2**30: GiB printed as GB (GB = 1e9 bytes gives" in w.detail
    assert _by_check(check_estimator(right, max_examples=60))["libs.p.gb.printed_unit"].verdict == PASS


def test_a_maximum_of_components_is_named_when_it_fits_no_convention():
    def comps(p, n, o):
        return {"weights": 4 * p, "grads": 6 * p, "optimizer": 8 * p, "step": 8 * p}

    est = Estimator("acc.f16", "acc", 0, lambda p, n, o: max(comps(p, n, o).values()), components=comps,
                    depends_on_n=False)
    row = check_estimator(est, max_examples=5)[0]
    assert row.verdict == FAIL
    assert row.detail.endswith("no documented convention reproduces it; the total is the maximum of its components "
                               "(weights 4, grads 6, optimizer 8, step 8 B/param), not their sum (26); weights, "
                               "gradients and optimizer state together are 18 B/param")


def test_an_estimator_that_raises_is_a_fail_naming_the_exception():
    def boom(p, n, o):
        raise ZeroDivisionError("float division by zero")

    rows = check_estimator(Estimator("boom.zero1", "boom", 1, boom), max_examples=5)
    assert {r.verdict for r in rows} == {FAIL}
    assert rows[0].detail == "raised ZeroDivisionError: float division by zero"


def test_bad_estimator_arguments_are_refused():
    with pytest.raises(ConfigError, match="stage"):
        Estimator("x", "x", 4, _zero(0))
    with pytest.raises(ConfigError, match="bytes_per_gpu"):
        Estimator("x", "x", 1, 5)
    with pytest.raises(ConfigError, match="estimators"):
        check_family("x", [Estimator("x", "x", 1, _zero(1))])


def test_falsify_keeps_the_shrunk_example_and_counts():
    out = falsify(lambda x: "big" if x >= 10 else None, st.integers(0, 1000), max_examples=50)
    assert out.failed and out.counterexample == 10 and out.message == "big"
    assert not falsify(lambda x: None, st.integers(0, 3), max_examples=5).failed


# ---------------------------------------------------------------- the layout contract


def _configs():
    return st.fixed_dictionaries({"tp": st.integers(1, 3), "pp": st.integers(1, 3), "dp": st.integers(1, 3)})


def _reference(cfg):
    c = ParallelConfig(tp=cfg["tp"], pp=cfg["pp"], dp=cfg["dp"], order="tp-pp-dp")
    return {a: groups(c, a) for a in ("tp", "pp", "dp")}


def test_a_layout_equal_to_distchecks_passes():
    def target(cfg):  # a hand-written "tp-pp-dp" layout: rank = t + tp*(p + pp*d)
        tp, pp, dp = cfg["tp"], cfg["pp"], cfg["dp"]
        rank = lambda t, p, d: t + tp * (p + pp * d)  # noqa: E731
        return {"tp": [[rank(t, p, d) for t in range(tp)] for p in range(pp) for d in range(dp)],
                "pp": [[rank(t, p, d) for p in range(pp)] for t in range(tp) for d in range(dp)],
                "dp": [[rank(t, p, d) for d in range(dp)][::-1] for t in range(tp) for p in range(pp)]}

    row = check_layout(LayoutTarget("fake.right", "fake", _configs(), target, _reference, lambda c: "tp-pp-dp"),
                       max_examples=30)
    assert row.verdict == PASS and row.extra["tokens"] == ["dp", "pp", "tp"]


def test_a_wrong_layout_is_caught_with_the_smallest_config():
    def wrong(cfg):  # pp and dp swapped: the layout of order tp-dp-pp, not tp-pp-dp
        c = ParallelConfig(tp=cfg["tp"], pp=cfg["pp"], dp=cfg["dp"], order="tp-dp-pp")
        return {a: groups(c, a) for a in ("tp", "pp", "dp")}

    row = check_layout(LayoutTarget("fake.wrong", "fake", _configs(), wrong, _reference, lambda c: "tp-pp-dp"),
                       max_examples=60)
    assert row.verdict == FAIL
    assert row.detail == ("{'tp': 1, 'pp': 2, 'dp': 2} (order tp-pp-dp): pp groups differ, target [[0, 2], [1, 3]] "
                          "vs distcheck [[0, 1], [2, 3]] (first difference: group 0: [0, 2] vs [0, 1])")


def test_canonical_sorts_ranks_and_groups():
    assert canonical([[5, 4], [1, 0]]) == [[0, 1], [4, 5]]


# ---------------------------------------------------------------- bad input, plain and under -O


def test_bad_input_probes_see_asserts_vanish_under_minus_o(tmp_path):
    (tmp_path / "fakelib.py").write_text(textwrap.dedent("""
        def checked(tp):
            if tp < 1:
                raise ValueError(f"tp={tp} must be >= 1")
            return tp
        def asserted(tp):
            assert tp >= 1, "tp must be >= 1"
            return tp
    """))
    setup = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); from fakelib import checked, asserted"
    good = check_bad_input("fake.checked", "fake", setup, (Probe("tp=0", "checked(0)"),))
    assert good.verdict == PASS and good.detail == "every bad input is refused, also under python -O (tp=0: ValueError)"
    bad = check_bad_input("fake.asserted", "fake", setup, (Probe("tp=0", "asserted(0)"), Probe("tp=-1", "checked(-1)")))
    assert bad.verdict == FAIL and bad.detail == "python -O accepts tp=0 -> 0"
    assert sys.flags.optimize == 0


# ---------------------------------------------------------------- findings, table, runner


def test_every_recorded_finding_has_a_distinct_check_and_labels_only_its_symptom():
    checks = [f.check for f in LIB_FINDINGS]
    assert len(checks) == len(set(checks)) and len(checks) == 10
    record = next(f for f in LIB_FINDINGS if f.check == "libs.deepspeed.zero.baseline_n1")
    seen = ("P=1, N=1, largest_layer_params=1: nothing is sharded, yet the stages differ: deepspeed.zero2 20 bytes "
            "(= 20·P), deepspeed.zero3 22 bytes (= 18·P + 4)")
    rows = label([CheckResult(record.check, "deepspeed 0.19.8", FAIL, detail=seen),
                  CheckResult(record.check, "deepspeed 0.19.8", FAIL, detail=seen.replace("20·P", "21·P"))])
    assert rows[0].verdict == FINDING and rows[0].detail.endswith("Observed: " + seen)
    assert rows[1].verdict == FAIL and "not the recorded finding" in rows[1].detail


def test_summary_rows_fold_a_target_into_one_verdict():
    rows = [CheckResult("libs.deepspeed.zero2.fit", "deepspeed 0.19.8", PASS, extra={"conventions": ["K = 16"]}),
            CheckResult("libs.deepspeed.zero2.printed_unit", "deepspeed 0.19.8", FINDING,
                        detail="recorded finding x: y. Observed: P=1, N=1: a|b",
                        extra={"finding": {"reproduce": "python -c 'x'"}}),
            CheckResult("libs.torchtitan", "-", SKIP, detail="torchtitan is not installed")]
    out = {t.target: t for t in summary_rows(rows)}
    ds = out["DeepSpeed ZeRO-2 estimator"]
    assert ds.verdict == "finding (1/2 checks pass; convention: K = 16)"
    assert ds.counterexamples == ("deepspeed.zero2.printed_unit: P=1, N=1: a|b",)
    assert ds.evidence == ("python -c 'x'", "distcheck libs --target deepspeed")
    assert out["torchtitan ParallelDims (fake backend)"].verdict == "not installed"
    assert "a\\|b" in to_markdown(list(out.values()))


def test_run_libs_skips_or_fails_a_missing_library(monkeypatch):
    monkeypatch.setattr("distcheck.libs.targets.dist_version", lambda dist: None)
    assert [r.verdict for r in run_libs(["torchtitan"])] == [SKIP]
    assert [r.verdict for r in run_libs(["torchtitan"], require_installed=True)] == [FAIL]
    with pytest.raises(ConfigError, match="target"):
        run_libs(["horovod"])


def test_cli_libs_exit_codes(monkeypatch, capsys):
    from distcheck.cli import main

    monkeypatch.setattr("distcheck.libs.targets.dist_version", lambda dist: None)
    assert main(["libs", "--target", "accelerate"]) == 0
    assert "accelerate is not installed" in capsys.readouterr().out
    assert main(["libs", "--target", "accelerate", "--require-installed"]) == 1
    assert main(["libs", "--examples", "0"]) == 2


def test_falsify_does_not_depend_on_the_constants_of_loaded_local_modules(tmp_path, monkeypatch):
    def check(x):
        return "odd over 100" if x > 100 and x % 2 else None

    before = falsify(check, st.integers(0, 10**9), max_examples=100)
    (tmp_path / "many_constants.py").write_text("VALUES = [" + ", ".join(str(101 + 2 * i) for i in range(500)) + "]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("many_constants")
    after = falsify(check, st.integers(0, 10**9), max_examples=100)
    assert before == after and before.counterexample == 101
