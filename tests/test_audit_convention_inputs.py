"""Convention inputs and unit bridges: inputs a quantity's formula does not take, read only by its
documented conventions (``Quantity.convention_inputs``), and a figure in bytes of a quantity in elements
(``distcheck.audit.claim_units.UNIT_BRIDGES``).

The case: the ZeRO paper (Rajbhandari et al. 2020, section 7) counts 2 Psi elements per rank for DDP and
ZeRO stages 1 and 2, 3 Psi for stage 3 (``zero.comm_elements_per_rank.*``, no world size). On a ring of
n ranks each rank moves (n-1)/n of that (nccl-tests doc/PERFORMANCE.md): at Psi = 1e9 and n = 8,
1.75e9 elements for DDP, 3.5 GB at 2 bytes per element. A claim giving n is read under that convention."""

from __future__ import annotations

from fractions import Fraction

import pytest

from distcheck.audit import audit_key, parse_key
from distcheck.audit.claim_units import bridge_between, bridged_factor
from distcheck.audit.quantities import get_quantity, list_quantities
from distcheck.audit.report import render_quantity_list
from distcheck.core.errors import AnswerKeyError, ConfigError

RING = "ring factor (n-1)/n kept (nccl-tests): (n-1)/n of the paper's count per rank, on a ring of n"
META = '[meta]\ntitle = "t"\nsource = "s"\n'


def verdict(quantity: str, inputs: str, claimed, unit: str):
    text = (f'{META}\n[[claim]]\nid = "a"\nquantity = "{quantity}"\ninputs = {inputs}\nclaimed = {claimed}\n'
            f'unit = "{unit}"\n')
    (v,) = audit_key(parse_key(text, "k.toml")).claims
    return v


@pytest.mark.parametrize("quantity, inputs, claimed, unit, value", [
    ("zero.comm_elements_per_rank.ddp", "{ params = 1e9, n = 8 }", "1.75e9", "elements", Fraction(175 * 10**7)),
    ("zero.comm_elements_per_rank.stage2", "{ params = 1e9, n = 8 }", "1.75e9", "elements", Fraction(175 * 10**7)),
    ("zero.comm_elements_per_rank.stage3", "{ params = 1e9, n = 8 }", "2.625e9", "elements", Fraction(2625 * 10**6)),
    # in bytes: 2 bytes per element by default, or the claim's bytes_per_element
    ("zero.comm_elements_per_rank.ddp", "{ params = 1e9, n = 8 }", "3.5", "GB", Fraction(7, 2)),
    ("zero.comm_elements_per_rank.ddp", "{ params = 1e9, n = 8, bytes_per_element = 4 }", 7, "GB", Fraction(7)),
    ("zero.comm_elements_per_rank.stage3", "{ params = 1e9, n = 8 }", "5.25", "GB", Fraction(21, 4)),
])
def test_a_correct_ring_factor_figure_holds_under_the_named_ring_convention(quantity, inputs, claimed, unit, value):
    v = verdict(quantity, inputs, claimed, unit)
    assert v.verdict == "holds-under-another-convention", v.explanation
    assert v.convention == RING and RING in v.explanation
    assert v.alternatives == [{"convention": RING, "value": value, "unit": unit}]
    assert v.inputs["n"] == "8"  # the convention input is shown with the claim's inputs


@pytest.mark.parametrize("quantity, inputs, claimed, unit, computed", [
    ("zero.comm_elements_per_rank.ddp", "{ params = 1e9, n = 8 }", "2e9", "elements", Fraction(2 * 10**9)),
    ("zero.comm_elements_per_rank.stage3", "{ params = 1e9, n = 8 }", "3e9", "elements", Fraction(3 * 10**9)),
    # the paper's count in bytes: 2 Psi x 2 bytes (the default), 2 Psi x 4 bytes
    ("zero.comm_elements_per_rank.ddp", "{ params = 1e9, n = 8 }", 4, "GB", Fraction(4)),
    ("zero.comm_elements_per_rank.ddp", "{ params = 1e9, bytes_per_element = 4 }", 8, "GB", Fraction(8)),
])
def test_the_papers_count_holds_with_n_given_and_in_bytes(quantity, inputs, claimed, unit, computed):
    v = verdict(quantity, inputs, claimed, unit)
    assert v.verdict == "holds", v.explanation
    assert v.computed_in_unit == computed


