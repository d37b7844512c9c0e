"""Parameter-count properties (the params package's, through distcheck.props) and the lesson's 70B-style count."""

import pytest

from distcheck.core.errors import PropertyFailure
from distcheck.mutants import count_params_ignoring_kv_heads
from distcheck.parallel.params import properties as PA
from distcheck.props import properties, run_property


@pytest.mark.parametrize("prop", properties("params"), ids=lambda p: p.name)
def test_property_holds(prop, distcheck_profile, distcheck_seed):
    result = run_property(prop, distcheck_profile, seed=distcheck_seed)
    assert result.verdict == "pass", result.detail


def test_lesson_70b_style_and_kv_mutant():
    from distcheck.parallel.params import PRESETS

    cfg = PRESETS["lesson-70b-style"]
    PA.total_matches_closed_form(cfg)
    PA.additive_over_components(cfg)
    with pytest.raises(PropertyFailure) as e:
        PA.total_matches_closed_form(cfg, impl=count_params_ignoring_kv_heads)
    assert e.value.expected == 68_975_329_280
    # k and v sized 8192 x 8192 instead of 8192 x 1024: 2 * 80 * 8192 * 7168 extra
    assert e.value.got - e.value.expected == 2 * 80 * 8192 * 7168
