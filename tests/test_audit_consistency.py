"""Consistency of printed figures: what a rounded figure stands for, whole counts, tie rules,
and the sum / product / equal checks of answer keys (docs/AUDIT.md, "Figures, rounding and
consistency")."""

from __future__ import annotations

import re
from fractions import Fraction as F

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distcheck.audit import audit_key, parse_key
from distcheck.audit.claim_units import _COUNT_NOUNS
from distcheck.audit.counts import (
    FRACTIONAL_COUNT_NOUNS,
    WHOLE_COUNT_NOUNS,
    is_whole_unit,
)
from distcheck.audit.figures import (
    MAX_WHOLE_COMBINATIONS,
    TIE_RULES,
    Figure,
    Span,
    check_equal,
    check_product,
    check_sum,
    span_of,
)
from distcheck.core.errors import AnswerKeyError, ConfigError

AWAY, TOWARD, EVEN = TIE_RULES
META = '[meta]\ntitle = "t"\nsource = "s"\n'


def fig(value, step=0, whole=False) -> Figure:
    return Figure(F(value), F(step), whole)


def key_checks(text: str):
    return {c.id: c for c in audit_key(parse_key(META + text, "k.toml")).checks}


def claim(cid, quantity, inputs, claimed, unit, extra=""):
    return (f'\n[[claim]]\nid = "{cid}"\nquantity = "{quantity}"\ninputs = {inputs}\nclaimed = {claimed}\n'
            f'unit = "{unit}"\n{extra}')


def check(cid, kind, parts, total=None):
    t = f'total = "{total}"\n' if total else ""
    return f'\n[[check]]\nid = "{cid}"\nkind = "{kind}"\n{t}parts = {parts}\n'


# ----------------------------------------------------------------------------- what a figure stands for


@pytest.mark.parametrize("value, step, rule, expected", [
    # 4 to the nearest unit: the tie at 3.5 goes to 4 when ties round away from zero, the tie at 4.5 to 5
    (4, 1, AWAY, Span(F(7, 2), F(9, 2), True, False)),
    (4, 1, TOWARD, Span(F(7, 2), F(9, 2), False, True)),
    (4, 1, EVEN, Span(F(7, 2), F(9, 2), True, True)),     # 4 is even: both ties are its own
    (5, 1, EVEN, Span(F(9, 2), F(11, 2), False, False)),  # 5 is odd: neither
    (0, 1, AWAY, Span(F(-1, 2), F(1, 2), False, False)),
    (-4, 1, AWAY, Span(F(-9, 2), F(-7, 2), False, True)),
    (F("31.4"), F("0.1"), EVEN, Span(F("31.35"), F("31.45"), True, True)),
    (7, 0, AWAY, Span(F(7), F(7))),
    (4, 1, None, Span(F(7, 2), F(9, 2), True, True)),    # any rule: both ends
])
def test_a_rounded_figure_stands_for_the_values_its_tie_rule_prints_as_it(value, step, rule, expected):
    assert span_of(fig(value, step), rule) == expected


def test_a_stated_rounding_must_divide_the_figure():
    with pytest.raises(ConfigError, match="rounding=1/4 must divide the printed figure 157/5"):
        Figure(F("31.4"), F(1, 4))


def test_every_count_noun_is_either_whole_or_fractional():
    assert WHOLE_COUNT_NOUNS | FRACTIONAL_COUNT_NOUNS == _COUNT_NOUNS
    assert not WHOLE_COUNT_NOUNS & FRACTIONAL_COUNT_NOUNS
    assert is_whole_unit("GPUs") and is_whole_unit("B params") and is_whole_unit("layer")
    assert not is_whole_unit("elements") and not is_whole_unit("ticks") and not is_whole_unit("GB")


# ----------------------------------------------------------------------------- sums


def test_four_plus_two_is_not_five():
    out = check_sum(fig(5), [fig(4), fig(2)])
    assert (out.consistent, out.meets, out.combined) == (False, False, Span.point(6))
    assert check_sum(fig(6), [fig(4), fig(2)]).rules == TIE_RULES


def test_four_plus_two_is_not_five_whole_gpus_even_when_each_is_rounded():
    # a count to the nearest unit is that whole number: 4 + 2 GPUs can only be 6 GPUs
    assert not check_sum(fig(5, 1, True), [fig(4, 1, True), fig(2, 1, True)]).consistent
    assert check_sum(fig(6, 1, True), [fig(4, 1, True), fig(2, 1, True)]).consistent


