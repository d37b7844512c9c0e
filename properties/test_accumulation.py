"""Gradient-accumulation properties (through distcheck.props) and a pinned case."""

import numpy as np
import pytest

from distcheck import strategies as ds
from distcheck.core.errors import PropertyFailure
from distcheck.mutants import mean_of_means
from distcheck.parallel.dp import properties as A
from distcheck.props import properties, run_property


@pytest.mark.parametrize("prop", properties("accumulation"), ids=lambda p: p.name)
def test_property_holds(prop, distcheck_profile, distcheck_seed):
    result = run_property(prop, distcheck_profile, seed=distcheck_seed)
    assert result.verdict == "pass", result.detail


def test_mean_of_means_depends_on_the_split():
    # 3 sequences of 2 tokens; the first has 1 valid token (residual 1, gradient 2), the
    # others 2 tokens with residual 0. Token mean: 2/5. Split (1, 2) with per-micro-batch
    # means: (2/1 + 0/4) / 2 = 1.
    X = np.ones((3, 2, 1))
    y = np.array([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    mask = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    case = ds.AccumulationCase(X=X, y=y, w=np.array([1.0]), mask=mask, split_a=(1, 2), split_b=(3,))
    A.tokens_split_invariant(case)
    with pytest.raises(PropertyFailure) as e:
        A.tokens_split_invariant(case, impl=mean_of_means)
    assert e.value.max_error == pytest.approx(1 - 2 / 5, rel=0, abs=2**-52)
