"""A quantity's own constraints (distcheck.audit.constraints): a claim outside them is not-checkable,
with the constraint named; constraints are declared data of a quantity, listed with it."""

from __future__ import annotations

from fractions import Fraction as F

import pytest

from distcheck.audit import audit_key, get_quantity, list_quantities, parse_key
from distcheck.audit.constraints import (
    INTERLEAVED_M_DIVISIBLE_BY_P,
    Constraint,
    broken,
    declared_for,
)
from distcheck.audit.quantity import Quantity, QuantityInput
from distcheck.core.errors import ConfigError

META = '[meta]\ntitle = "t"\nsource = "s"\n'


def _verdict(quantity: str, inputs: str, claimed: str, unit: str = "fraction"):
    text = (META + f'[[claim]]\nid = "a"\nquantity = "{quantity}"\ninputs = {inputs}\nclaimed = {claimed}\n'
            f'unit = "{unit}"\n')
    (v,) = audit_key(parse_key(text)).claims
    return v


def test_interleaved_at_m6_p4_is_not_checkable_with_the_constraint_named():
    """m = 6 over p = 4: the interleaved formula gives (1/v)(p-1)/m ... = 1/5, which "held" for a figure of 1/5,
    but Megatron-LM's interleaved schedule refuses m not divisible by p: no schedule has that bubble."""
    v = _verdict("pp.bubble_fraction.interleaved", "{ p = 4, m = 6, v = 2 }", '"1/5"')
    assert v.verdict == "not-checkable" and v.computed is None
    assert "m % p == 0" in v.explanation and "Megatron-LM" in v.explanation and "m=6, p=4" in v.explanation
    # inside the constraint the same quantity is judged as before
    assert _verdict("pp.bubble_fraction.interleaved", "{ p = 4, m = 8, v = 2 }", '"3/19"').verdict == "holds"


@pytest.mark.parametrize("quantity, inputs, named", [
    ("pp.step_ticks.interleaved", "{ p = 4, m = 6, v = 2 }", "m % p == 0"),
    ("pp.idle_ticks.interleaved", "{ p = 4, m = 8, v = 1 }", "v >= 2"),
    ("pp.bubble_ticks.interleaved_zb", "{ p = 4, m = 2, v = 2 }", "m >= p"),
])
def test_every_interleaved_quantity_declares_its_constraints(quantity, inputs, named):
    unit = get_quantity(quantity).unit
    v = _verdict(quantity, inputs, "1", unit)
    assert v.verdict == "not-checkable" and named in v.explanation


def test_constraints_are_listed_with_their_quantity():
    listed = {q["name"]: q for q in list_quantities()}
    req = listed["pp.bubble_fraction.interleaved"]["requires"]
    assert [r["constraint"] for r in req] == [
        "v >= 2 (an interleaved schedule places at least two model chunks on each rank)",
        INTERLEAVED_M_DIVISIBLE_BY_P.text]
    assert all(r["source"] for q in listed.values() for r in q["requires"])
    assert listed["pp.bubble_fraction.gpipe"]["requires"] == []


def test_any_quantity_can_declare_a_constraint():
    even = Constraint("n is even", "a test", ("n",), lambda v: v["n"] % 2 == 0)
    q = Quantity("test.half", "count", "a test", "n / 2", (QuantityInput("n", "n", "count"),),
                 lambda v: v["n"] / 2, requires=(even,))
    assert broken(q.requires, {"n": F(3)}) == [even] and broken(q.requires, {"n": F(4)}) == []
    assert broken(q.requires, {}) == []  # a missing input is not tested here: the claim needs it anyway
    assert declared_for("pp.step_ticks.1f1b", ("p", "m")) == ()
    with pytest.raises(ConfigError, match="name=1 must be a quantity name"):
        declared_for(1, ())  # type: ignore[arg-type]