def test_rounded_real_figures_can_add_up_to_a_smaller_printed_total():
    # 3.6 GB + 1.6 GB = 5.2 GB: printed to whole GB that is 4 + 2 = 5, honestly
    out = check_sum(fig(5, 1), [fig(4, 1), fig(2, 1)])
    assert out.consistent and out.rules == TIE_RULES and out.combined == Span(F(5), F(7))


def test_rounded_figures_that_add_up_within_their_rounding():
    assert check_sum(fig(F("2.8"), F("0.1")), [fig(F("1.4"), F("0.1"))] * 2).consistent
    # 31.40625 + 31.40625 = 62.8125: printed 31.4 + 31.4 = 62.8
    assert check_sum(fig(F("62.8"), F("0.1")), [fig(F("31.4"), F("0.1"))] * 2).consistent
    assert not check_sum(fig(F("62.6"), F("0.1")), [fig(F("31.4"), F("0.1"))] * 2).consistent


def test_ranges_that_meet_only_at_a_tie_broken_two_ways_are_a_contradiction():
    # 1.4 + 1.4 >= 2.7 needs both parts at 1.35 (ties kept by 1.4: away or even) and the total
    # 2.6 (to 0.2) at 2.7 (a tie kept by 2.6: toward zero, or even would keep it for 2.8) -- no one rule
    out = check_sum(fig(F("2.6"), F("0.2")), [fig(F("1.4"), F("0.1"))] * 2)
    assert (out.consistent, out.meets) == (False, True)


# ----------------------------------------------------------------------------- equal


def test_the_same_value_printed_as_4_and_as_5_is_a_contradiction():
    out = check_equal([fig(4, 1), fig(5, 1)])
    assert (out.consistent, out.meets) == (False, True)  # they share only 4.5, a tie


def test_a_tie_that_only_some_rules_print_as_the_figure():
    # 4.5 exactly, printed to the nearest unit as 4: ties toward zero or to even, not away
    out = check_equal([fig(4, 1), fig(F(9, 2))])
    assert out.consistent and out.rules == (TOWARD, EVEN) and out.needs_tie_rule


def test_a_count_printed_with_decimals_that_hold_no_whole_number():
    out = check_equal([fig(F("26.7"), F("0.1"), True)])
    assert (out.consistent, out.empty) == (False, (0,))
    assert check_equal([fig(F("26.7"), F("0.1"))]).consistent  # not a count: fine


# ----------------------------------------------------------------------------- products


def test_products_of_degrees():
    assert check_product(fig(16384, 0, True), [fig(8), fig(16), fig(128)]).consistent
    assert not check_product(fig(16384, 0, True), [fig(8), fig(16), fig(64)]).consistent
    # a GPU count to the nearest thousand: 16,384 rounds to 16,000
    assert check_product(fig(16000, 1000, True), [fig(8), fig(16), fig(128)]).consistent
    assert not check_product(fig(15000, 1000, True), [fig(8), fig(16), fig(128)]).consistent


def test_rounded_whole_factors_are_enumerated_exactly():
    # 2 x ~3 (2.5..3.5 -> only 3 as a count) = 7 is impossible, though the intervals [5, 7] touch 7
    assert not check_product(fig(7, 0, True), [fig(2, 0, True), fig(3, 1, True)]).consistent
    assert check_product(fig(7, 0), [fig(2, 0), fig(3, 1)]).consistent  # 2 x 3.5, real numbers
    # ~20 (15..25 when rounded to 10) x 3 GPUs: 45..75 in steps of 3; 64 is not a multiple of 3
    assert not check_product(fig(64, 0, True), [fig(20, 10, True), fig(3, 0, True)]).consistent
    assert check_product(fig(63, 0, True), [fig(20, 10, True), fig(3, 0, True)]).consistent


def test_too_many_whole_combinations_are_refused_naming_the_limit():
    parts = [fig(10**6, 10**6, True), fig(10**6, 10**6, True)]
    with pytest.raises(ConfigError, match=f"more than {MAX_WHOLE_COMBINATIONS:,}"):
        check_product(fig(10**12, 0, True), parts)


# ----------------------------------------------------------------------------- honest rounding is never a contradiction


