"""Pipeline properties (the pp package's, through distcheck.props) and the lesson's pinned bubbles."""

from fractions import Fraction

import pytest

from distcheck import strategies as ds
from distcheck.core.errors import PropertyFailure
from distcheck.mutants import bubble_ratio_as_fraction
from distcheck.parallel.pp import properties as PL
from distcheck.props import properties, run_property


@pytest.mark.parametrize("prop", properties("pp"), ids=lambda p: p.name)
def test_property_holds(prop, distcheck_profile, distcheck_seed):
    result = run_property(prop, distcheck_profile, seed=distcheck_seed)
    assert result.verdict == "pass", result.detail


@pytest.mark.parametrize("m, bubble", [(4, Fraction(3, 7)), (16, Fraction(3, 19)), (32, Fraction(3, 35))])
def test_lesson_gpipe_bubbles(m, bubble):
    assert PL.bubble_fraction_formula("gpipe", 4, m) == bubble
    PL.simulator_matches_closed_forms(ds.PipelineParams("gpipe", 4, m))


def test_ratio_is_not_a_fraction_of_total():
    # p = 4, m = 16: (p-1)/m = 3/16 of useful time, but 3/19 of the total (lesson)
    with pytest.raises(PropertyFailure) as e:
        PL.formula_matches_simulator(ds.PipelineParams("1f1b", 4, 16), impl=bubble_ratio_as_fraction)
    assert e.value.expected == Fraction(3, 19) and e.value.got == Fraction(3, 16)
