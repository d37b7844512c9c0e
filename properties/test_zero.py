"""ZeRO properties (the zero package's, through distcheck.props) and ZeRO Figure 1's worked example."""

import pytest

from distcheck import strategies as ds
from distcheck.core.errors import PropertyFailure
from distcheck.mutants import zero_stage2_unsharded_grads
from distcheck.parallel.zero import properties as Z
from distcheck.props import properties, run_property


@pytest.mark.parametrize("prop", properties("zero"), ids=lambda p: p.name)
def test_property_holds(prop, distcheck_profile, distcheck_seed):
    result = run_property(prop, distcheck_profile, seed=distcheck_seed)
    assert result.verdict == "pass", result.detail


def test_figure1_worked_example_and_stage2_mutant():
    # Psi = 7.5e9, N_d = 64 (divisible after _divisible scales params by dp): exact ints
    case = ds.ZeroCase(params=7_500_000_000 // 64, dp=64)
    Z.bytes_match_figure1(case)
    with pytest.raises(PropertyFailure) as e:
        Z.bytes_match_figure1(case, impl=zero_stage2_unsharded_grads)
    assert "stage 2" in str(e.value)