def _round(x: F, step: F, rule: str) -> F:
    """Round exact ``x`` to a multiple of ``step`` with ``rule`` (independent of distcheck)."""
    if step == 0:
        return x
    k = x / step
    low = k.numerator // k.denominator
    frac = k - low
    if frac > F(1, 2) or (frac == F(1, 2) and (
            (rule == AWAY and x > 0) or (rule == TOWARD and x < 0) or (rule == EVEN and low % 2 == 1))):
        low += 1
    return low * step


_steps = st.sampled_from([F(0), F(1, 10), F(1, 2), F(1), F(10)])
_values = st.fractions(min_value=0, max_value=200, max_denominator=20)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_values, _steps), min_size=1, max_size=4), _steps, st.sampled_from(TIE_RULES),
       st.booleans())
def test_figures_rounded_from_a_true_sum_are_consistent_under_their_rule(parts, total_step, rule, whole):
    if whole:  # counts: whole values, steps of at least one
        parts = [(F(round(x)), max(s, F(1)) if s else s) for x, s in parts]
        total_step = max(total_step, F(1)) if total_step else total_step
    total = sum((x for x, _ in parts), F(0))
    figures = [fig(_round(x, s, rule), s, whole) for x, s in parts]
    out = check_sum(fig(_round(total, total_step, rule), total_step, whole), figures)
    assert out.consistent and rule in out.rules


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.fractions(min_value=0, max_value=30, max_denominator=8), _steps), min_size=1,
                max_size=3), _steps, st.sampled_from(TIE_RULES))
def test_figures_rounded_from_a_true_product_are_consistent_under_their_rule(parts, total_step, rule):
    total = F(1)
    for x, _ in parts:
        total *= x
    figures = [fig(_round(x, s, rule), s) for x, s in parts]
    out = check_product(fig(_round(total, total_step, rule), total_step), figures)
    assert out.consistent and rule in out.rules


@settings(max_examples=200, deadline=None)
@given(st.fractions(min_value=0, max_value=100, max_denominator=8), st.lists(_steps, min_size=2, max_size=4),
       st.sampled_from(TIE_RULES))
def test_one_value_printed_at_several_steps_agrees_with_itself(x, steps, rule):
    out = check_equal([fig(_round(x, s, rule), s) for s in steps])
    assert out.consistent and rule in out.rules


# ----------------------------------------------------------------------------- answer keys


def test_a_key_whose_parts_do_not_add_up_names_the_figures():
    text = (claim("w", "memory.weights_bytes", "{ params = 2e9 }", 4, "GB")
            + claim("g", "memory.grads_bytes", "{ params = 1e9 }", 2, "GB")
            + claim("t", "memory.weights_bytes", "{ params = 2.5e9 }", 5, "GB")
            + claim("t6", "memory.weights_bytes", "{ params = 3e9 }", 6, "GB")
            + check("s5", "sum", '["w", "g"]', "t") + check("s6", "sum", '["w", "g"]', "t6"))
    by = key_checks(text)
    assert by["s5"].verdict == "contradiction"
    assert by["s5"].explanation == "4 GB + 2 GB = 6 GB; the total 5 GB is not"
    assert by["s6"].verdict == "consistent"


def test_a_key_of_rounded_gigabytes_that_adds_up():
    # ZeRO stage 1 at 7.5e9 params and dp = 64: 31.40625 GB, printed 31.4 (the ZeRO paper's figure)
    z1 = claim("z1", "zero.bytes_per_gpu.stage1", "{ params = 7.5e9, dp = 64 }", "31.4", "GB")
    text = (z1 + claim("z1b", "zero.bytes_per_gpu.stage1", "{ params = 7.5e9, dp = 64 }", "31.4", "GB")
            + claim("two", "zero.bytes_per_gpu.stage1", "{ params = 15e9, dp = 64 }", "62.8", "GB")
            + check("s", "sum", '["z1", "z1b"]', "two"))
    by = key_checks(text)
    assert by["s"].verdict == "consistent"
    assert by["s"].explanation == ("31.4 GB + 31.4 GB lies in [62.7 (627/10), 62.9 (629/10)] GB; "
                                   "the total 62.8 GB is within it")


