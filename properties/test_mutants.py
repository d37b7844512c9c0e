"""Every mutant must be killed by its property under the ci profile, with a shrunk,
readable counterexample; the kill count is what ``distcheck check`` reports."""

import re

import numpy as np
import pytest

from distcheck.mutants import MUTANTS, Mutant, kill_mutant, mutants
from distcheck.props import get

#: the mistakes issue 3 lists, each with the mutant that carries it
NAMED_IN_ISSUE = {
    "plain mean over unequal shards": "dp.plain_mean_unequal",
    "per-micro-batch mean, then a mean over micro-batches": "accumulation.mean_of_means",
    "row-split W_up with column-split W_down and no extra all-reduce": "tp.mlp.row_then_column",
    "layer norm over a sharded hidden dimension": "tp.layer_norm.per_shard",
    "bias added on every TP rank before the all-reduce": "tp.row.bias_every_rank",
    "a fused gate/up weight sharded without first separating gate and up": "tp.swiglu.fused_naive_split",
    "attention parameter count that ignores KV heads": "params.attention_ignores_kv",
    "a tied embedding counted twice": "params.tied_counted_twice",
    "a tied embedding subtracted twice": "params.tied_subtracted_twice",
    "a mesh axis order that puts TP groups across nodes": "layout.tp_outermost",
    "(p-1)/m labelled as a fraction of total time": "pp.ratio_as_fraction",
    "ZeRO stage 2 that forgets to shard gradients": "zero.stage2_unsharded_grads",
}
#: mistakes that only show on the strategies' edge cases
EDGE_CASES = {"tp.row.even_split_only", "pp.stash_ignores_m", "zero.floor_partition"}
#: right numbers, wrong collective record: killed by the count a property states
COUNTS = {"tp.row.unlogged_allreduce"}


def test_catalogue_covers_the_issue_and_the_edge_cases():
    # the catalogue is found by discovery: every mistake named here is in it (a package may add more)
    assert set(NAMED_IN_ISSUE.values()) | EDGE_CASES | COUNTS <= set(MUTANTS)
    assert [m.name for m in mutants()] == sorted(MUTANTS)
    for m in mutants():
        assert get(m.kills).name == m.kills
        assert m.description and m.function.__doc__


@pytest.fixture(scope="module")
def kills():
    """What distcheck check runs: each property tries its edge cases, then generated cases."""
    return {m.name: kill_mutant(m, "ci") for m in mutants()}


@pytest.fixture(scope="module")
def generated_kills():
    """The generated search alone (no edge cases): the strategies must reach every mistake too."""
    return {m.name: kill_mutant(m, "ci", edge_cases=False) for m in mutants()}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_killed_by_one_of_its_propertys_edge_cases(kills, name):
    result = kills[name]
    mutant = MUTANTS[name]
    assert result.verdict == "pass", result.detail
    assert result.extra["killed"] is True and result.extra["outcome"] == "killed"
    assert result.extra["found_by"].startswith("edge case ")
    assert result.extra["counterexample"] in [repr(c) for c in get(mutant.kills).edge_cases()]
    assert result.extra["reproduce"] == f"kill_mutant({name!r}, profile='ci', seed=0)"
    assert result.extra["replay"] == "distcheck check --only properties --profile ci --seed 0"
    assert result.detail.startswith(f"killed by {mutant.kills}")


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_generated_search_alone_kills_it_with_a_shrunk_counterexample(generated_kills, name):
    result = generated_kills[name]
    assert result.verdict == "pass", result.detail
    assert result.extra["found_by"] == "generated example" and result.extra["edge_cases"] == 0
    assert result.extra["counterexample"], "the shrunk counterexample must be reported"
    assert result.extra["reproduce_failure"].startswith("@reproduce_failure(")
    # examples is the real count of calls: those up to the first failure plus the shrinking replays
    assert result.examples == result.extra["examples_until_failure"] + result.extra["shrink_calls"]
    assert 1 <= result.extra["examples_until_failure"] <= result.extra["max_examples"]


