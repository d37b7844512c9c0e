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


def _verdict(inputs: str, claimed: str, unit: str = "GB/s", quantity: str = "comm.algbw"):
    text = (META + f'[[claim]]\nid = "a"\nquantity = "{quantity}"\ninputs = {inputs}\nclaimed = {claimed}\n'
            f'unit = "{unit}"\n')
    (v,) = audit_key(parse_key(text)).claims
    return v


def test_a_bandwidth_from_a_time_printed_to_five_significant_digits_holds():
    """nccl-tests computes busbw from the measured time and prints both rounded: 1e9 bytes in 0.012346 s
    (5 significant digits) over 8 ranks is 141.7463 GB/s at the printed time, but any time from 0.0123455 to
    0.0123465 s printed so, and 141.7500 GB/s is in [141.7406, 141.7521]. It was `wrong`, compared as exact."""
    v = _verdict("{ size_bytes = 1000000000, time_s = 0.012346, n = 8 }", '"141.7500"',
                 quantity="comm.busbw.all_reduce")
    assert v.verdict == "holds", v.explanation
    assert v.computed == F(10**9) / F("0.012346") * F(7, 4)  # the value at the printed inputs is still reported
    assert "time_s = 0.012346 +-5e-07" in v.explanation
    # the interval is what the digits imply, no wider: 141.7600 is outside it
    assert _verdict("{ size_bytes = 1000000000, time_s = 0.012346, n = 8 }", '"141.7600"',
                    quantity="comm.busbw.all_reduce").verdict == "wrong"


# S / t over t in [0.01245, 0.01255] (0.0125 printed): the greatest algbw is S / 0.01245, which is exactly
# 20.005 GB/s for S = 249,062,250 bytes, the lower end of what 20.01 GB/s (+-0.005) stands for
@pytest.mark.parametrize("size, verdict", [
    (249_062_250, "holds"),   # the span's end is exactly the figure's end: both ends closed, they meet
    (249_062_251, "holds"),   # one byte more: just inside
    (249_062_249, "wrong"),   # one byte less: just outside (by 80 B/s)
])
def test_the_edge_of_the_interval(size, verdict):
    v = _verdict(f"{{ size_bytes = {size}, time_s = 0.0125 }}", "20.01")
    assert v.verdict == verdict, v.explanation
    assert "time_s = 0.0125 (1/80) +-5e-05" in v.explanation


@pytest.mark.parametrize("size, verdict", [
    # the least algbw is S / 0.01255: 19.845 GB/s exactly for S = 249,054,750, the upper end of 19.84 (+-0.005)
    (249_054_750, "holds"), (249_054_749, "holds"), (249_054_751, "wrong"),
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