def test_a_key_with_rounding_stated_still_cannot_make_whole_gpus_add_up():
    text = (claim("a", "layout.world_size", "{ tp = 4 }", 4, "GPUs", "rounding = 1\n")
            + claim("b", "layout.world_size", "{ tp = 2 }", 2, "GPUs", "rounding = 1\n")
            + claim("t", "layout.world_size", "{ tp = 5 }", 5, "GPUs", "rounding = 1\n")
            + check("s", "sum", '["a", "b"]', "t"))
    by = key_checks(text)
    assert by["s"].verdict == "contradiction"
    assert by["s"].explanation == "4 GPUs + 2 GPUs = 6 GPUs (whole numbers); the total 5 GPUs is not"


def test_an_equal_check_meeting_at_a_tie_says_so():
    text = (claim("a", "pp.bubble_fraction.gpipe", "{ p = 4, m = 4 }", 4, "%", "rounding = 1\n")
            + claim("b", "pp.bubble_fraction.gpipe", "{ p = 4, m = 5 }", 5, "%", "rounding = 1\n")
            + check("e", "equal", '["a", "b"]'))
    by = key_checks(text)
    assert by["e"].verdict == "contradiction"
    assert "meet only at a tie that no one rounding rule" in by["e"].explanation


def test_a_literal_count_part_that_is_not_whole_is_named():
    text = (claim("a", "layout.world_size", "{ tp = 4 }", 4, "GPUs")
            + claim("t", "layout.world_size", "{ tp = 5 }", 5, "GPUs")
            + check("s", "sum", '["a", 0.5]', "t"))
    by = key_checks(text)
    assert by["s"].verdict == "contradiction" and by["s"].explanation.endswith("0.5 (1/2) stands for no whole number")


def test_a_product_with_too_many_whole_combinations_is_bad_input():
    text = (claim("a", "layout.world_size", "{ tp = 1000000 }", 1000000, "GPUs", "rounding = 1000000\n")
            + claim("b", "layout.world_size", "{ tp = 1000000 }", 1000000, "GPUs", "rounding = 1000000\n")
            + claim("t", "reported.fact", "{}", 1000000000000, "GPUs")
            + check("p", "product", '["a", "b"]', "t"))
    with pytest.raises(AnswerKeyError, match=r"check 'p'.*more than 10,000 combinations"):
        key_checks(text)


@pytest.mark.parametrize("parts, claimed, message", [
    ('["a", -2]', 4, "check 'p': part -2 is negative; a product check multiplies figures >= 0"),
    ('["n", 2]', 4, "check 'p': part 'n' is negative (-2); a product check multiplies figures >= 0"),
    ('["a", 2]', -4, "check 'p': the total -4 is negative; a product check multiplies figures >= 0"),
])
def test_a_product_check_refuses_negative_figures(parts, claimed, message):
    # (a negative figure in a size or count unit is refused when the key is read; "value" figures reach the check)
    text = (claim("a", "layout.world_size", "{ tp = 2 }", 2, "GPUs")
            + claim("n", "reported.fact", "{}", -2, "value")
            + claim("t", "reported.fact", "{}", claimed, "value")
            + check("p", "product", parts, "t"))
    with pytest.raises(AnswerKeyError, match=re.escape(message)):
        key_checks(text)


# ----------------------------------------------------------------------------- bandwidth figures


def _bw_claim(cid: str, claimed: str, unit: str, time_s: str = "'1/100'", quantity: str = "comm.algbw",
              extra: str = "") -> str:
    return (f'[[claim]]\nid = "{cid}"\nquantity = "{quantity}"\n'
            f"inputs = {{ size_bytes = 1000000000, time_s = {time_s}{extra} }}\n"
            f"claimed = {claimed}\nunit = \"{unit}\"\n")


def test_two_bandwidth_claims_on_the_same_inputs_are_checked_against_each_other(tmp_path):
    """Two bandwidth claims of one quantity and inputs enter the automatic check (they exited 2 with
    "quantity_unit='bandwidth' is not a known unit"): 100 GB/s and 1e11 B/s agree, 100 and 93.1 GiB/s
    (93.13 GiB/s is 100 GB/s) agree, 100 GB/s and 101 GB/s contradict each other."""
    p = tmp_path / "bw.toml"
    p.write_text(META + _bw_claim("a", "100", "GB/s") + _bw_claim("b", '"100000000000"', "B/s")
                 + _bw_claim("c", "93.13", "GiB/s"))
    result = audit_key(parse_key(p.read_text(), str(p)))
    (auto,) = [k for k in result.checks if k.automatic and k.id.startswith("auto:a=")]
    assert auto.verdict == "consistent" and auto.claims == ("a", "b", "c")
    bad = parse_key(META + _bw_claim("a", "100", "GB/s") + _bw_claim("b", "101", "GB/s"))
    (auto,) = [k for k in audit_key(bad).checks if k.automatic]
    assert auto.verdict == "contradiction" and "a = 100 GB/s" in auto.explanation