def _dims(text: str) -> list[int]:
    """Lengths of every innermost list in a counterexample repr, e.g. 'x=[[1.0, 0.0]]' -> [2]."""
    return [len(inner.split(",")) for inner in re.findall(r"\[([^\[\]]*)\]", text)]


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_counterexample_is_shrunk_and_readable(generated_kills, name):
    text = generated_kills[name].extra["counterexample"]
    assert len(text) <= 300, text  # one readable line
    assert "\n" not in text
    assert max(_dims(text), default=0) <= 3, text  # no array wider than 3 entries
    numbers = [float(x) for x in re.findall(r"(?<![\w.])-?\d+(?:\.\d+)?", text)]  # not the 64 of 'int64'
    assert max(map(abs, numbers)) <= 16, text  # small values (shard sizes, dims and entries)


def test_pinned_shrunk_counterexamples(generated_kills):
    kills = generated_kills
    # the smallest cases showing each mistake (ci runs with seed 0, so these are stable)
    assert kills["tp.layer_norm.per_shard"].extra["counterexample"] == "NormCase(tp=2, x=[[0.0, 1.0]])"
    assert kills["pp.ratio_as_fraction"].extra["counterexample"] == \
        "PipelineParams(schedule='gpipe', p=2, m=1, v=1, t_f=1, t_b=1)"
    assert kills["zero.floor_partition"].extra["counterexample"] == "ZeroCase(params=1, dp=2, k=12)"
    # two shards of 2 and 1 examples, one feature, entries 0 or 1: Hypothesis versions differ in which of
    # these equally small cases their shrinker ends on
    bit = r"[01]\.0"
    assert re.fullmatch(rf"DPCase\(shard_sizes=\(2, 1\), X=\[\[{bit}\], \[{bit}\], \[{bit}\]\], "
                        rf"y=\[{bit}, {bit}, {bit}\], w=\[{bit}\]\)",
                        kills["dp.plain_mean_unequal"].extra["counterexample"])


def test_edge_case_mutants_are_killed_on_their_edge_by_the_generated_search_too(generated_kills):
    kills = generated_kills
    row = kills["tp.row.even_split_only"].extra["counterexample"]
    tp = int(re.search(r"tp=(\d+)", row).group(1))
    k = len(re.search(r"x=\[\[([^\]]*)\]", row).group(1).split(","))
    assert k % tp != 0  # tp does not divide in_features
    stash = kills["pp.stash_ignores_m"].extra["counterexample"]
    p, m = (int(re.search(rf"{a}=(\d+)", stash).group(1)) for a in ("p", "m"))
    assert m < p
    zero = kills["zero.floor_partition"].extra["counterexample"]
    params, dp = (int(re.search(rf"{a}=(\d+)", zero).group(1)) for a in ("params", "dp"))
    assert params % dp != 0


def test_row_then_column_is_killed_on_its_claim_numbers_and_count():
    # it omits the all-reduce after the row-split W_up: its numbers are wrong, and it records none
    from distcheck import strategies as ds
    from distcheck.core.errors import PropertyFailure
    from distcheck.mutants import row_then_column_mlp
    from distcheck.parallel.tp import properties as T

    case = ds.MLPCase(x=np.array([[1.0, -1.0]]), W_up=np.array([[1.0, 0.0], [1.0, 0.0]]),
                      W_down=np.array([[1.0, 1.0], [0.0, 0.0]]), tp=2)
    with pytest.raises(PropertyFailure, match="not bitwise equal"):  # relu(0) vs relu(1) + relu(-1)
        T.mlp_exact(case, impl=row_then_column_mlp)
    zeros = ds.MLPCase(x=np.zeros((1, 2)), W_up=np.zeros((2, 2)), W_down=np.zeros((2, 2)), tp=2)
    with pytest.raises(PropertyFailure, match="0 all-reduces per forward"):  # right numbers, no all-reduce
        T.mlp_exact(zeros, impl=row_then_column_mlp)


def test_unlogged_allreduce_is_killed_on_the_count(kills):
    row = kills["tp.row.unlogged_allreduce"]
    assert row.extra["failure_kind"] == "claim"
    assert "0 all-reduces per forward (the implementation takes log= but recorded no all-reduce)" in row.extra["error"]
    assert re.search(r"LinearCase\(tp=[2-9]", row.extra["counterexample"])  # tp = 1 needs no all-reduce


