"""distcheck.core.exactness: derived magnitude bounds, gamma_k, and the three assertions."""

from fractions import Fraction

import numpy as np
import pytest

from distcheck.core.errors import ConfigError, PropertyFailure
from distcheck.core.exactness import (
    assert_bitwise_equal,
    assert_exact,
    assert_within,
    chain_bound,
    dot_bound,
    gamma,
    is_exactly_integer,
    max_exact_int,
    precision_bits,
    sum_bound,
    to_exact,
    unit_roundoff,
)


def test_precision_and_unit_roundoff():
    assert [precision_bits(d) for d in ("float64", "float32", "float16")] == [53, 24, 11]
    assert unit_roundoff() == Fraction(1, 2**53)
    with pytest.raises(ConfigError):
        precision_bits("int64")


def test_bfloat16_is_named_by_string():
    # 7 stored bits + the implicit one: u = 2**-8; integers up to 2**8 = 256 are exact
    assert precision_bits("bfloat16") == 8
    assert unit_roundoff("bfloat16") == Fraction(1, 256)
    assert max_exact_int(4, factors=2, dtype="bfloat16") == 8  # 4 * 8**2 = 256 <= 2**8
    assert max_exact_int(5, factors=2, dtype="bfloat16") == 7
    with pytest.raises(ConfigError, match="'bfloat16'"):
        precision_bits("bf16")


def test_gamma_is_exact_and_guarded():
    u = Fraction(1, 2**53)
    assert gamma(0) == 0
    assert gamma(3) == 3 * u / (1 - 3 * u)
    assert gamma(2, "float16") == Fraction(2, 2**11) / (1 - Fraction(2, 2**11))
    with pytest.raises(ConfigError):
        gamma(2**11, "float16")  # k u = 1
    with pytest.raises(ConfigError):
        gamma(-1)


@pytest.mark.parametrize(
    "num_terms, factors, dtype, expected",
    [
        (1, 1, "float64", 2**53),
        (2, 1, "float64", 2**52),
        (3, 1, "float64", 2**53 // 3),
        (1, 2, "float64", 94_906_265),  # floor(sqrt(2**53))
        (4, 2, "float64", 47_453_132),  # floor(sqrt(2**51))
        (1, 3, "float64", 208_063),  # floor(2**(53/3))
        (1, 1, "float32", 2**24),
        (8, 2, "float32", 1448),  # floor(sqrt(2**21))
    ],
)
def test_max_exact_int_from_2_pow_p(num_terms, factors, dtype, expected):
    m = max_exact_int(num_terms, factors=factors, dtype=dtype)
    assert m == expected
    p = precision_bits(dtype)
    assert num_terms * m**factors <= 2**p < num_terms * (m + 1) ** factors


def test_bound_is_tight_sums_at_the_bound_are_exact_and_beyond_are_not():
    m = max_exact_int(2)  # 2**52: any sum of two such integers is exact
    a = np.array([float(m), float(m)])
    assert a.sum() == 2**53
    assert float(2**53) + 1.0 == 2.0**53  # 2**53 + 1 is not a float64: past the bound exactness fails


def test_is_exactly_integer():
    assert is_exactly_integer([1.0, -3.0, 2.0**53])
    assert not is_exactly_integer([0.5])
    assert not is_exactly_integer([2.0**54])
    assert not is_exactly_integer([np.nan])


def test_to_exact_converts_floats_exactly():
    assert to_exact(0.1) == Fraction(3602879701896397, 2**55)
    arr = to_exact(np.array([0.5, 2.0]))
    assert arr.dtype == object and list(arr) == [Fraction(1, 2), Fraction(2)]
    with pytest.raises(PropertyFailure):
        to_exact(np.array([np.inf]))


def test_assert_bitwise_equal_reports_max_error_and_zero_bound():
    assert_bitwise_equal(np.array([1.0, -0.0]), np.array([1.0, 0.0]))
    with pytest.raises(PropertyFailure) as e:
        assert_bitwise_equal(np.array([1.0, 2.0]), np.array([1.0, 2.5]), what="demo")
    assert e.value.max_error == 0.5 and e.value.bound == 0.0
    assert "demo" in str(e.value) and "max error 5.000e-01" in str(e.value)
    with pytest.raises(PropertyFailure, match="shape"):
        assert_bitwise_equal(np.zeros(2), np.zeros(3))


def test_assert_exact_against_fractions():
    assert_exact(Fraction(1, 4), 0.25)
    with pytest.raises(PropertyFailure) as e:
        assert_exact(Fraction(1, 3), 1 / 3)  # 1/3 is not a float: the rounding is caught
    assert 0 < e.value.max_error < 2**-53


def test_sum_reordering_stays_within_gamma_bound():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1000)
    exact = sum(to_exact(x), Fraction(0))
    bound = sum_bound(sum(abs(to_exact(x)), Fraction(0)), len(x))
    for order in (x, x[::-1], np.sort(x)):
        s = 0.0
        for v in order:
            s += v
        assert_within(exact, s, bound)
    with pytest.raises(PropertyFailure) as e:
        assert_within(exact, float(exact) + 1e-3, bound)
    assert e.value.bound == float(bound)