def test_checks_on_bandwidth_claims(tmp_path):
    """[[check]] tables over bandwidth claims: equal across units, a sum (per-link bandwidths and their
    total, literal parts in the total's unit), and a product of a bandwidth and a plain factor."""
    key = (META + _bw_claim("alg", "100", "GB/s")
           + _bw_claim("bus", "175", "GB/s", quantity="comm.busbw.all_reduce", extra=", n = 8")
           + _bw_claim("half", "50", "GB/s", time_s="'1/50'")
           + '[[check]]\nid = "eq"\nkind = "equal"\nparts = ["alg", "half"]\nexpect = "contradiction"\n'
           + '[[check]]\nid = "sum"\nkind = "sum"\ntotal = "alg"\nparts = ["half", 50]\n'
           + '[[check]]\nid = "bad_sum"\nkind = "sum"\ntotal = "alg"\nparts = ["half", 49]\n'
           + '[[check]]\nid = "busbw"\nkind = "product"\ntotal = "bus"\nparts = ["alg", 1.75]\n')
    checks = {k.id: k for k in audit_key(parse_key(key)).checks}
    assert {i: checks[i].verdict for i in ("eq", "sum", "bad_sum", "busbw")} == {
        "eq": "contradiction", "sum": "consistent", "bad_sum": "contradiction", "busbw": "consistent"}
    assert "GB/s" in checks["sum"].explanation


def test_base_unit_of_every_family():
    from distcheck.audit.claim_units import base_unit, unit_factor

    assert [base_unit(u) for u in ("GB", "GiB/s", "B/s", "%", "M tokens", "B/param", "flag", "value")] == [
        "bytes", "bytes_per_second", "bytes_per_second", "fraction", "tokens", "bytes_per_param", "flag", "value"]
    assert unit_factor(base_unit("GB/s"), "GB/s") == 10**9
    with pytest.raises(ConfigError, match="unit='parsecs' is not a known unit"):
        base_unit("parsecs")


# ----------------------------------------------------------------------------- claims that contradict each other


def _busbw_key(*claims: tuple[str, str, str], checks: str = "") -> str:
    """A key of all-gather busbw claims on 1e9 bytes in 0.01 s (printed: +-0.005 s) over 8 ranks."""
    out = META
    for cid, claimed, rounding in claims:
        out += _bw_claim(cid, claimed, "GB/s", time_s="0.01", quantity="comm.busbw.all_gather", extra=", n = 8")
        out += f"rounding = {rounding}\n" if rounding else ""
    return out + checks