@pytest.mark.parametrize("inputs, claimed, unit", [
    ("{ params = 1e9, n = 8 }", "1.5e9", "elements"),   # neither 2e9 nor 1.75e9
    ("{ params = 1e9, n = 8 }", 3, "GB"),               # neither 4 GB nor 3.5 GB
    ("{ params = 1e9, n = 4 }", "1.75e9", "elements"),  # the ring figure of n = 8, at n = 4 (1.5e9)
])
def test_a_figure_wrong_under_both_readings_stays_wrong(inputs, claimed, unit):
    v = verdict("zero.comm_elements_per_rank.ddp", inputs, claimed, unit)
    assert v.verdict == "wrong", v.explanation
    assert "no documented convention reproduces it" in v.explanation
    assert v.alternatives and v.alternatives[0]["convention"].startswith(RING)  # the closest reading tried, named


def test_without_n_the_ring_reading_is_not_tried_and_the_claim_reads_as_before():
    with_n = verdict("zero.comm_elements_per_rank.ddp", "{ params = 1e9, n = 8 }", "1.75e9", "elements")
    without = verdict("zero.comm_elements_per_rank.ddp", "{ params = 1e9 }", "1.75e9", "elements")
    assert with_n.verdict == "holds-under-another-convention"
    assert without.verdict == "wrong" and without.alternatives == [] and without.convention is None
    assert without.computed == 2 * 10**9 and "n" not in without.inputs
    assert verdict("zero.comm_elements_per_rank.ddp", "{ params = 1e9 }", "2e9", "elements").verdict == "holds"


def test_convention_inputs_are_declared_and_validated_like_inputs():
    q = get_quantity("zero.comm_elements_per_rank.stage3")
    assert q.input_names == ("params",) and q.convention_input_names == ("n", "bytes_per_element")
    listed = {d["name"]: d for d in list_quantities()}["zero.comm_elements_per_rank.stage3"]
    assert [i["name"] for i in listed["convention_inputs"]] == ["n", "bytes_per_element"]
    row = next(r for r in render_quantity_list("markdown").splitlines()
               if r.startswith("| `zero.comm_elements_per_rank.stage3`"))
    assert "params [params], model; for conventions: n [GPUs], bytes_per_element=2 [bytes]" in row
    with pytest.raises(AnswerKeyError, match="inputs.n"):
        verdict("zero.comm_elements_per_rank.ddp", "{ params = 1e9, n = 0 }", "1.75e9", "elements")
    # a quantity without the convention input still refuses it, and a bridge needs its input declared
    with pytest.raises(AnswerKeyError, match="'n' is not an input"):
        verdict("zero.bytes_per_gpu.stage0", "{ params = 1e9, n = 8 }", 16, "GB")
    with pytest.raises(AnswerKeyError, match="cannot measure"):
        verdict("tp.comm_elements_per_layer", "{ s = 2048, b = 1, h = 4096, t = 8 }", 1, "GB")


def test_the_bridge_converts_both_ways_exactly():
    assert bridge_between("elements", "GB") is not None and bridge_between("bytes", "M elements") is not None
    assert bridge_between("elements", "tokens") is None and bridge_between("bytes", "GB") is None
    assert bridged_factor("elements", "GB", Fraction(2)) == Fraction(10**9, 2)      # 1e9 elements = 2 GB
    assert bridged_factor("bytes", "M elements", Fraction(2)) == Fraction(2 * 10**6)  # 2e6 bytes = 1 M elements
    with pytest.raises(ConfigError, match="bytes_per_element"):
        bridged_factor("elements", "GB", Fraction(0))
    with pytest.raises(ConfigError, match="no declared bridge"):
        bridged_factor("elements", "GB/s", Fraction(2))
