"""Communication-volume properties (the comm package's, through distcheck.props) and a pinned ring."""

import pytest

from distcheck import strategies as ds
from distcheck.parallel.comm import properties as C
from distcheck.props import properties, run_property


@pytest.mark.parametrize("prop", properties("comm"), ids=lambda p: p.name)
def test_property_holds(prop, distcheck_profile, distcheck_seed):
    result = run_property(prop, distcheck_profile, seed=distcheck_seed)
    assert result.verdict == "pass", result.detail


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"])
def test_pinned_eight_ranks(collective):
    C.volume_matches_closed_form(ds.CollectiveCase(collective, 8 * 64, 8))  # 64 int64 elements
    C.volume_matches_closed_form(ds.CollectiveCase(collective, 8 * 61, 8))  # uneven chunks
