"""draw_ints_from_bytes: integer arrays from one byte string, within the bound, every value reachable,
and shrinking to readable counterexamples (zeros and the few small entries a failure needs)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from distcheck.core.errors import ConfigError
from distcheck.engine.strategies import draw_ints_from_bytes


def arrays(shape, bound):
    return st.composite(lambda draw: draw_ints_from_bytes(draw, shape, bound))()


@settings(max_examples=200, database=None, deadline=None)
@given(st.data())
def test_entries_are_integers_within_the_bound(data):
    bound = data.draw(st.integers(0, 127))
    a = data.draw(arrays((3, 4), bound))
    assert a.shape == (3, 4) and a.dtype == np.float64
    assert np.array_equal(a, np.round(a)) and np.abs(a).max() <= bound


def test_every_value_of_the_bound_is_reached_and_zero_is_the_simplest():
    for v in (-2, -1, 1, 2):
        got = find(arrays((1,), 2), lambda a, v=v: a[0] == v, settings=settings(database=None))
        assert got.tolist() == [float(v)]
    assert find(arrays((2, 2), 5), lambda a: True, settings=settings(database=None)).tolist() == [[0.0, 0.0],
                                                                                                  [0.0, 0.0]]


def test_shrinks_to_readable_counterexamples():
    s = settings(database=None, max_examples=2000, derandomize=True)  # the same search every run
    assert find(arrays((2, 3), 64), lambda a: a.min() < 0, settings=s).tolist() == [[0, 0, 0], [0, 0, -1]]
    got = find(arrays((2, 8), 64), lambda a: a.max() > 10 and a.sum() > 50, settings=s)
    # zeros but for a few entries at the end, adding up to little more than the failure needs
    assert not got[0].any() and (got != 0).sum() <= 3 and 51 <= got.sum() <= 60 and got.min() >= 0


def test_bound_outside_a_byte_is_refused():
    with pytest.raises(ConfigError, match="bound=128 must be <= 127"):
        find(arrays((1,), 128), lambda a: True)
