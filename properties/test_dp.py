"""Data-parallel properties (the dp package's, through distcheck.props) and pinned cases."""

import numpy as np
import pytest
from hypothesis import given

from distcheck import strategies as ds
from distcheck.core.errors import PropertyFailure
from distcheck.parallel.dp import properties as P
from distcheck.props import properties, run_property


@pytest.mark.parametrize("prop", properties("dp"), ids=lambda p: p.name)
def test_property_holds(prop, distcheck_profile, distcheck_seed):
    result = run_property(prop, distcheck_profile, seed=distcheck_seed)
    assert result.verdict == "pass", result.detail
    assert result.examples > 0


def _case(sizes, X, y, w):
    f = np.asarray
    return ds.DPCase(X=f(X, dtype=float), y=f(y, dtype=float), w=f(w, dtype=float), shard_sizes=tuple(sizes))


def test_plain_mean_off_by_one_third_on_2_1_split():
    # full gradient 2*1*1/3 = 2/3; plain mean of shard means (0 + 2)/2 = 1: error exactly 1/3
    case = _case((2, 1), [[0], [0], [1]], [0, 0, 0], [1])
    with pytest.raises(PropertyFailure) as e:
        P.unequal_shards_weighted(case, impl=P.plain_combine)
    assert e.value.max_error == pytest.approx(1 / 3, rel=0, abs=2**-52)
    P.unequal_shards_weighted(case)  # the weighted mean is exact
    P.plain_mean_bias(case)  # and the bias is exactly the closed-form amount


@given(ds.dp_cases(equal_shards=True, powers_of_two=True, max_shards=4))
def test_equal_shards_user_style(case):
    P.equal_shards_bitwise(case)
