"""Counts are whole numbers: a count the closed forms compute as a fraction holds no figure, and
the audit names the uneven split (docs/AUDIT.md, "Counts are whole numbers")."""

from __future__ import annotations

from fractions import Fraction

import pytest

from distcheck.audit import audit_key, parse_key
from distcheck.audit import conventions as conv
from distcheck.audit.counts import uneven_split

META = '[meta]\ntitle = "t"\nsource = "s"\n'


def verdict(quantity: str, inputs: str, claimed, unit: str, extra: str = ""):
    text = (f'{META}\n[[claim]]\nid = "a"\nquantity = "{quantity}"\ninputs = {inputs}\nclaimed = {claimed}\n'
            f'unit = "{unit}"\n{extra}')
    (v,) = audit_key(parse_key(text, "k.toml")).claims
    return v


@pytest.mark.parametrize("quantity, inputs, claimed, unit, extra, split", [
    # 80/3 = 26.67 layers per stage: "27" to the nearest layer used to hold
    ("pp.layers_per_stage.even", "{ num_layers = 80, p = 3 }", 27, "layers", "rounding = 1\n",
     "num_layers=80 over p=3 is uneven: 27 + 27 + 26"),
    ("pp.layers_per_stage.even", "{ num_layers = 80, p = 3 }", '"~27"', "layers", "",
     "num_layers=80 over p=3 is uneven: 27 + 27 + 26"),
    ("attention.heads_per_rank", "{ num_heads = 100, tp = 16 }", '"~6"', "heads", "",
     "num_heads=100 over tp=16 is uneven: 4 x 7 + 12 x 6"),
    # even a figure equal to the fraction: 2.5 groups is no number of groups
    ("layout.num_groups", "{ world_size = 10, degree = 4 }", '"2.5"', "groups", "",
     "world_size=10 over degree=4 is uneven: 3 + 3 + 2 + 2"),
    ("layout.nodes_per_replica", "{ tp = 4, pp = 1 }", 1, "nodes", "rounding = 1\n",
     "tp*pp=4 over gpus_per_node=8 is 1/2, less than one"),
])
def test_a_count_computed_as_a_fraction_is_wrong_and_names_the_split(quantity, inputs, claimed, unit, extra, split):
    v = verdict(quantity, inputs, claimed, unit, extra)
    assert v.verdict == "wrong"
    assert f"counts whole {unit}: {split};" in v.explanation
    assert "cannot count it" in v.explanation


def test_an_even_split_holds():
    v = verdict("pp.layers_per_stage.even", "{ num_layers = 80, p = 4 }", 20, "layers")
    assert (v.verdict, v.computed) == ("holds", 20)


def test_elements_are_averages_and_may_be_fractional():
    # ring all-reduce over t = 3: 8 s b h (t-1)/t = 16/3 elements per rank, a fraction, and fine
    v = verdict("tp.comm_elements_per_layer", "{ s = 1, b = 1, h = 1, t = 3 }", "5.33", "elements")
    assert (v.verdict, v.computed) == ("holds", Fraction(16, 3))


def test_a_convention_giving_an_uneven_count_reproduces_nothing(monkeypatch):
    # a documented variant that changed p to 3 would give 80/3 ~ 27: it must not make "27" hold
    axis = conv.Axis("stages", (conv.Variant("three stages", "p = 3", set={"p": Fraction(3)}),))
    monkeypatch.setattr(conv, "axes_for", lambda quantity, unit, inputs: [axis])
    v = verdict("pp.layers_per_stage.even", "{ num_layers = 80, p = 4 }", 27, "layers", "rounding = 1\n")
    assert v.verdict == "wrong" and "three stages" not in v.explanation
    # the same variant reproducing a whole count does
    v = verdict("pp.layers_per_stage.even", "{ num_layers = 81, p = 4 }", 27, "layers")
    assert (v.verdict, v.convention) == ("holds-under-another-convention", "three stages")


def test_uneven_split_without_a_known_share_says_not_whole():
    assert uneven_split("params.linear", {}, Fraction(7, 2)) == "7/2 is not a whole number"