def test_two_busbw_claims_that_hold_only_through_different_times_cannot_both_hold(tmp_path, capsys):
    """busbw = 87.5 GB/s (the value at the printed 0.01 s) and "busbw = algbw = 100 GB/s" (which 0.01 +-0.005 s
    also allows, at t = 7/804 to 7/796 s) both held, while the automatic same-inputs check called them a
    contradiction. They cannot both be right: each is `ambiguous`, naming the time that makes each hold and the
    contradiction, and the audit exits 1 with or without --strict."""
    from distcheck import cli
    from distcheck.audit import audit_exit_code, audit_file, render
    from distcheck.audit.report import to_dict

    p = tmp_path / "busbw.toml"
    p.write_text(_busbw_key(("ag", "87.5", ""), ("eq", "100", "1")))
    result = audit_file(p)
    v = {c.claim.id: c for c in result.claims}
    assert {i: c.verdict for i, c in v.items()} == {"ag": "ambiguous", "eq": "ambiguous"}
    assert v["ag"].contradicts == [{"check": "auto:ag=eq", "claims": ("eq",), "was": "holds"}]
    assert v["eq"].contradicts == [{"check": "auto:ag=eq", "claims": ("ag",), "was": "holds-through-input-rounding"}]
    assert v["ag"].rounding.inputs[0].holds_for == (F(35, 3502), F(35, 3498))   # 87.5 +- 0.05 GB/s = 0.875e9 / t
    assert v["eq"].rounding.inputs[0].holds_for == (F(7, 804), F(7, 796))       # 100 +- 0.5 GB/s
    settle = ("time_s decides: ag holds for time_s from 0.00999428898 (35/3502) to 0.0100057176 (35/3498) s "
              "(the printed 0.01 (1/100) included); eq holds for time_s from 0.00870646766 (7/804) to "
              "0.00879396985 (7/796) s (nearest 0.00879396985 (7/796) s, -12.1% from the printed 0.01 (1/100)")
    (auto,) = result.checks
    assert auto.verdict == "contradiction" and settle in auto.explanation
    assert "but it contradicts eq, which also holds (check auto:ag=eq): they cannot all hold; " + settle \
        in v["ag"].explanation
    assert "but it contradicts ag, which also holds (check auto:ag=eq)" in v["eq"].explanation
    # every report shows it next to both claims
    md = render(result, "markdown")
    assert md.count("**ambiguous**") == 2 and md.count("(check auto:ag=eq)") == 2
    claims = {c["id"]: c for c in to_dict(result)["claims"]}
    assert claims["eq"]["contradicts"] == [{"check": "auto:ag=eq", "claims": ["ag"], "was":
                                            "holds-through-input-rounding"}]
    assert claims["eq"]["input_rounding"]["inputs"][0]["holds_for"][0]["exact"] == "7/804"
    assert "but it contradicts ag" in render(result, "table")
    assert audit_exit_code(result) == 1 and audit_exit_code(result, strict=True) == 1
    assert cli.main(["audit", str(p)]) == 1 and cli.main(["audit", str(p), "--strict"]) == 1
    capsys.readouterr()


def test_an_explicit_equal_check_over_the_same_claims_resolves_them_too():
    key = _busbw_key(("ag", "87.5", ""), ("eq", "100", "1"),
                     checks='[[check]]\nid = "same"\nkind = "equal"\nparts = ["ag", "eq"]\nexpect = "contradiction"\n')
    result = audit_key(parse_key(key))
    assert [k.id for k in result.checks] == ["same"]  # it replaces the automatic check
    assert [c.verdict for c in result.claims] == ["ambiguous", "ambiguous"]
    assert "time_s decides" in result.checks[0].explanation


def test_claims_that_agree_or_fail_are_left_alone():
    """100 GB/s (+-0.5) and 100.2 GB/s (+-0.05) both need t near 7/800 s: they agree and both hold through the
    rounding; beside 87.5 GB/s, a figure no time within 0.01 +-0.005 s gives (200 GB/s, over the span's 175) is
    wrong, and the contradiction leaves the one that holds alone."""
    result = audit_key(parse_key(_busbw_key(("a", "100", "1"), ("b", '"100.2"', ""))))
    assert [c.verdict for c in result.claims] == ["holds-through-input-rounding"] * 2
    assert [k.verdict for k in result.checks] == ["consistent"]
    result = audit_key(parse_key(_busbw_key(("a", "87.5", ""), ("b", "200", "1"))))
    assert [c.verdict for c in result.claims] == ["holds", "wrong"]
    assert [k.verdict for k in result.checks] == ["contradiction"] and not result.claims[0].contradicts


def test_two_figures_that_meet_only_at_a_tie_cannot_both_hold():
    """4.5e9 bytes in 1 s is 4.5 GB/s: printed as 4 and as 5 (each to the nearest unit), each holds (both ends of
    a figure are closed), but no one tie rule prints 4.5 as both. Both were `holds`; the tie rule decides."""
    key = META + "".join(
        f'[[claim]]\nid = "{i}"\nquantity = "comm.algbw"\ninputs = {{ size_bytes = 4500000000, time_s = 1 }}\n'
        f'claimed = {c}\nunit = "GB/s"\nrounding = 1\n' for i, c in (("four", 4), ("five", 5)))
    result = audit_key(parse_key(key))
    assert [c.verdict for c in result.claims] == ["ambiguous", "ambiguous"]
    assert "the tie rule the source rounded with decides: four holds at the printed inputs, read exactly; five " \
        "holds at the printed inputs, read exactly" in result.checks[0].explanation
