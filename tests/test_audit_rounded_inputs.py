"""Inputs printed with precision (docs/AUDIT.md, "Inputs printed with precision"): a claim whose real-valued
inputs are rounded at their last printed digit is judged over the interval those digits imply, in exact
interval arithmetic, both ends included; the edges are tested at, just inside and just outside the end."""

from __future__ import annotations

from fractions import Fraction as F

import pytest

from distcheck.audit import audit_key, parse_key
from distcheck.audit.key_values import input_step
from distcheck.audit.rounded_inputs import meets as _meets

META = '[meta]\ntitle = "t"\nsource = "s"\n'


def _verdict(inputs: str, claimed: str, unit: str = "GB/s", quantity: str = "comm.algbw", extra: str = ""):
    text = (META + f'[[claim]]\nid = "a"\nquantity = "{quantity}"\ninputs = {inputs}\nclaimed = {claimed}\n'
            f'unit = "{unit}"\n{extra}')
    (v,) = audit_key(parse_key(text)).claims
    return v


def test_a_bandwidth_from_a_time_printed_to_five_significant_digits_holds_through_its_rounding():
    """nccl-tests computes busbw from the measured time and prints both rounded: 1e9 bytes in 0.012346 s
    (5 significant digits) over 8 ranks is 141.7463 GB/s at the printed time, but any time from 0.0123455 to
    0.0123465 s printed so, and 141.7500 GB/s is in [141.7406, 141.7521]. It was `wrong`, compared as exact;
    it holds, but not at the printed time: the verdict says so and names the times that make it hold."""
    v = _verdict("{ size_bytes = 1000000000, time_s = 0.012346, n = 8 }", '"141.7500"',
                 quantity="comm.busbw.all_reduce")
    assert v.verdict == "holds-through-input-rounding", v.explanation
    assert v.computed == F(10**9) / F("0.012346") * F(7, 4)  # the value at the printed inputs is still reported
    assert "time_s = 0.012346 +-5e-07" in v.explanation
    # busbw = 1.75e9 B / t: 141.75005 GB/s at t = 1.75 / 141.75005 s, 141.74995 GB/s at 1.75 / 141.74995 s
    (r,) = v.rounding.inputs
    assert r.name == "time_s" and r.unit == "s" and r.printed == F("0.012346") and r.half_step == F(5, 10**7)
    assert r.holds_for == (F("1.75") / F("141.75005"), F("1.75") / F("141.74995"))
    assert r.nearest == F("1.75") / F("141.74995")
    assert r.relative == r.nearest / F("0.012346") - 1 and -F(26, 10**6) < r.relative < -F(25, 10**6)
    assert "nearest 0.0123456834 s, -0.00256% from the printed 0.012346" in v.explanation
    # the interval is what the digits imply, no wider: 141.7600 is outside it
    assert _verdict("{ size_bytes = 1000000000, time_s = 0.012346, n = 8 }", '"141.7600"',
                    quantity="comm.busbw.all_reduce").verdict == "wrong"


# S / t over t in [0.01245, 0.01255] (0.0125 printed): the greatest algbw is S / 0.01245, which is exactly
# 20.005 GB/s for S = 249,062,250 bytes, the lower end of what 20.01 GB/s (+-0.005) stands for
@pytest.mark.parametrize("size, verdict", [
    # the span's end is exactly the figure's end: both ends closed, they meet (at t = 0.01245 s only)
    (249_062_250, "holds-through-input-rounding"),
    (249_062_251, "holds-through-input-rounding"),   # one byte more: just inside
    (249_062_249, "wrong"),                          # one byte less: just outside (by 80 B/s)
])
def test_the_edge_of_the_interval(size, verdict):
    v = _verdict(f"{{ size_bytes = {size}, time_s = 0.0125 }}", "20.01")
    assert v.verdict == verdict, v.explanation
    assert "time_s = 0.0125 (1/80) +-5e-05" in v.explanation


