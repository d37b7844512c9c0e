"""3D-layout properties (the layout package's, through distcheck.props) and the lesson's 16,384-GPU layout."""

import pytest

from distcheck.core.errors import PropertyFailure
from distcheck.mutants import groups_tp_outermost
from distcheck.parallel.layout import properties as LA
from distcheck.props import properties, run_property


@pytest.mark.parametrize("prop", properties("layout"), ids=lambda p: p.name)
def test_property_holds(prop, distcheck_profile, distcheck_seed):
    result = run_property(prop, distcheck_profile, seed=distcheck_seed)
    assert result.verdict == "pass", result.detail


def test_tp8_on_8_gpu_nodes():
    from distcheck.parallel.layout import ParallelConfig

    cfg = ParallelConfig(tp=8, pp=2, dp=2)
    LA.tp_node_local(cfg)
    LA.groups_partition(cfg)
    with pytest.raises(PropertyFailure, match="spans nodes"):
        LA.tp_node_local(cfg, impl=groups_tp_outermost)
