"""Tensor-parallel properties (the tp package's, through distcheck.props) and the lesson's worked example."""

import numpy as np
import pytest

from distcheck import strategies as ds
from distcheck.core.errors import PropertyFailure
from distcheck.mutants import row_parallel_bias_every_rank
from distcheck.parallel.tp import properties as T
from distcheck.props import properties, run_property


@pytest.mark.parametrize("prop", properties("tp"), ids=lambda p: p.name)
def test_property_holds(prop, distcheck_profile, distcheck_seed):
    result = run_property(prop, distcheck_profile, seed=distcheck_seed)
    assert result.verdict == "pass", result.detail


def test_lesson_worked_example_column_and_row():
    # lesson: X = [1, 2], W = [[1, 0, 2, 1], [0, 1, 1, 3]] -> XW = [1, 2, 4, 7]
    case = ds.LinearCase(x=np.array([[1.0, 2.0]]), W=np.array([[1.0, 0, 2, 1], [0, 1, 1, 3]]), tp=2)
    T.column_exact(case)
    T.row_exact(case)


def test_bias_on_every_rank_is_added_tp_times():
    case = ds.LinearCase(x=np.array([[1.0, 2.0]]), W=np.array([[1.0], [1.0]]), tp=2, b=np.array([5.0]))
    with pytest.raises(PropertyFailure) as e:
        T.row_exact(case, impl=row_parallel_bias_every_rank)
    assert e.value.max_error == 5.0  # one extra copy of b


def test_sharded_layer_norm_uses_global_statistics():
    case = ds.NormCase(x=np.array([[0.0, 1.0, 2.0, 5.0]]), tp=2)
    T.layer_norm_sharded_hidden(case)