@pytest.mark.parametrize("size, verdict", [
    # the least algbw is S / 0.01255: 19.845 GB/s exactly for S = 249,054,750, the upper end of 19.84 (+-0.005)
    (249_054_750, "holds-through-input-rounding"), (249_054_749, "holds-through-input-rounding"),
    (249_054_751, "wrong"),
])
def test_the_other_edge_of_the_interval(size, verdict):
    assert _verdict(f"{{ size_bytes = {size}, time_s = 0.0125 }}", "19.84").verdict == verdict


def test_meets_is_closed_at_both_ends():
    assert _meets((F(1), F(2)), F(3), F(2))            # [1, 2] and [2, 4] touch at 2
    assert _meets((F(4), F(5)), F(3), F(2))            # [4, 5] and [2, 4] touch at 4
    assert not _meets((F(1), F(2) - F(1, 10**30)), F(3), F(2))
    assert not _meets((F(4) + F(1, 10**30), F(5)), F(3), F(2))
    assert not _meets(None, F(3), F(2))


def test_which_inputs_carry_printed_precision():
    assert input_step(0.012346, "positive", "s") == F(1, 10**6)
    assert input_step(1.2345e-3, "positive", "s") == F(1, 10**7)
    assert input_step("80.5 GB", "positive", "bytes") == F(10**8)
    assert input_step("80 GB", "positive", "bytes") == 0           # a whole number in full: exact
    assert input_step("1/80", "positive", "s") == 0                # a ratio: exact
    assert input_step("@other", "positive", "bytes") == 0          # the source's own number
    assert input_step(7.5e9, "positive_integer", "params") == 0    # counts and sizes: the whole numbers used
    # an exact time written as a ratio is judged exactly: 20.01 at 249,062,250 bytes over 1/80 s is wrong
    assert _verdict('{ size_bytes = 249062250, time_s = "1/80" }', "20.01").verdict == "wrong"


# ----------------------------------------------------------------------------- holds only through the rounding


def test_a_claim_that_holds_only_at_the_edge_of_an_input_says_which_value():
    """249,062,250 bytes in 0.0125 s is 19.925 GB/s; 20.01 GB/s (+-0.005) needs the time at the very end of
    what 0.0125 (+-0.00005) stands for: 0.01245 s exactly, 0.4% below the printed time."""
    v = _verdict("{ size_bytes = 249062250, time_s = 0.0125 }", "20.01")
    assert v.verdict == "holds-through-input-rounding"
    assert v.computed_in_unit == F("19.92498")
    assert v.rounding.at_printed is False and v.rounding.joint == ()
    (r,) = v.rounding.inputs
    assert r.holds_for == (F("0.01245"), F("0.01245")) and r.nearest == F("0.01245") and r.relative == F(-4, 1000)
    assert "it holds with time_s = 0.01245 s (nearest 0.01245 s, -0.4% from the printed 0.0125 (1/80); its " \
        "rounding allows +-0.4%)" in v.explanation


def test_a_claim_that_holds_at_the_printed_inputs_is_not_marked():
    """A figure that holds at the printed inputs keeps `holds`; its reading still gives the times at which it
    holds (an interval around the printed one), for a contradiction to name."""
    v = _verdict("{ size_bytes = 1000000000, time_s = 0.01, n = 8 }", "87.5", quantity="comm.busbw.all_gather")
    assert v.verdict == "holds" and "rounding" not in v.explanation
    (r,) = v.rounding.inputs
    assert v.rounding.at_printed and r.holds_for == (F(35, 3502), F(35, 3498)) and r.relative == 0


def test_the_busbw_claim_that_equals_algbw_holds_only_through_the_rounding_of_the_time():
    """busbw of an all-gather of 1e9 bytes in 0.01 s on 8 ranks is 87.5 GB/s; "busbw = algbw = 100 GB/s" holds
    only for t in [7/804, 7/796] s (100 +- 0.5 GB/s = 0.875e9 / t), 12.1% below the printed 0.01 s, which
    0.01 (+-0.005) allows. It was a plain `holds`, indistinguishable from a figure right at the printed time."""
    v = _verdict("{ size_bytes = 1000000000, time_s = 0.01, n = 8 }", "100", quantity="comm.busbw.all_gather",
                 extra="rounding = 1\n")
    assert v.verdict == "holds-through-input-rounding", v.explanation
    (r,) = v.rounding.inputs
    assert r.holds_for == (F(7, 804), F(7, 796)) and r.nearest == F(7, 796) and r.relative == F(-24, 199)
    assert "time_s from 0.00870646766 (7/804) to 0.00879396985 (7/796) s" in v.explanation
    assert "-12.1% from the printed 0.01 (1/100); its rounding allows +-50%" in v.explanation