def test_a_correct_implementation_survives():
    # the reference itself, registered as a "mutant", must NOT be killed: the check can fail
    from distcheck.parallel.pp.properties import bubble_fraction_formula

    fake = Mutant("reference", bubble_fraction_formula, "pp.bubble_fraction.formula", "not wrong")
    result = kill_mutant(fake, "ci")
    assert result.verdict == "FAIL" and "SURVIVED" in result.detail
    assert result.extra["outcome"] == "survived" and result.examples == 6 + 40  # its 6 edge cases, then 40 examples
    # the table says how to replay the survivor, not only the JSON
    from rich.console import Console

    from distcheck.report import render_table

    console = Console(record=True, width=200, color_system=None)
    render_table([result], console=console)
    text = " ".join(console.export_text().split())
    assert "FAIL mutant:reference (reference, world size 1): SURVIVED 46 examples" in text
    assert "seed: 0 (profile ci)" in text and "reproduce: kill_mutant('reference', profile='ci', seed=0)" in text


def _row_parallel_divides_by_zero(x, W, tp, b=None, *, log=None):
    """A row-parallel layer that crashes on every call (integer division by zero)."""
    return x @ W * (tp // (tp - tp))


def _row_parallel_wrong_signature(x, W):
    """A row-parallel layer that does not take tp (the property calls it with four arguments)."""
    return x @ W


def _row_parallel_raising_property_failure(x, W, tp, b=None, *, log=None):
    """A layer that raises PropertyFailure itself: not the property's verdict, so not a kill."""
    from distcheck.core.errors import PropertyFailure

    raise PropertyFailure("raised by the implementation")


@pytest.mark.parametrize("fn, error", [
    (_row_parallel_divides_by_zero, "ZeroDivisionError: integer division or modulo by zero"),
    (_row_parallel_wrong_signature,
     "TypeError: _row_parallel_wrong_signature() takes 2 positional arguments but 4 were given"),
    (_row_parallel_raising_property_failure, "PropertyFailure: raised by the implementation"),
])
def test_a_mutant_that_raises_is_broken_not_killed(fn, error):
    result = kill_mutant(Mutant("broken", fn, "tp.row.exact", "crashes"), "ci")
    assert result.verdict == "FAIL"
    assert result.extra["outcome"] == "broken" and result.extra["killed"] is False
    assert result.extra["failure_kind"] == "raised" and result.extra["error_type"] == "ImplementationError"
    assert result.detail.startswith(f"BROKEN (not a kill of tp.row.exact): implementation row_parallel raised {error}")


def test_broken_mutants_are_not_counted_as_kills(kills):
    from distcheck.props import mutant_summary

    broken = [kill_mutant(Mutant(name, fn, "tp.row.exact", "crashes"), "ci")
              for name, fn in (("zero_division", _row_parallel_divides_by_zero),
                               ("wrong_signature", _row_parallel_wrong_signature))]
    summary = mutant_summary([kills["tp.row.even_split_only"], *broken], properties=["tp.row.exact"])
    assert summary.verdict == "FAIL"
    assert summary.detail == ("mutants killed 1/3; properties without a mutant: 0; broken: zero_division, "
                              "wrong_signature")
    assert summary.extra["broken"] == ["zero_division", "wrong_signature"] and summary.extra["killed"] == 1


def test_summary_row_counts_kills():
    from distcheck.props import mutant_summary
    from distcheck.report import CheckResult

    rows = [CheckResult("mutant:a", "reference", "pass", examples=3),
            CheckResult("mutant:b", "reference", "FAIL", examples=40)]
    summary = mutant_summary(rows, properties=())
    assert summary.verdict == "FAIL"
    assert summary.detail == "mutants killed 1/2; properties without a mutant: 0; survived: b"
    assert mutant_summary(rows[:1], properties=()).detail == "mutants killed 1/1; properties without a mutant: 0"


def test_mutants_fail_on_the_lessons_numbers():
    # pinned: the DP lesson's 2/1 split; the plain mean weighs the lone example twice
    from distcheck.mutants import plain_mean_unequal

    g = plain_mean_unequal([np.array([0.0]), np.array([2.0])], [2, 1])
    assert g.tolist() == [1.0]  # weighted (exact) answer: 2/3


def test_check_reports_every_mutant_killed(kills):
    from distcheck.props import mutant_summary

    summary = mutant_summary(kills[n] for n in sorted(kills))
    assert summary.verdict == "pass"
    assert len(MUTANTS) >= len(set(NAMED_IN_ISSUE.values()) | EDGE_CASES | COUNTS) == 16
    assert summary.detail == f"mutants killed {len(MUTANTS)}/{len(MUTANTS)}; properties without a mutant: 0"
    assert summary.extra["without_mutant"] == []


def test_every_registered_property_kills_a_mutant_on_its_own_claim(kills):
    from distcheck.props import properties

    shown = {row.extra["property"] for row in kills.values() if row.extra["outcome"] == "killed"}
    missing = sorted(p.name for p in properties() if p.name not in shown)
    assert not missing, f"properties that kill no mutant: {missing}"
    assert len(properties()) == 57 and len(MUTANTS) == 70  # the counts README.md states


def test_a_registered_property_without_a_mutant_fails_the_row(kills, monkeypatch):
    from hypothesis import strategies as st

    from distcheck.engine import registry
    from distcheck.props import mutant_summary

    def never_fails(case, *, impl=None):
        return None

    unshown = registry.Property("zz.unshown.holds", lambda: st.just(0), never_fails, "holds for anything")
    monkeypatch.setitem(registry._REGISTRY, unshown.name, unshown)
    summary = mutant_summary(kills[n] for n in sorted(kills))
    assert summary.verdict == "FAIL"
    assert summary.detail == (f"mutants killed {len(MUTANTS)}/{len(MUTANTS)}; properties without a mutant: 1 "
                              "(zz.unshown.holds)")
    assert summary.extra["without_mutant"] == ["zz.unshown.holds"]


def test_run_all_passes_its_profile_and_one_seed_down_and_ends_with_the_kill_count(monkeypatch):
    import distcheck.engine.mutants as mutants_module
    import distcheck.engine.proofs as proofs
    import distcheck.engine.run as props
    from distcheck.report import CheckResult

    seen = {}

    def fake_suite(suite=None, profile="ci", *, seed=None, **kw):
        seen["suite"] = (profile, seed)
        return [CheckResult("p", "reference", "pass", examples=25)]

    def fake_kill(profile="ci", *, seed=None):
        seen["mutants"] = (profile, seed)
        return [CheckResult("mutant:m", "reference", "pass", examples=7)]

    monkeypatch.setattr(props, "run_suite", fake_suite)
    monkeypatch.setattr(mutants_module, "kill_mutants", fake_kill)
    monkeypatch.setattr(proofs, "prove_all", lambda: [CheckResult("proof", "sympy", "pass", examples=1)])
    rows = props.run_all("dev", seed=31)
    assert seen == {"suite": ("dev", 31), "mutants": ("dev", 31)}
    assert [r.check for r in rows] == ["p", "proof", "mutant:m", "mutants"]
    assert rows[-1].detail.startswith("mutants killed 1/1; properties without a mutant: ")  # m kills none of them
    assert rows[-1].extra["seed"] == 31 and rows[-1].extra["profile"] == "dev"
    # without a seed, dev draws one, and properties and mutants share it
    props.run_all("dev")
    assert seen["suite"] == seen["mutants"] and isinstance(seen["suite"][1], int)


def test_with_edge_cases_runs_a_propertys_edge_cases_first_in_order():
    from hypothesis import Phase, given, settings

    from distcheck import strategies as ds
    from distcheck.props import with_edge_cases

    seen = []

    @settings(phases=[Phase.explicit], database=None)
    @with_edge_cases("pp.stash.formula")
    @given(ds.pipeline_params())
    def record(pp):
        seen.append(pp)

    record()
    assert seen == list(get("pp.stash.formula").edge_cases())
    assert ds.PipelineParams("1f1b", 2, 1, 1, 1, 2) in seen  # m < p

    from distcheck.mutants import stash_ignores_few_microbatches
    from distcheck.parallel.pp.properties import stash_formula_matches_simulator

    @settings(phases=[Phase.explicit], database=None)
    @with_edge_cases("pp.stash.formula")
    @given(ds.pipeline_params())
    def users_test(pp):
        stash_formula_matches_simulator(pp, impl=stash_ignores_few_microbatches)

    with pytest.raises(AssertionError, match="peak in flight of the formula vs the simulator"):
        users_test()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_no_mutant_survives_any_of_100_seeds_under_dev(name):
    # the kill must not depend on luck: each seed runs the mutant's property (dev: 25 examples),
    # stopping at the first failure
    survivors = [seed for seed in range(100)
                 if kill_mutant(name, "dev", seed=seed, shrink=False).extra["outcome"] != "killed"]
    assert survivors == []