def test_dot_and_chain_bounds():
    u = Fraction(1, 2**53)
    assert dot_bound(10, 4) == 10 * 4 * u / (1 - 4 * u)
    assert chain_bound(-3, 1) == 3 * u / (1 - u)
    assert sum_bound(5, 1) == 0  # one term: no addition, no error


def test_assert_within_elementwise_bound():
    got = assert_within([1, 2], np.array([1.0, 2.0 + 2**-51]), [0, Fraction(1, 2**50)])
    assert got == Fraction(1, 2**51)
    with pytest.raises(PropertyFailure):
        assert_within([1, 2], np.array([1.0 + 2**-52, 2.0]), [0, 1])


def test_failure_message_gives_expected_got_max_error_and_bound():
    exact = Fraction(1, 3)
    bound = chain_bound(exact, 1)  # one rounding of 1/3: u/3 (1 + O(u))
    assert_within(exact, 1 / 3, bound)  # the correctly rounded value is inside
    with pytest.raises(PropertyFailure) as e:
        assert_within(exact, 0.3334, bound, what="third")
    msg = str(e.value)
    for part in ("third", "expected", "got", "max error", "bound"):
        assert part in msg, (part, msg)
    assert e.value.got == 0.3334 and e.value.expected == exact
    assert e.value.max_error == pytest.approx(0.3334 - 1 / 3, rel=1e-12)
    assert e.value.bound == float(bound)


def test_bitwise_failure_message_names_the_zero_bound():
    with pytest.raises(PropertyFailure) as e:
        assert_bitwise_equal(np.array([3.0]), np.array([2.0]))
    msg = str(e.value)
    assert "expected" in msg and "got" in msg and "max error 1.000e+00" in msg and "bound 0.000e+00" in msg


# ---- bitwise means the same dtype; junk is a ConfigError, never a RecursionError


def test_bitwise_equal_requires_the_same_dtype():
    ref = np.array([[1.0, 2.0]])
    assert_bitwise_equal(ref, ref.copy())
    with pytest.raises(PropertyFailure, match="dtype float32 differs from expected float64"):
        assert_bitwise_equal(ref, ref.astype(np.float32))  # every value round-trips, the format does not
    with pytest.raises(PropertyFailure, match="dtype int64 differs from expected float64"):
        assert_bitwise_equal(ref, ref.astype(np.int64))


def test_a_float32_layer_fails_a_bitwise_property_against_the_float64_reference():
    from distcheck.parallel.tp import properties as tp_props
    from distcheck.strategies import LinearCase

    def float32_row_parallel(x, W, tp, b=None):
        out = (x.astype(np.float32) @ W.astype(np.float32))
        return out if b is None else out + b.astype(np.float32)

    case = LinearCase(x=np.array([[1.0, 2.0]]), W=np.array([[1.0], [3.0]]), tp=2)
    with pytest.raises(PropertyFailure, match="dtype float32 differs"):
        tp_props.row_exact(case, impl=float32_row_parallel)
    tp_props.row_exact(case)  # the reference itself still passes


def test_to_exact_rejects_what_is_not_a_real_number():
    for junk in (object(), "3", np.array(["a"]), np.array([1 + 1j]), np.array([object()], dtype=object)):
        with pytest.raises(ConfigError, match="must be a real number"):
            to_exact(junk)
    from decimal import Decimal

    assert to_exact(Decimal("0.5")) == Fraction(1, 2)
    assert to_exact(np.array([Decimal("1.25")], dtype=object))[0] == Fraction(5, 4)


def test_bounds_reject_non_integer_lengths_and_huge_factor_counts_finish():
    with pytest.raises(ConfigError, match=r"k=1\.5 must be an integer"):
        sum_bound(1.0, 1.5)
    with pytest.raises(ConfigError, match="j=inf must be an integer"):
        chain_bound(1.0, float("inf"))
    assert max_exact_int(1, factors=2**40) == 1  # 2**53 ** (1/2**40) is in [1, 2): no huge power is formed
    assert max_exact_int(1, factors=53) == 2 and max_exact_int(1, factors=54) == 1