def test_two_rounded_inputs_that_must_move_together():
    """1e9 parameters at 16.5 B/param (+-0.05) plus 10.5 GB (+-0.05 GB) of activations is 27 GB, and the printed
    precision spans [26.9, 27.1] GB; 27.09 GB (+-0.005) needs both: either alone reaches 27.05 GB. The reading
    gives a joint point, at which the figure holds."""
    v = _verdict('{ params = 1000000000, bytes_per_param = 16.5, activation_bytes = "10.5 GB" }', "27.09",
                 unit="GB", quantity="memory.state_plus_activations_bytes")
    assert v.verdict == "holds-through-input-rounding", v.explanation
    assert [r.name for r in v.rounding.inputs] == ["bytes_per_param", "activation_bytes"]
    assert all(r.holds_for is None for r in v.rounding.inputs)
    point = dict(v.rounding.joint)
    assert set(point) == {"bytes_per_param", "activation_bytes"}
    assert F("16.45") <= point["bytes_per_param"] <= F("16.55")
    assert F("10.45e9") <= point["activation_bytes"] <= F("10.55e9")
    assert abs(point["bytes_per_param"] * 10**9 + point["activation_bytes"] - F("27.09e9")) <= F("0.005e9")
    assert "no one input alone, but bytes_per_param and activation_bytes together, e.g. bytes_per_param = " \
        "16.5425 (6617/400) bytes_per_param (+0.258% from the printed 16.5 (33/2))" in v.explanation


def test_a_convention_that_holds_only_through_the_rounding_says_so():
    """The in-network all-reduce reads busbw as (n-1)/(n+1) algbw: 1e9 bytes in 0.01 s on 8 ranks is 77.78 GB/s
    there; 80 GB/s (+-0.5) needs t = 7/9 / (80 +- 0.5) s, in [14/1449, 14/1431] s. Not a plain match of the
    convention."""
    v = _verdict("{ size_bytes = 1000000000, time_s = 0.01, n = 8 }", "80", quantity="comm.busbw.all_reduce",
                 extra="rounding = 1\n")
    assert v.verdict == "holds-under-another-convention" and "in-network" in v.convention
    (r,) = v.rounding.inputs
    assert r.holds_for == (F(14, 1449), F(14, 1431))
    assert "at the printed inputs it does not: only through their rounding" in v.explanation
    (alt,) = v.alternatives
    assert alt["rounding"] is v.rounding


def test_the_exit_code_of_a_claim_that_holds_through_the_rounding(tmp_path, capsys):
    """Decided (the report names what it needs): exit 0, with --strict too; a golden that expects `holds` for it
    fails, one that expects holds-through-input-rounding passes."""
    from distcheck import cli
    from distcheck.audit import audit_exit_code
    from distcheck.golden import verify

    text = (META + '[[claim]]\nid = "g.bw"\nquantity = "comm.busbw.all_gather"\n'
            'inputs = { size_bytes = 1000000000, time_s = 0.01, n = 8 }\nclaimed = 100\nunit = "GB/s"\nrounding = 1\n'
            'section = "s"\nexpect = "{expect}"\n')
    p = tmp_path / "k.toml"
    p.write_text(text.replace("{expect}", "holds"))
    assert audit_exit_code(audit_key(parse_key(p.read_text())), strict=True) == 0
    assert cli.main(["audit", str(p), "--strict"]) == 0
    capsys.readouterr()
    (row,) = verify(p)
    assert row.verdict == "FAIL" and "holds-through-input-rounding" in row.detail
    p.write_text(text.replace("{expect}", "holds-through-input-rounding"))
    (row,) = verify(p)
    assert row.verdict == "pass"
